"""SGLang's KV event schema (router/cache/kv_index.py lists how it differs from vLLM's): the
decoder reads both, and equal content gives an equal index.

SGLang batches are built here by hand, as ``msgspec`` encodes SGLang's ``array_like`` tagged
structs (``python/sglang/srt/disaggregation/kv_events.py``): events are arrays led by their
type, block hashes signed 64-bit ints, one ``BlockStored`` per page; vLLM's as vLLM 0.32
sends them (tagged maps, unsigned hashes, one event per run of blocks).
"""

from __future__ import annotations

import msgspec

from router.cache.block_hash import token_bytes
from router.cache.kv_index import KVEventFeed, KVIndex, decode_batch, normalize_event

BS = 4
PROMPT = list(range(100, 100 + 5 * BS + 2))  # five full pages and a partial one
SGLANG_HASHES = [-(2**63) + 7, -12345, 0, 2**63 - 1, 42]  # signed int64, as SGLang's
VLLM_HASHES = [2**64 - 1, 3, 2**63, 5, 6]  # unsigned 64-bit


def sglang_batch(*events: list) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])  # [ts, events, attn_dp_rank]


def sglang_pages(n: int, medium: str | None = "GPU", extra: list | None = None) -> list[list]:
    """One BlockStored per page, each page's parent the page before (SGLang's radix cache)."""
    out, parent = [], None
    for i in range(n):
        event = ["BlockStored", [SGLANG_HASHES[i]], parent, PROMPT[i * BS : (i + 1) * BS], BS]
        event.append(None)  # lora_id
        if medium is not None:
            event.append(medium)
        out.append(event + (extra or []))
        parent = SGLANG_HASHES[i]
    return out


def vllm_batch(*events: dict) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


def vllm_stored(n: int) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": VLLM_HASHES[:n],
        "parent_block_hash": None,
        "token_ids": PROMPT[: n * BS],
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * n,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def index_of(*payloads: bytes) -> KVIndex:
    feed = KVEventFeed(KVIndex())
    assert feed.live(0, 0.5, [{"type": "AllBlocksCleared"}]) is None  # a synced history
    for seq, payload in enumerate(payloads, 1):
        ts, events = decode_batch(payload)
        assert feed.live(seq, ts + seq, events) is None
    return feed.index


def estimate(index: KVIndex, n: int = len(PROMPT)) -> int | None:
    return index.estimate(token_bytes(PROMPT[:n]), n)


def test_array_events_decode_with_and_without_medium() -> None:
    stored = normalize_event(["BlockStored", [-5], None, [1, 2, 3, 4], 4, None])
    assert stored == {"type": "BlockStored", "block_hashes": [-5], "parent_block_hash": None,
                      "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None}  # fmt: skip
    newer = normalize_event(["BlockStored", [-5], None, [1, 2, 3, 4], 4, None, "GPU"])
    assert newer is not None and newer["medium"] == "GPU" and "trailing" not in newer
    assert normalize_event(["BlockRemoved", [-5]]) == {"type": "BlockRemoved", "block_hashes": [-5]}
    assert normalize_event(["AllBlocksCleared"]) == {"type": "AllBlocksCleared"}
    assert normalize_event(["Unknown", 1]) is None


def test_sglang_and_vllm_encodings_of_the_same_cache_give_the_same_index() -> None:
    sglang = index_of(sglang_batch(*sglang_pages(3)), sglang_batch(*sglang_pages(5)[3:]))
    older = index_of(sglang_batch(*sglang_pages(5, medium=None)))
    vllm = index_of(vllm_batch(vllm_stored(5)))
    for index in (sglang, older, vllm):
        assert index.synced and index.block_size == BS and len(index) == 5
        assert estimate(index) == 5 * BS
        assert estimate(index, 3 * BS + 1) == 3 * BS  # the last prompt token is never cached
    # removals by the engines' own hashes, with or without medium
    sglang = index_of(
        sglang_batch(*sglang_pages(5)), sglang_batch(["BlockRemoved", SGLANG_HASHES[3:]])
    )
    vllm = index_of(
        vllm_batch(vllm_stored(5)),
        vllm_batch({"type": "BlockRemoved", "block_hashes": VLLM_HASHES[3:], "medium": "GPU"}),
    )
    assert estimate(sglang) == estimate(vllm) == 3 * BS
    cleared = index_of(sglang_batch(*sglang_pages(5)), sglang_batch(["AllBlocksCleared"]))
    assert cleared.synced and estimate(cleared) == 0 and cleared.stats.cleared == 2


def test_sglang_host_tiers_and_salted_blocks_never_match_a_plain_request() -> None:
    host_pages = sglang_pages(5, medium="CPU_PINNED")[1:]  # HiCache's host tier
    host = index_of(sglang_batch(*sglang_pages(1)), sglang_batch(*host_pages))
    # the host tier is the CPU tier's index, never a GPU hit; pages whose GPU copy the index
    # never saw have no key there either
    assert estimate(host) == BS and host.stats.cpu_unknown == 4 and host.cpu_blocks == 0
    both = index_of(sglang_batch(*sglang_pages(5)), sglang_batch(*host_pages))
    assert both.stats.cpu_stored == 4 and both.cpu_blocks == 4
    gone = index_of(
        sglang_batch(*sglang_pages(5)), sglang_batch(["BlockRemoved", SGLANG_HASHES, "DISK"])
    )
    assert estimate(gone) == 5 * BS  # a lower tier's removal leaves the GPU copy
    salted = index_of(sglang_batch(*sglang_pages(5, extra=[{"cache_salt": "tenant-a"}])))
    assert len(salted) == 5 and estimate(salted) == 0

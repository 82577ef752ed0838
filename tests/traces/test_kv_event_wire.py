"""The worker model's events in vLLM's and SGLang's encodings: the router's decoder rebuilds
the same index from either, and each has its engine's shape."""

from __future__ import annotations

import msgspec

from router.cache.block_hash import hash_blocks, token_bytes
from router.cache.kv_index import KVEventFeed, KVIndex, decode_batch
from traces.sim.worker_model import SimRequest, WorkerModel, WorkerModelConfig
from traces.sim_worker.kv_event_wire import encode_batch, sglang_hash, vllm_hash

IDS = list(range(7, 7 + 3 * 512 + 100))


def model_events() -> list[list[dict]]:
    """Batches of a real worker model: two requests (the second extends the first), a reset."""
    buf = token_bytes(IDS)
    model = WorkerModel(WorkerModelConfig(kv_capacity_tokens=64 * 512), events=True)
    batches = []
    for n in (2 * 512 + 10, len(IDS)):
        part = buf[: n * 4]
        model.submit(SimRequest(tuple(hash_blocks(part)), n, 1, tokens=part), 0.0)
        while model.next_event is not None:
            model.advance(model.next_event)
            if events := model.take_events():
                batches.append(events)
    model.reset_cache()
    batches.append(model.take_events())
    return batches


def test_both_encodings_rebuild_the_same_index() -> None:
    batches = model_events()
    for flavor in ("vllm", "sglang"):
        feed = KVEventFeed(KVIndex())
        for seq, events in enumerate(batches[:-1]):
            assert feed.live(seq, 1.0 + seq, decode_batch(encode_batch(flavor, events))[1]) is None
        index = feed.index
        assert index.synced and index.block_size == 512 and len(index) == 3, flavor
        assert index.estimate(token_bytes(IDS), len(IDS)) == 3 * 512
        cleared = decode_batch(encode_batch(flavor, batches[-1]))[1]
        assert feed.live(len(batches) - 1, 9.0, cleared) is None
        assert index.estimate(token_bytes(IDS), len(IDS)) == 0


def test_each_flavor_has_its_engines_shape() -> None:
    first = model_events()[0]
    vllm = msgspec.msgpack.decode(encode_batch("vllm", first, ts=1.5))
    assert vllm[0] == 1.5 and vllm[2] == 0
    (stored,) = vllm[1]
    assert stored["type"] == "BlockStored" and stored["group_idx"] == 0
    assert all(0 <= h < 2**64 for h in stored["block_hashes"])
    sglang = msgspec.msgpack.decode(encode_batch("sglang", first, ts=1.5))
    pages = sglang[1]
    assert [p[0] for p in pages] == ["BlockStored", "BlockStored"]  # one event per page
    assert pages[1][2] == pages[0][1][0]  # each page's parent is the page before
    assert all(len(p) == 7 and p[4] == 512 and p[6] == "GPU" for p in pages)
    key = 0
    assert vllm_hash(key) != key and sglang_hash(key) < 0 <= vllm_hash(key)

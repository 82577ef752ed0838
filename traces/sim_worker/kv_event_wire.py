"""KV event batches encoded as vLLM or SGLang put them on the wire (the sim worker's events).

The worker model records engine-neutral events (:mod:`traces.sim.worker_model`: dicts with
``type``, its own 64-bit block keys as ``block_hashes``); a flavor turns one step's events into
the msgpack payload that engine publishes, so the router's decoder
(:func:`router.cache.kv_index.decode_batch`) is tested against both shapes. The differences
between the two schemas are listed in :mod:`router.cache.kv_index`.

- ``vllm``: the batch ``[ts, events, data_parallel_rank]``; events are maps tagged by
  ``type`` carrying every field of vLLM 0.32 (as recorded in ``tests/data/vllm_kv_events.json``):
  ``BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind}``, ``BlockRemoved {block_hashes,
  medium}``, ``AllBlocksCleared {}``; block hashes unsigned 64-bit ints.
- ``sglang``: the batch ``[ts, events, attn_dp_rank]``; events are tagged arrays
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``,
  ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``; one ``BlockStored``
  per page, each naming the previous page as its parent; block hashes *signed* 64-bit ints.

Block hashes are the model's keys through a per-flavor bijection, so they never equal the
router's own keys: the router must map them through the events' token ids, as with a real
engine, whose hashes it cannot reproduce.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec

Flavor = Literal["vllm", "sglang"]
FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang")

_MASK = (1 << 64) - 1
_VLLM_SALT = 0x5BD1E9955BD1E995
_SGLANG_SALT = 0x9E3779B97F4A7C15
_encoder = msgspec.msgpack.Encoder()


def vllm_hash(key: int) -> int:
    """The model's block key as a vLLM-style unsigned 64-bit block hash."""
    return (key ^ _VLLM_SALT) & _MASK


def sglang_hash(key: int) -> int:
    """The model's block key as an SGLang-style signed 64-bit block hash (SGLang takes the
    first 8 bytes of a SHA-256 as a two's-complement int64)."""
    value = (key ^ _SGLANG_SALT) & _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_batch(flavor: Flavor, events: list[dict[str, Any]], ts: float | None = None) -> bytes:
    """One engine step's events as ``flavor``'s msgpack batch payload."""
    ts = time.time() if ts is None else ts
    if flavor == "vllm":
        return _encoder.encode([ts, [_vllm_event(e) for e in events], 0])
    if flavor == "sglang":
        out: list[list[Any]] = []
        for event in events:
            out.extend(_sglang_events(event))
        return _encoder.encode([ts, out, 0])
    raise ValueError(f"flavor must be one of {FLAVORS}, not {flavor!r}")


def _parent(key: int | None, hash_fn) -> int | None:
    return None if key is None else hash_fn(key)


def _vllm_event(event: dict[str, Any]) -> dict[str, Any]:
    kind = event["type"]
    if kind == "BlockStored":
        n = len(event["block_hashes"])
        return {
            "type": kind,
            "block_hashes": [vllm_hash(k) for k in event["block_hashes"]],
            "parent_block_hash": _parent(event["parent_block_hash"], vllm_hash),
            "token_ids": event["token_ids"],
            "block_size": event["block_size"],
            "lora_id": None,
            "medium": event.get("medium", "GPU"),
            "lora_name": None,
            "extra_keys": [None] * n,
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    if kind == "BlockRemoved":
        hashes = [vllm_hash(k) for k in event["block_hashes"]]
        return {"type": kind, "block_hashes": hashes, "medium": event.get("medium", "GPU")}
    return {"type": kind}


def _sglang_medium(event: dict[str, Any]) -> str:
    """SGLang's HiCache names its host tier ``CPU_PINNED``."""
    medium = event.get("medium", "GPU")
    return "CPU_PINNED" if medium == "CPU" else medium


def _sglang_events(event: dict[str, Any]) -> list[list[Any]]:
    kind = event["type"]
    if kind == "BlockStored":
        size = event["block_size"]
        tokens = event["token_ids"]
        parent = _parent(event["parent_block_hash"], sglang_hash)
        out = []
        for i, key in enumerate(event["block_hashes"]):  # one event per page
            block = sglang_hash(key)
            page = tokens[i * size : (i + 1) * size]
            out.append([kind, [block], parent, page, size, None, _sglang_medium(event)])
            parent = block
        return out
    if kind == "BlockRemoved":
        return [[kind, [sglang_hash(k) for k in event["block_hashes"]], _sglang_medium(event)]]
    return [[kind]]

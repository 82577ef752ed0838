"""router/cache/lora.py: adapters' own block chains, and a worker's adapter slots."""

from __future__ import annotations

from router.cache.block_hash import TextBytes, hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.features import RequestFeatures
from router.cache.lora import AdapterSlots, adapter_root, under_adapter
from router.cache.worker_state import WorkerState


def _features(ids: list[int]) -> RequestFeatures:
    tokens = token_bytes(ids)
    return RequestFeatures(
        blocks=hash_blocks(tokens, 4), input_length=len(ids), tokens=tokens, block_size=4
    )


def test_adapter_keys_are_prefix_chained_and_apart_from_base_and_other_adapters() -> None:
    base = _features(list(range(16)))
    longer = _features(list(range(16)) + [99] * 4)
    a, a_longer = under_adapter(base, "a"), under_adapter(longer, "a")
    b = under_adapter(base, "b")
    assert a.adapter == "a" and len(a.blocks) == len(base.blocks) == 4
    assert not set(a.blocks) & set(base.blocks) and not set(a.blocks) & set(b.blocks)
    assert list(a_longer.blocks[:4]) == list(a.blocks)  # same prefix, same adapter: equal keys
    assert isinstance(a.tokens, TextBytes) and a.tokens.endswith(base.tokens)
    assert adapter_root("a") != 0 and adapter_root("a") != adapter_root("b")


def test_the_block_shadow_gives_an_adapter_no_hit_from_the_base_model() -> None:
    state = WorkerState(name="w", blocks=BlockLRU(100, block_size=4))
    base = _features(list(range(16)))
    state.book(base).finish()
    assert state.estimate_cache_hit(base.blocks) == 16
    adapted = under_adapter(base, "a")
    assert state.estimate_cache_hit(adapted.blocks) == 0
    booking = state.book(adapted)
    assert state.adapters.running == {"a": 1} and state.adapters.swaps == 1
    booking.finish()
    booking.finish()  # released once
    assert state.adapters.running == {} and state.adapters.resident("a")
    assert state.estimate_cache_hit(adapted.blocks) == 16


def test_slots_keep_the_running_and_most_recent_adapters() -> None:
    slots = AdapterSlots(max_loras=2)
    assert slots.acquire("a") and slots.acquire("b")
    assert not slots.acquire("a")  # resident: no load
    assert slots.blocked("c")  # both slots run an adapter
    slots.release("b")
    assert not slots.blocked("c")
    assert slots.acquire("c")  # evicts b, the least recent not running
    assert slots.resident("a") and slots.resident("c") and not slots.resident("b")
    assert slots.swaps == 3
    slots.release("a")
    slots.release("a")
    slots.report(1, frozenset({"d"}))  # the worker's own view: one slot, d runs
    assert slots.max_loras == 1 and slots.resident("d") and slots.resident("c")  # c still runs
    slots.release("c")
    slots.report(1, frozenset({"d"}))
    assert list(slots.recent) == ["d"]

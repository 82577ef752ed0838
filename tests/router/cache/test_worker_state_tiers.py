"""The router's CPU-tier shadow of a worker (issue 43): estimates, bookings, reports, the
truth feedback's share of it, and BlockLRU's eviction callback."""

from __future__ import annotations

import pytest

from policies.base import RequestFeatures
from router.cache.block_hash import hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.feedback import correct_shadow
from router.cache.worker_state import WorkerState

B = 4  # tokens per block


def tiered(capacity_blocks: int = 64, load_s: float = 0.001, **kw) -> WorkerState:
    return WorkerState(
        "w",
        BlockLRU(capacity_blocks, B),
        cpu=BlockLRU(capacity_blocks, B),
        kv_load_s_per_token=load_s,
        **kw,
    )


def req(blocks, input_length=None, session=None) -> RequestFeatures:
    length = len(blocks) * B if input_length is None else input_length
    return RequestFeatures(list(blocks), length, session, None, block_size=B)


# ---- BlockLRU.on_evict ---------------------------------------------------------------


def test_on_evict_is_told_each_capacity_eviction_in_lru_order():
    gone: list[int] = []
    lru = BlockLRU(3, B, on_evict=gone.append)
    lru.insert([1, 2, 3])  # LRU order 3, 2, 1 (the head most recent)
    assert gone == []
    lru.insert([4, 5])
    assert gone == [3, 2] and lru.evictions == 2
    lru.acquire([1])  # pinned: never evicted
    lru.resize(1)
    assert gone == [3, 2, 5, 4] and 1 in lru
    lru.release([1])
    assert gone == [3, 2, 5, 4]  # back within capacity
    lru.resize(0)
    assert gone == [3, 2, 5, 4, 1]


def test_on_evict_not_told_of_discard_or_clear():
    gone: list[int] = []
    lru = BlockLRU(8, B, on_evict=gone.append)
    lru.insert([1, 2, 3])
    assert lru.discard([2]) == 1
    lru.clear()
    assert gone == [] and len(lru) == 0
    assert BlockLRU(2, B).on_evict is None  # the default: nobody to tell


# ---- estimates -----------------------------------------------------------------------


def test_tiered_needs_a_load_rate_and_a_tier_reading():
    assert tiered().tiered
    assert not tiered(load_s=0.0).tiered
    assert not WorkerState("w", BlockLRU(8, B), kv_load_s_per_token=0.001).tiered
    exact = WorkerState("w", BlockLRU(8, B), kv_load_s_per_token=0.001)
    exact.exact = lambda blocks: (0, 0)
    assert exact.tiered


def test_estimate_tiers_whole_blocks_after_the_gpu_prefix():
    w = tiered()
    w.blocks.insert([1, 2])
    w.cpu.insert([1, 2, 3, 4])
    assert w.estimate_tiers([1, 2, 3, 4, 5]) == (8, 8)  # blocks 3, 4 from the CPU tier
    assert w.estimate_tiers([9, 1, 2]) == (0, 0)  # the CPU tier's part must start the prompt
    w.cpu.discard([3])
    assert w.estimate_tiers([1, 2, 3, 4]) == (8, 0)  # consecutive: 4 alone does not count
    w.cpu.insert([3])
    w.cpu.discard([1, 2])  # the GPU's blocks need not be in the CPU tier
    assert w.estimate_tiers([1, 2, 3, 4]) == (8, 8)
    assert WorkerState("w", BlockLRU(8, B)).estimate_tiers([1, 2]) == (0, 0)  # no shadow


def test_cpu_after_a_gpu_hit_mid_block():
    w = tiered()
    w.cpu.insert([2, 3])
    blocks = [1, 2, 3, 4]
    # a GPU hit of 6 tokens ends inside block 2: the CPU tier holds blocks 2 and 3, so the
    # worker loads up to token 12
    assert w.cpu_after(blocks, 6) == 12 - 6
    assert w.cpu_after(blocks, 4) == 8
    assert w.cpu_after(blocks, 2) == 0  # block 1 (holding token 2) is not in the tier
    assert w.cpu_after(blocks, 16) == 0  # nothing after the whole prompt
    w.cpu = None
    assert w.cpu_after(blocks, 4) == 0


def test_exact_hook_answers_both_tiers():
    w = WorkerState("w", BlockLRU(8, B), kv_load_s_per_token=0.001)
    w.blocks.insert([1])  # the shadow would say 4; the hook says otherwise
    w.exact = lambda blocks: (8, 12)
    assert w.estimate_tiers([1, 2, 3, 4, 5]) == (8, 12)
    assert w.estimate_cache_hit([1, 2, 3, 4, 5]) == 8
    booking = w.book(req([1, 2, 3, 4, 5], input_length=18))
    assert (booking.cpu_estimate, booking.new_prefill) == (10, 0)  # capped at the prompt


# ---- book ------------------------------------------------------------------------------


def test_book_with_a_cpu_hit_prices_only_the_rest_and_writes_through():
    w = tiered()
    w.blocks.insert([1, 2])
    w.cpu.insert([3, 4])
    booking = w.book(req([1, 2, 3, 4, 5], input_length=18), expected_output_tokens=5)
    assert (booking.blocks_estimate, booking.cpu_estimate) == (8, 8)
    assert booking.new_prefill == 18 - 8 - 8 == w.pending_prefill_tokens
    # write-through: every block of the request in the CPU shadow, its head most recent
    assert w.cpu.lru_order() == [5, 4, 3, 2, 1]
    assert w.cpu.pinned_blocks == 0  # the CPU shadow pins nothing
    assert w.blocks.pinned_blocks == 5


def test_book_cpu_hit_covering_the_partial_last_block():
    w = tiered()
    w.blocks.insert([1, 2])
    w.cpu.insert([3, 4, 5])
    booking = w.book(req([1, 2, 3, 4, 5], input_length=18))
    assert booking.cpu_estimate == 10 and booking.new_prefill == 0


def test_book_cpu_hit_as_a_block_hashing_worker_counts_it():
    tokens = list(range(20))
    buf = token_bytes(tokens)
    r = RequestFeatures(hash_blocks(buf, B), 20, None, buf, block_size=B)
    w = tiered(worker_block_size=B)
    w.blocks.insert(r.blocks[:2])
    w.cpu.insert(r.blocks)
    booking = w.book(r)
    # whole blocks, never the last prompt token: 16 of 20 cached, 8 of them from the CPU tier
    assert (booking.blocks_estimate, booking.cpu_estimate, booking.new_prefill) == (8, 8, 4)


def test_book_without_a_tier_shadow_is_tier_blind():
    w = WorkerState("w", BlockLRU(64, B), kv_load_s_per_token=0.001)
    w.blocks.insert([1, 2])
    booking = w.book(req([1, 2, 3, 4, 5], input_length=18))
    assert booking.cpu_estimate == 0 and booking.new_prefill == 10


def test_write_through_shadow_evicts_least_recent_blocks():
    w = tiered()
    w.cpu.resize(4)
    w.book(req([1, 2, 3])).finish()
    w.book(req([10, 11, 12])).finish()
    assert w.cpu.lru_order() == [1, 12, 11, 10]  # a's tail went first
    assert w.estimate_tiers([1, 2, 3]) == (12, 0)  # the GPU shadow (64 blocks) still has it
    w.blocks.discard([1, 2, 3])
    assert w.estimate_tiers([1, 2, 3]) == (0, 4)


# ---- report_cached ---------------------------------------------------------------------


def _cpu_booking() -> tuple[WorkerState, object]:
    w = tiered()
    w.blocks.insert([1, 2])
    w.cpu.insert([3, 4])
    return w, w.book(req([1, 2, 3, 4, 5], input_length=18))  # 8 GPU + 8 CPU estimated


def test_report_without_split_scores_the_sum():
    w, booking = _cpu_booking()
    booking.report_cached(14)
    acc = w.accuracy
    assert (acc.requests, acc.reported_tokens, acc.prompt_tokens) == (1, 14, 18)
    assert acc.blocks_estimate_tokens == 16 and acc.blocks_abs_error_tokens == 2
    assert acc.tier_requests == 0 and acc.cpu_reported_tokens == 0
    assert acc.cpu_abs_error_tokens == acc.gpu_abs_error_tokens == 0


def test_report_with_split_scores_each_tier():
    w, booking = _cpu_booking()
    booking.report_cached(14, 4)  # 10 on the GPU, 4 loaded
    acc = w.accuracy
    assert acc.blocks_abs_error_tokens == 2
    assert (acc.tier_requests, acc.tier_prompt_tokens) == (1, 18)
    assert (acc.cpu_reported_tokens, acc.cpu_estimate_tokens) == (4, 8)
    assert acc.cpu_abs_error_tokens == 4 and acc.gpu_abs_error_tokens == 2
    booking.report_cached(16, 8)  # once only
    assert acc.requests == 1 and acc.tier_requests == 1


def test_report_with_an_impossible_split_scores_the_sum_only():
    w, booking = _cpu_booking()
    booking.report_cached(4, 8)  # more loaded than cached
    assert w.accuracy.requests == 1 and w.accuracy.tier_requests == 0


def test_no_rate_sample_from_a_booking_with_a_cpu_hit():
    w = tiered()
    w.cpu.insert([1])
    booking = w.book(req([1, 2], input_length=2000), now=0.0)
    assert booking.cpu_estimate == 4
    booking.first_token(now=1.0)
    booking.report_cached(4, 4)
    assert w.rate.samples == 0
    # the worker says it loaded, though the shadow did not expect it: no sample either
    w.cpu.clear()
    booking = w.book(req([7, 8], input_length=2000), now=2.0)
    assert booking.cpu_estimate == 0
    booking.first_token(now=3.0)
    booking.report_cached(4, 4)
    assert w.rate.samples == 0
    # a plain booking still teaches the rate
    booking = w.book(req([20, 21], input_length=2000), now=4.0)
    booking.first_token(now=4.5)
    booking.report_cached(0, 0)
    assert w.rate.samples == 1


# ---- feedback --------------------------------------------------------------------------


def test_feedback_subtracts_the_cpu_estimate_from_the_report():
    w, booking = _cpu_booking()
    w.blocks.resize(10)  # below the configured 64: a false miss could grow it
    # 16 reported = the 8 the GPU shadow expected + the 8 the CPU tier's: nothing to fix
    change = correct_shadow(booking, 16, configured_blocks=64, configured_tokens=None)
    assert change.blocks_delta == 0 and w.blocks.capacity_blocks == 10
    # 4 more than both: the GPU held one more block than its shadow thought
    change = correct_shadow(booking, 20, configured_blocks=64, configured_tokens=None)
    assert change.blocks_delta == 1 and w.blocks.capacity_blocks == 11


def test_feedback_false_hit_on_the_gpu_part():
    w, booking = _cpu_booking()
    assert len(w.blocks) == 5
    # the worker found only what the CPU tier holds: the GPU's 2 blocks were gone
    change = correct_shadow(booking, 8, configured_blocks=64, configured_tokens=None)
    assert change.blocks_delta == (5 - 2) - 64 and w.blocks.capacity_blocks == 3
    # reports below the CPU estimate count as a GPU part of 0, never negative
    w2, booking2 = _cpu_booking()
    change = correct_shadow(booking2, 2, configured_blocks=64, configured_tokens=None)
    assert w2.blocks.capacity_blocks == 3 and change.blocks_delta == 3 - 64


@pytest.mark.parametrize("reported", [0, 8, 16])
def test_feedback_without_cpu_estimate_is_unchanged(reported):
    w = WorkerState("w", BlockLRU(64, B))
    w.blocks.insert([1, 2])
    booking = w.book(req([1, 2, 3, 4, 5], input_length=18))
    assert booking.cpu_estimate == 0
    w.blocks.resize(10)
    change = correct_shadow(booking, reported, configured_blocks=64, configured_tokens=None)
    expected = {0: 5 - 2 - 10, 8: 0, 16: 2}[reported]
    assert change.blocks_delta == expected


def test_split_by_shadow_moves_what_the_gpu_shadow_lost_to_the_cpu_tier() -> None:
    """The KV-event index's GPU hit can be stale (an eviction whose event has not arrived);
    the shadow's lower GPU hit wins the split, the total stays the index's."""
    from router.cache.worker_state import split_by_shadow

    assert split_by_shadow(10 * 512, 2 * 512, 4 * 512) == (4 * 512, 8 * 512)
    assert split_by_shadow(4 * 512, 2 * 512, 10 * 512) == (4 * 512, 2 * 512)  # never more GPU
    assert split_by_shadow(0, 0, 0) == (0, 0)

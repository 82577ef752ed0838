"""The router's TTFT cost model: the profile's shape, the queue and batch as booked, the
correction learned from reports (a running median, bounded), and its error."""

from __future__ import annotations

import pytest

from router.cache.block_lru import BlockLRU
from router.cache.cost_model import (
    BOUND,
    ERROR_BOUNDS,
    MIN_TOKENS,
    CostTerms,
    WorkerCost,
    pairs_of,
)
from router.cache.cost_profile import resolve
from router.cache.features import RequestFeatures
from router.cache.worker_state import WorkerState

H100 = resolve("h100-llama8b")
TERMS = CostTerms.of_profile(H100)


def test_the_flat_prior_is_the_ttft_pickers_flat_formula():
    flat = CostTerms.flat(15_000.0, 0.012, 0.00015)
    for work, n in ((2560, 0), (40_000, 3), (512, 1)):
        expected = work / 15_000 + (work / 8192 + 1) * (0.012 + 0.00015 * n)
        assert flat.ttft_s(work, 0.0, n, 10_000) == pytest.approx(expected)
    assert not flat.profiled and TERMS.profiled and TERMS.name == "h100-llama8b"


def test_a_profile_prices_new_tokens_by_the_attention_over_their_cached_prefix():
    # 2k new tokens after 128k cached, alone on an idle worker: the profile's terms
    s, p = 2048, 131_072
    steps = s / 8192 + 1
    expected = H100.d * steps + H100.a * s + H100.c * (s * p + s * s / 2)
    cost = WorkerCost(TERMS)
    assert cost.ttft_s(s, p) == pytest.approx(expected)
    assert cost.ttft_s(s, p) > 3 * cost.ttft_s(s, 0)  # the flat shape misses this
    # at 20x real time every second is a twentieth
    fast = WorkerCost(CostTerms.of_profile(H100, time_scale=20.0))
    assert fast.ttft_s(s, p) == pytest.approx(expected / 20)


def test_a_requests_own_prefill_is_its_engine_seconds_whatever_is_queued_or_running():
    # what a request adds to the prefill of anyone queued behind it: its tokens, the
    # attention over its cached prefix and its share of the steps, nothing of the queue's
    s, p = 40_000, 0
    expected = H100.a * s + H100.c * pairs_of(s, p) + H100.d * s / 8192
    cost = WorkerCost(TERMS)
    assert cost.prefill_s(s, p) == pytest.approx(expected)
    cost.book(100_000, 0, 100_000, 50, now=0.0)  # a queue ahead and a decode batch
    cost.first_token(cost.book(1000, 0, 1000, 500, now=0.0), now=0.0)
    assert cost.prefill_s(s, p) == pytest.approx(expected)
    # a cold 191k prompt: its attention alone is most of it (the flat rate misses it)
    assert cost.prefill_s(191_000, 0) > 6 * 191_000 * H100.a
    cost.factor = 2.0
    assert cost.prefill_s(s, p) == pytest.approx(2 * expected)
    assert cost.prefill_s(s, p, corrected=False) == pytest.approx(expected)


def test_queued_prefill_and_running_decode_count_until_released_once_each():
    cost = WorkerCost(TERMS)
    idle = cost.ttft_s(1000, 0)
    a = cost.book(8192, 120_000, 128_192, 256, now=0.0)  # attention-heavy, queued
    b = cost.book(0, 4096, 4096, 100, now=0.0)  # fully cached: no prefill queued
    assert cost.queued_tokens == 8192 and cost.queued_pairs == pairs_of(8192, 120_000)
    # a request behind it waits for its prefill too
    assert cost.ttft_s(1000, 0) == pytest.approx(
        TERMS.ttft_s(9192, pairs_of(8192, 120_000) + pairs_of(1000, 0), 0, 0)
    )
    cost.first_token(a, now=1.0)
    cost.first_token(a, now=1.5)  # twice: counted once
    assert (cost.queued_tokens, cost.queued_pairs) == (0, 0.0)
    assert (cost.running, cost.context) == (1, 128_192 + 128)
    busy = cost.ttft_s(1000, 0)  # every step now also carries a's decode
    assert busy > idle
    cost.finish(a)
    cost.finish(a)
    cost.finish(b)  # never had a first token: nothing left either way
    assert (cost.queued_tokens, cost.running, cost.context) == (0, 0, 0)
    assert cost.ttft_s(1000, 0) == pytest.approx(idle)


def test_finish_without_a_first_token_leaves_the_queue():
    cost = WorkerCost(TERMS)
    entry = cost.book(5000, 0, 5000, 10, now=0.0)
    cost.finish(entry)  # an error, a client gone
    cost.first_token(entry, now=1.0)  # late: nothing to release
    assert (cost.queued_tokens, cost.queued_pairs, cost.running) == (0, 0.0, 0)


def test_the_head_of_the_queue_progresses_with_time():
    cost = WorkerCost(TERMS)
    cost.book(16_384, 0, 16_384, 1, now=0.0)
    whole = cost.ttft_s(1000, 0, now=0.0)
    later = cost.ttft_s(1000, 0, now=0.2)
    assert later == pytest.approx(whole - 0.2)
    behind = TERMS.ttft_s(1000, pairs_of(1000, 0), 0, 0)
    assert cost.ttft_s(1000, 0, now=100.0) == pytest.approx(behind)  # never below its own


def test_the_correction_follows_a_slower_worker_and_stays_bounded():
    cost = WorkerCost(TERMS)
    for i in range(200):  # the worker takes twice the prediction
        entry = cost.book(4096, 0, 4096, 1, now=float(i))
        cost.first_token(entry, now=float(i) + 2 * entry.base_s)
        cost.observe(entry, 2 * entry.base_s)
        cost.finish(entry)
    assert cost.factor == pytest.approx(2.0, rel=0.03)
    assert cost.errors.count == 200
    late = cost.errors.abs_error_sum / cost.errors.count  # mostly learned: small errors
    assert late < 0.1
    for i in range(500):  # a stalled worker: the correction stops at its bound
        entry = cost.book(4096, 0, 4096, 1, now=1000.0 + i)
        cost.observe(entry, 100 * entry.base_s)
        cost.finish(entry)
    assert cost.factor == pytest.approx(BOUND)


def test_rare_long_waits_do_not_move_the_correction():
    # one request in five waits 10x its prediction (memory, not prefill): the median
    # of the ratios is 1, and so is the correction, up to one step
    cost = WorkerCost(TERMS)
    for i in range(400):
        entry = cost.book(4096, 0, 4096, 1, now=float(i))
        cost.observe(entry, entry.base_s * (10.0 if i % 5 == 0 else 1.0))
        cost.finish(entry)
    assert cost.factor == pytest.approx(1.0, abs=0.03)


def test_tiny_prefills_are_scored_not_learned_from():
    cost = WorkerCost(TERMS)
    entry = cost.book(MIN_TOKENS - 1, 0, MIN_TOKENS, 1, now=0.0)
    cost.observe(entry, 10 * entry.base_s)
    cost.observe(entry, 10 * entry.base_s)  # once
    assert cost.samples == 0 and cost.factor == 1.0
    assert cost.errors.count == 1 and cost.errors.abs_error_sum == pytest.approx(0.9)
    assert cost.errors.buckets[ERROR_BOUNDS.index(1.0)] == 1  # 0.9: in (0.5, 1.0]


def test_a_booking_scores_its_prediction_when_its_worker_reports():
    state = WorkerState("w", BlockLRU(1000, 512), cost=WorkerCost(TERMS))
    request = RequestFeatures(blocks=list(range(8)), input_length=4096, session_id="s")
    alone = state.cost.ttft_s(4096, 0)
    booking = state.book(request, expected_output_tokens=8, now=10.0)
    entry = booking.cost_entry
    assert entry is not None and entry.predicted_s == pytest.approx(alone)
    assert state.cost.queued_tokens == 4096
    booking.first_token(now=10.0 + entry.predicted_s * 1.5)
    assert state.cost.queued_tokens == 0 and state.cost.running == 1
    booking.report_cached(0)
    assert state.cost.errors.count == 1
    assert state.cost.errors.observed_s == pytest.approx(entry.predicted_s * 1.5)
    booking.finish()
    assert (state.cost.running, state.cost.context) == (0, 0)
    # a non-streamed answer's first byte is its whole answer: not scored
    other = state.book(request, expected_output_tokens=8, now=20.0)
    other.ttft_valid = False
    other.first_token(now=21.0)
    other.report_cached(4096)
    other.finish()
    assert state.cost.errors.count == 1

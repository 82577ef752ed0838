"""The shadow of a priority-scheduling engine's prefill: chunked steps in (started, key)
order, the step under way kept, first tokens dropping their request; and the cost model's
engine-order prediction with its own correction."""

from __future__ import annotations

import numpy as np
import pytest

from router.cache.cost_model import CostTerms, WorkerCost
from router.cache.cost_profile import resolve
from router.cache.engine_queue import PriorityPrefill, step_s

H100 = resolve("h100-llama8b")
TERMS = CostTerms.of_profile(H100)
IDLE = (0, 0.0)
CHUNK = TERMS.chunk_tokens


def pairs(take: int, prior: int) -> float:
    return take * prior + take * take / 2.0


def test_alone_a_prompt_takes_its_chunks_steps_each_priced_by_its_attention():
    shadow = PriorityPrefill()
    eta = shadow.add("a", 20_000, 4096, key=5, now=10.0, terms=TERMS, decode=(3, 30_000.0))
    rest = 20_000 - 2 * CHUNK
    expected = (
        step_s(TERMS, CHUNK, pairs(CHUNK, 4096), (3, 30_000.0))
        + step_s(TERMS, CHUNK, pairs(CHUNK, 4096 + CHUNK), (3, 30_000.0))
        + step_s(TERMS, rest, pairs(rest, 4096 + 2 * CHUNK), (3, 30_000.0))
    )
    assert eta == pytest.approx(expected)
    # the same chunks after a longer prefix take longer (the attention term)
    other = PriorityPrefill()
    assert other.add("b", 20_000, 100_000, 5, 10.0, TERMS, (3, 30_000.0)) > 2 * eta


def test_a_lower_key_passes_the_waiting_but_not_the_prefill_under_way():
    shadow = PriorityPrefill()
    long = 2 * CHUNK + 4000
    shadow.add("long", long, 0, key=100, now=0.0, terms=TERMS, decode=IDLE)  # starts now
    mid = shadow.add("mid", CHUNK, 0, key=50, now=0.001, terms=TERMS, decode=IDLE)
    short = shadow.add("short", 1000, 0, key=1, now=0.002, terms=TERMS, decode=IDLE)
    # the prompt under way keeps the budget until it is through; the short one (lowest
    # key) goes next, ahead of "mid" sent before it, and "mid" gets what is left
    two = step_s(TERMS, CHUNK, pairs(CHUNK, 0), IDLE) + step_s(
        TERMS, CHUNK, pairs(CHUNK, CHUNK), IDLE
    )
    left = CHUNK - 4000 - 1000
    third = step_s(TERMS, CHUNK, pairs(4000, 2 * CHUNK) + pairs(1000, 0) + pairs(left, 0), IDLE)
    assert short == pytest.approx(two + third - 0.002)
    # each prediction is at its send, nothing more arriving: "mid" then had the rest
    alone = step_s(TERMS, CHUNK, pairs(4000, 2 * CHUNK) + pairs(CHUNK - 4000, 0), IDLE)
    assert mid == pytest.approx(
        two + alone + step_s(TERMS, 4000, pairs(4000, CHUNK - 4000), IDLE) - 0.001
    )
    # one sent now behind "mid" (a higher key) rides in "mid"'s last step
    probe = shadow.add("probe", 10, 0, key=60, now=0.003, terms=TERMS, decode=IDLE)
    fourth = step_s(TERMS, CHUNK - left + 10, pairs(CHUNK - left, left) + pairs(10, 0), IDLE)
    assert probe == pytest.approx(two + third + fourth - 0.003)
    assert len(shadow) == 4


def test_a_request_sent_mid_step_joins_at_the_steps_end():
    shadow = PriorityPrefill()
    shadow.add("a", CHUNK, 0, 1, 0.0, TERMS, IDLE)
    end = step_s(TERMS, CHUNK, pairs(CHUNK, 0), IDLE)
    eta = shadow.add("b", 100, 0, 0, end / 2, TERMS, IDLE)  # a lower key, still behind
    assert eta == pytest.approx(end / 2 + step_s(TERMS, 100, pairs(100, 0), IDLE))


def test_first_tokens_and_ends_drop_their_requests_and_time_runs_on():
    shadow = PriorityPrefill()
    shadow.add("a", CHUNK, 0, 1, 0.0, TERMS, IDLE)
    shadow.add("b", CHUNK, 0, 2, 0.0, TERMS, IDLE)
    shadow.add("c", CHUNK, 0, 3, 0.0, TERMS, IDLE)
    shadow.remove("c")  # ended without a first token
    assert len(shadow) == 2
    one = step_s(TERMS, CHUNK, pairs(CHUNK, 0), IDLE)
    shadow.first_token("a", one, TERMS, IDLE)  # on time: "b" is under way from then
    assert len(shadow) == 1
    eta = shadow.add("d", 10, 0, 0, one, TERMS, IDLE)  # behind "b", whatever its key
    assert eta == pytest.approx(one + step_s(TERMS, 10, pairs(10, 0), IDLE))
    shadow.advance(10.0, TERMS, IDLE)  # all through: idle again
    assert len(shadow) == 0
    assert shadow.add("e", 10, 0, 9, 10.0, TERMS, IDLE) == pytest.approx(
        step_s(TERMS, 10, pairs(10, 0), IDLE)
    )


def test_the_engine_order_prediction_has_its_own_correction():
    cost = WorkerCost(TERMS)
    for i in range(200):  # a worker twice as slow as its terms, in the engine's order
        entry = cost.book(4096, 0, 4096, 1, now=100.0 * i)
        cost.order(entry, key=i, cached=0, now=100.0 * i)
        assert entry.predicted_s == pytest.approx(cost.order_factor * entry.order_base_s)
        observed = 2 * entry.order_base_s
        cost.first_token(entry, now=100.0 * i + observed)
        cost.observe(entry, observed)
        cost.finish(entry)
    assert cost.order_factor == pytest.approx(2.0, rel=0.03)
    assert cost.order_samples == 200
    # the picker's correction learns from the first come first served prediction, apart
    fcfs = cost.ttft_s(4096, 0, corrected=False)  # idle: 1.5 steps' fixed cost, not 1
    assert fcfs != pytest.approx(entry.order_base_s, rel=0.01)
    assert cost.factor == pytest.approx(2 * entry.order_base_s / fcfs, rel=0.03)
    # without an engine priority nothing of it is used
    plain = WorkerCost(TERMS)
    entry = plain.book(4096, 0, 4096, 1, now=0.0)
    assert entry.order_base_s == 0.0 and entry.predicted_s == pytest.approx(entry.base_s)


def _stepped(shadow: PriorityPrefill, handle: object, now: float, decode) -> float:
    """The reference: the shadow's queue run one step at a time until ``handle`` is through."""
    jobs = shadow._jobs
    left = {id(j): j.left for j in jobs}
    prior = {id(j): j.prior for j in jobs}
    for job, take in shadow._plan:
        if id(job) in left:  # not dropped since
            left[id(job)] -= take
            prior[id(job)] += take
    end = shadow._step_end
    target = next(j for j in jobs if j.handle is handle)
    while left[id(target)] > 0:
        budget, tokens, pairs = CHUNK, 0, 0.0
        for j in jobs:
            take = min(left[id(j)], budget)
            if take <= 0:
                continue
            pairs += take * prior[id(j)] + take * take / 2.0
            left[id(j)] -= take
            prior[id(j)] += take
            tokens += take
            budget -= take
        end += step_s(TERMS, tokens, pairs, decode)
    return end - now


@pytest.mark.parametrize("seed", range(6))
def test_the_closed_form_is_the_steps_one_by_one(seed):
    rng = np.random.default_rng(seed)
    decode = (int(rng.integers(0, 40)), float(rng.integers(0, 2_000_000)))
    shadow = PriorityPrefill()
    now = 0.0
    for n in range(int(rng.integers(5, 60))):
        now += float(rng.exponential(0.2))
        tokens = int(rng.choice([1, 50, 700, 5000, 20_000, 70_000]))
        cached = int(rng.integers(0, 100_000))
        key = int(rng.integers(0, 1000))
        eta = shadow.add(n, tokens, cached, key, now, TERMS, decode)
        assert eta == pytest.approx(_stepped(shadow, n, now, decode), rel=1e-9)
        if rng.random() < 0.3 and len(shadow):  # a first token now and then
            shadow.first_token(shadow._jobs[0].handle, now, TERMS, decode)

"""dynamo: Dynamo's KV-router cost over booked state and its own TTL'd decisions."""

from __future__ import annotations

import math

import pytest

from policies.base import RequestFeatures
from policies.dynamo import DynamoPicker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState

BLOCK = 512


def _fleet(n: int = 2) -> list[WorkerState]:
    return [WorkerState(name=f"w{i}", blocks=BlockLRU(1000, BLOCK)) for i in range(n)]


def _request(blocks, arrival=None, input_length=None) -> RequestFeatures:
    length = len(blocks) * BLOCK if input_length is None else input_length
    return RequestFeatures(list(blocks), length, arrival=arrival)


def _route_alone(picker, request, fleet, target):
    """Pick ``request`` with only ``fleet[target]`` healthy (not booked: only the picker's
    own record of the decision remains)."""
    for i, state in enumerate(fleet):
        state.healthy = i == target
    assert picker.pick(request, fleet).worker == target
    for state in fleet:
        state.healthy = True


def test_cost_arithmetic():
    fleet = _fleet()
    booking = fleet[0].book(_request([1, 2], input_length=1000), 64, now=0.0)
    fleet[0].book(_request([10, 11, 12]), 64, now=0.0)
    booking.first_token(now=0.5)  # its 1000 prefill tokens are done: 1536 pending remain
    picker = DynamoPicker(overlap_score_weight=2.0)
    costs = picker.costs(_request([1, 2, 3, 4]), fleet, [0, 1], now=1.0)
    # w0: prefill 1536 + 2048 -> 2 * 3584 / 512 = 14; decode: 5 active + 2 new (1, 2 active) = 7
    # w1: prefill 0 + 2048 -> 2 * 4 = 8; decode 0 + 4 = 4
    assert costs == [21.0, 12.0]


def test_overlap_from_its_own_decisions_until_the_ttl_runs_out():
    fleet = _fleet()
    booking = fleet[0].book(_request([10, 11]), 64, now=0.0)
    booking.first_token(now=0.1)  # w0: no pending prefill, 2 active blocks
    picker = DynamoPicker()
    _route_alone(picker, _request([1, 2, 3], arrival=0.0), fleet, 0)
    request = [1, 2, 3, 4]
    # w0: overlap 3 -> prefill 512 / 512 = 1, decode 2 + 4 = 6 -> 7; w1: 4 + 4 = 8
    pick = picker.pick(_request(request, arrival=119.0), fleet)
    assert (pick.worker, pick.branch) == (0, "cost")
    # that pick refreshed blocks 1..4 on w0 until 239 s: still there at 238
    assert picker.pick(_request(request, arrival=238.0), fleet).worker == 0
    # expired: w0 = 4 + 6 = 10 > w1 = 8
    assert picker.pick(_request(request, arrival=400.0), fleet).worker == 1


def test_injected_clock_when_the_request_has_no_arrival():
    fleet = _fleet()
    picker = DynamoPicker(ttl_s=10.0)
    now = [0.0]
    picker.clock = lambda: now[0]
    _route_alone(picker, _request([1, 2]), fleet, 1)
    now[0] = 9.0
    assert picker.pick(_request([1, 2, 3]), fleet).worker == 1  # overlap 2 on w1
    now[0] = 30.0
    assert picker.pick(_request([1, 2, 3]), fleet).branch == "cost_tie"  # forgotten: all equal


def test_ties_at_random_across_seeds():
    chosen = set()
    for seed in range(20):
        pick = DynamoPicker(seed=seed).pick(_request([1, 2]), _fleet(4))
        assert pick.branch == "cost_tie"
        chosen.add(pick.worker)
    assert len(chosen) > 1


def test_temperature_draws_by_the_softmax_of_normalised_costs():
    fleet = _fleet()
    fleet[0].book(_request([10, 11, 12, 13]), 0, now=0.0)  # w0 dearer
    picker = DynamoPicker(temperature=1.0, seed=1)
    picks = [picker.pick(_request([7000 + k]), fleet) for k in range(3000)]
    assert {p.branch for p in picks} == {"sampled"}
    share = sum(p.worker == 1 for p in picks) / len(picks)
    # costs 9 (w0) and 2 (w1), normalised 1 and 0: p(w1) = 1 / (1 + e^-1)
    assert share == pytest.approx(1 / (1 + math.exp(-1)), abs=0.03)


def test_rejects_bad_parameters():
    with pytest.raises(ValueError):
        DynamoPicker(ttl_s=0)

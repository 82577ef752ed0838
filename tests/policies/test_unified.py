"""unified: the two affinity gates at their exact edges, the fallback and rebinding."""

from __future__ import annotations

import pytest

from policies.unified import UnifiedPicker


def _bound(session="s", worker_index=0, **params) -> UnifiedPicker:
    picker = UnifiedPicker(**params)
    picker.sessions.bind(session, worker_index)
    return picker


WARM = {1, 2, 3, 4}  # the whole 2048-token request: hit ratio 1.0


def test_sticks_when_warm_and_not_overloaded(worker, request_for):
    workers = [worker(cached=WARM, num_requests=2), worker(1), worker(1)]  # 2 <= 2 * 4/3
    pick = _bound().pick(request_for(session="s"), workers)
    assert (pick.worker, pick.branch) == (0, "affinity_stick")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (2048, 2048)


def test_overload_gate_exactly_twice_the_mean_sticks(worker, request_for):
    # num_requests 4, 2, 1, 1: mean 2, limit 2.0 * 2 = 4, and 4 <= 4
    workers = [worker(cached=WARM, num_requests=4), worker(2), worker(1), worker(1)]
    pick = _bound().pick(request_for(session="s"), workers)
    assert (pick.worker, pick.branch) == (0, "affinity_stick")


def test_overload_gate_just_above_falls_back_to_lmetric(worker, request_for):
    # num_requests 5, 2, 1, 0: mean 2, limit 4, and 5 > 4
    workers = [
        worker(cached=WARM, num_requests=5),  # (0 + 0) * 5 = 0
        worker(num_requests=2),  # 2048 * 2 = 4096
        worker(num_requests=1),  # 2048 * 1 = 2048
        worker(num_requests=0),  # 2048 * 0 = 0, new_prefill 2048
    ]
    picker = _bound()
    pick = picker.pick(request_for(session="s"), workers)
    # LMetric: workers 0 and 3 share score 0; new_prefill 0 < 2048 keeps worker 0
    assert (pick.worker, pick.branch) == (0, "affinity_overloaded")


def test_overloaded_fallback_can_move_the_session(worker, request_for):
    workers = [
        worker(cached=WARM, num_requests=5, pending=1000),  # 1000 * 5 = 5000
        worker(num_requests=2),  # 4096
        worker(num_requests=1),  # 2048  <- LMetric winner
        worker(num_requests=1, pending=512),  # (512 + 2048) * 1 = 2560
    ]
    picker = _bound()
    pick = picker.pick(request_for(session="s"), workers)
    assert (pick.worker, pick.branch) == (2, "affinity_overloaded")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)
    assert picker.sessions.get("s") == 2  # rebound to where the prefix now goes


def test_mean_is_floored_at_one(worker, request_for):
    # mean 0.5 -> max(0.5, 1) = 1 -> limit 2: two requests stick, three do not
    workers = [worker(cached=WARM, num_requests=2), worker(), worker(), worker()]
    assert _bound().pick(request_for(session="s"), workers).branch == "affinity_stick"
    workers[0].num_requests = 3
    assert _bound().pick(request_for(session="s"), workers).branch == "affinity_overloaded"


def test_hit_ratio_exactly_half_falls_back(worker, request_for):
    # 2 of 4 blocks cached: 1024 / 2048 = 0.5, not > 0.5
    workers = [worker(cached={1, 2}, num_requests=1), worker(num_requests=1)]
    pick = _bound().pick(request_for(session="s"), workers)
    assert pick.branch == "affinity_cold"
    # LMetric still prefers the half-warm worker: 1024 * 1 vs 2048 * 1
    assert pick.worker == 0


def test_hit_ratio_just_above_half_sticks(worker, request_for):
    # 1024 / 2047 > 0.5
    workers = [worker(cached={1, 2}, num_requests=1), worker()]
    pick = _bound().pick(request_for(session="s", input_length=2047), workers)
    assert (pick.worker, pick.branch) == (0, "affinity_stick")


def test_cold_is_reported_before_overloaded(worker, request_for):
    workers = [worker(num_requests=9), worker(), worker()]
    pick = _bound().pick(request_for(session="s"), workers)
    assert pick.branch == "affinity_cold"


def test_fresh_idle_fleet(idle_fleet, request_for):
    workers = idle_fleet(4)
    picker = UnifiedPicker()
    picks = [picker.pick(request_for([10 + i], session=f"s{i}"), workers) for i in range(5)]
    assert [p.worker for p in picks] == [0, 1, 2, 3, 0]
    assert {p.branch for p in picks} == {"tie_rr"}
    assert [picker.sessions.get(f"s{i}") for i in range(5)] == [0, 1, 2, 3, 0]


def test_idle_fleet_with_one_warm_worker(worker, request_for):
    workers = [worker(), worker(), worker(cached={1, 2}), worker()]
    pick = UnifiedPicker().pick(request_for(session="new"), workers)
    assert (pick.worker, pick.branch) == (2, "score")


def test_first_tie_break_reproduces_worker_zero_pinning(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = UnifiedPicker(tie_break="first")
    assert {picker.pick(request_for([i], session=f"s{i}"), workers).worker for i in range(4)} == {0}


def test_session_follows_warm_worker_across_turns(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = UnifiedPicker()
    first = picker.pick(request_for([1, 2], session="s"), workers)
    workers[first.worker].cached |= {1, 2}  # the router books the request there
    workers[first.worker].num_requests = 1
    second = picker.pick(request_for([1, 2, 3], session="s"), workers)
    # 1024 / 1536 > 0.5 and 1 <= 2 * max(0.5, 1): stays although the other worker is idle
    assert (second.worker, second.branch) == (first.worker, "affinity_stick")


def test_request_without_session_goes_straight_to_lmetric(worker, request_for):
    workers = [worker(num_requests=1), worker(cached=WARM, num_requests=1)]
    picker = UnifiedPicker()
    pick = picker.pick(request_for(), workers)
    assert (pick.worker, pick.branch) == (1, "score")
    assert len(picker.sessions) == 0


def test_bound_worker_unhealthy_falls_back_and_rebinds(worker, request_for):
    workers = [worker(cached=WARM, healthy=False), worker(num_requests=1), worker()]
    picker = _bound()
    pick = picker.pick(request_for(session="s"), workers)
    assert (pick.worker, pick.branch) == (2, "affinity_unhealthy")
    assert picker.sessions.get("s") == 2
    assert workers[0].estimate_calls == 0


def test_unhealthy_workers_excluded_from_mean(worker, request_for):
    # healthy: 4 and 0 -> mean 2, limit 4: sticks. Counting the idle dead worker would give
    # mean 4/3, limit 2.67, and 4 would be overloaded.
    workers = [worker(cached=WARM, num_requests=4), worker(), worker(healthy=False)]
    assert _bound().pick(request_for(session="s"), workers).branch == "affinity_stick"


def test_parameters_are_honoured(worker, request_for):
    workers = [worker(cached={1, 2, 3}, num_requests=4), worker(2), worker(1), worker(1)]
    # hit 0.75 with gate 0.8 -> cold
    picker = _bound(hit_ratio_gate=0.8)
    assert picker.pick(request_for(session="s"), workers).branch == "affinity_cold"
    # 4 > 1.5 * 2 -> overloaded
    picker = _bound(overload_factor=1.5)
    assert picker.pick(request_for(session="s"), workers).branch == "affinity_overloaded"


def test_estimate_called_once_per_worker_on_every_path(worker, request_for):
    workers = [worker(cached=WARM), worker(), worker()]
    picker = _bound()
    picker.pick(request_for(session="s"), workers)  # stick
    workers[0].num_requests = 10
    picker.pick(request_for(session="s"), workers)  # overloaded fallback
    assert [w.estimate_calls for w in workers] == [2, 2, 2]


def test_invalid_overload_factor():
    with pytest.raises(ValueError):
        UnifiedPicker(overload_factor=0)

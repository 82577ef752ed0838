"""sticky: hard affinity (seed 002 §3), bounded bindings, unhealthy rebinding."""

from __future__ import annotations

from policies.sticky import StickyPicker


def test_new_session_goes_to_least_loaded_and_binds(worker, request_for):
    workers = [worker(num_requests=2), worker(num_requests=1), worker(num_requests=3)]
    picker = StickyPicker()
    pick = picker.pick(request_for(session="a"), workers)
    assert (pick.worker, pick.branch) == (1, "affinity_new")
    assert picker.sessions.get("a") == 1


def test_binding_is_unconditional(worker, request_for):
    workers = [worker(), worker()]
    picker = StickyPicker()
    assert picker.pick(request_for(session="a"), workers).worker == 0
    # worker 0 becomes hugely overloaded and cold: sticky never breaks the binding
    workers[0].num_requests = 1000
    workers[1].cached = {1, 2, 3, 4}
    pick = picker.pick(request_for(session="a"), workers)
    assert (pick.worker, pick.branch) == (0, "affinity_stick")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)


def test_new_sessions_on_idle_fleet_pin_worker_zero_by_default(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = StickyPicker()
    assert {picker.pick(request_for(session=s), workers).worker for s in "abc"} == {0}


def test_multikey_spreads_new_sessions(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = StickyPicker(tie_break="multikey")
    assert [picker.pick(request_for(session=s), workers).worker for s in "abcd"] == [0, 1, 2, 0]


def test_request_without_session_binds_nothing(worker, request_for):
    picker = StickyPicker()
    pick = picker.pick(request_for(), [worker(num_requests=1), worker()])
    assert (pick.worker, pick.branch) == (1, "no_session")
    assert len(picker.sessions) == 0


def test_bound_worker_unhealthy_rebinds(worker, request_for):
    workers = [worker(), worker(num_requests=5), worker(num_requests=2)]
    picker = StickyPicker()
    picker.pick(request_for(session="a"), workers)
    workers[0].healthy = False
    pick = picker.pick(request_for(session="a"), workers)
    assert (pick.worker, pick.branch) == (2, "affinity_unhealthy")
    # the new binding holds even once the old worker recovers
    workers[0].healthy = True
    assert picker.pick(request_for(session="a"), workers).worker == 2


def test_binding_beyond_worker_list_is_treated_as_new(worker, request_for):
    picker = StickyPicker()
    picker.sessions.bind("a", 5)
    pick = picker.pick(request_for(session="a"), [worker(), worker()])
    assert (pick.worker, pick.branch) == (0, "affinity_new")


def test_bindings_are_bounded_lru(worker, request_for):
    workers = [worker(), worker()]
    picker = StickyPicker(max_sessions=2)
    picker.pick(request_for(session="a"), workers)  # a -> 0
    workers[0].num_requests = 1
    picker.pick(request_for(session="b"), workers)  # b -> 1
    picker.pick(request_for(session="a"), workers)  # touch a: b is now least recent
    picker.pick(request_for(session="c"), workers)  # evicts b
    assert len(picker.sessions) == 2
    assert "b" not in picker.sessions
    assert "a" in picker.sessions and "c" in picker.sessions

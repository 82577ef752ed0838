"""random baseline: seeded, uniform over healthy workers."""

from __future__ import annotations

from policies.random_choice import RandomPicker


def _sequence(picker, workers, request, n=200):
    return [picker.pick(request, workers).worker for _ in range(n)]


def test_same_seed_same_sequence(idle_fleet, request_for):
    workers, req = idle_fleet(4), request_for()
    assert _sequence(RandomPicker(seed=7), workers, req) == _sequence(
        RandomPicker(seed=7), workers, req
    )
    assert _sequence(RandomPicker(seed=7), workers, req) != _sequence(
        RandomPicker(seed=8), workers, req
    )


def test_uses_every_healthy_worker_and_no_other(worker, request_for):
    workers = [worker(), worker(healthy=False), worker(), worker()]
    picks = _sequence(RandomPicker(), workers, request_for(), n=400)
    assert set(picks) == {0, 2, 3}
    assert min(picks.count(i) for i in (0, 2, 3)) > 80  # roughly uniform (expected ~133)

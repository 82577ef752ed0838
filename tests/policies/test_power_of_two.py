"""power_of_two baseline: the less loaded of two sampled workers."""

from __future__ import annotations

from policies.power_of_two import PowerOfTwoPicker


def test_never_picks_the_strictly_most_loaded(worker, request_for):
    workers = [worker(9), worker(1), worker(2)]
    picker = PowerOfTwoPicker(seed=3)
    picks = [picker.pick(request_for(), workers).worker for _ in range(300)]
    assert 0 not in picks
    assert set(picks) == {1, 2}  # 2 wins whenever the pair is (0, 2)


def test_two_workers_always_less_loaded(worker, request_for):
    workers = [worker(5), worker(1)]
    picker = PowerOfTwoPicker()
    assert {picker.pick(request_for(), workers).worker for _ in range(50)} == {1}


def test_single_healthy_worker(worker, request_for):
    workers = [worker(healthy=False), worker(3), worker(healthy=False)]
    pick = PowerOfTwoPicker().pick(request_for(), workers)
    assert (pick.worker, pick.branch) == (1, "power_of_two")


def test_seeded(idle_fleet, request_for):
    workers = idle_fleet(8)

    def run(seed):
        picker = PowerOfTwoPicker(seed=seed)
        return [picker.pick(request_for(), workers).worker for _ in range(100)]

    assert run(1) == run(1)
    assert run(1) != run(2)

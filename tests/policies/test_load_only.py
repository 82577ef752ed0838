"""load_only: fewest num_requests (seed 002 §2) and its first-seen ties."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker
from policies.load_only import LoadOnlyPicker


def test_fewest_requests_wins_whatever_the_cache(worker, request_for):
    workers = [worker(cached={1, 2, 3, 4}, num_requests=3), worker(num_requests=1), worker(2)]
    pick = LoadOnlyPicker().pick(request_for(), workers)
    assert (pick.worker, pick.branch) == (1, "least_load")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)


def test_ties_go_to_first_seen_like_python_min(idle_fleet, request_for):
    # the seed's "unintentional stickiness": an idle fleet always lands on worker 0
    workers = idle_fleet(4)
    picker = LoadOnlyPicker()
    picks = [picker.pick(request_for([i]), workers) for i in range(5)]
    assert [p.worker for p in picks] == [0] * 5
    assert {p.branch for p in picks} == {"tie_first"}


def test_first_seen_among_least_loaded_only(worker, request_for):
    workers = [worker(num_requests=2), worker(num_requests=1), worker(num_requests=1)]
    assert LoadOnlyPicker().pick(request_for(), workers).worker == 1


def test_multikey_spreads_ties(worker, request_for):
    workers = [worker(num_requests=1), worker(), worker(), worker()]
    picker = LoadOnlyPicker(tie_break="multikey")
    picks = [picker.pick(request_for(), workers) for _ in range(4)]
    assert [p.worker for p in picks] == [1, 2, 3, 1]
    assert {p.branch for p in picks} == {"tie_rr"}


def test_unhealthy_skipped(worker, request_for):
    workers = [worker(healthy=False), worker(num_requests=7)]
    assert LoadOnlyPicker().pick(request_for(), workers).worker == 1
    with pytest.raises(NoHealthyWorker):
        LoadOnlyPicker().pick(request_for(), [worker(healthy=False)])

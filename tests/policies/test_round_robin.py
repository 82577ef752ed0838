"""round_robin baseline."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker
from policies.round_robin import RoundRobinPicker


def test_cycles_ignoring_cache_and_load(worker, request_for):
    workers = [worker(cached={1, 2, 3, 4}), worker(50), worker()]
    picker = RoundRobinPicker()
    picks = [picker.pick(request_for(), workers) for _ in range(4)]
    assert [p.worker for p in picks] == [0, 1, 2, 0]
    assert [p.hit_tokens for p in picks] == [2048, 0, 0, 2048]
    assert {(p.branch, p.best_hit_tokens) for p in picks} == {("round_robin", 2048)}


def test_skips_unhealthy(worker, request_for):
    workers = [worker(), worker(healthy=False), worker()]
    picker = RoundRobinPicker()
    assert [picker.pick(request_for(), workers).worker for _ in range(3)] == [0, 2, 0]
    with pytest.raises(NoHealthyWorker):
        picker.pick(request_for(), [worker(healthy=False)])

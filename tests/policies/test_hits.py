"""The shared first pass: health and one estimate per healthy worker."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker
from policies.hits import UNHEALTHY, estimate_hits


def test_hits_and_best(worker, request_for):
    workers = [worker(cached={1}), worker(cached={1, 2, 3}, healthy=False), worker(cached={1, 2})]
    hits, best = estimate_hits(request_for(), workers)
    assert (hits, best) == ([512, UNHEALTHY, 1024], 1024)
    assert [w.estimate_calls for w in workers] == [1, 0, 1]


def test_all_cold_best_is_zero(idle_fleet, request_for):
    assert estimate_hits(request_for(), idle_fleet(2)) == ([0, 0], 0)


def test_none_healthy(worker, request_for):
    with pytest.raises(NoHealthyWorker):
        estimate_hits(request_for(), [worker(healthy=False), worker(healthy=False)])

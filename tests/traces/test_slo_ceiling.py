"""bench/pickers/slo_ceiling.py: how many requests must miss a TTFT SLO, whatever the router."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("pickers/slo_ceiling")


def test_requests_that_cannot_all_fit_their_window_are_late(bench) -> None:
    # three requests at once, 2 s of work each, one worker, SLO 2 s: only one can be on time
    arrivals, work = np.zeros(3), np.full(3, 2.0)
    assert bench.late_lower_bound(arrivals, work, 1, 2.0) == 2
    # three workers take all three
    assert bench.late_lower_bound(arrivals, work, 3, 2.0) == 0
    # the fewest late carry the excess: the largest first (one 3 s request beside two 0.5 s)
    assert bench.late_lower_bound(arrivals, np.array([0.5, 3.0, 0.5]), 1, 2.0) == 1


def test_windows_that_do_not_overlap_add_up(bench) -> None:
    # two bursts far apart, each one request too many for the one worker
    arrivals = np.array([0.0, 0.0, 50.0, 50.0])
    work = np.full(4, 1.5)
    assert bench.late_lower_bound(arrivals, work, 1, 2.0) == 2
    # spread out, every request has its worker to itself
    assert bench.late_lower_bound(np.array([0.0, 10.0, 20.0, 30.0]), work, 1, 2.0) == 0


def test_the_percentile_reads_the_tail_it_interpolates(bench) -> None:
    # p90 of 11 values is the value at index 9 exactly: the one above it may be over the SLO
    assert bench.allowed_late(11, 0.9) == 1
    # of 3993 (the synthetic trace): index 3592.8 reads 3593, so 399 may be over
    assert bench.allowed_late(3993, 0.9) == 399
    values = np.concatenate((np.zeros(3993 - 399), np.full(399, 9.0)))
    assert np.percentile(values, 90) <= 2.0
    values[-400] = 9.0
    assert np.percentile(values, 90) > 2.0

"""bench/pickers/capacity_bars.py: issue 52's two capacity bars read from one cell's runs."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("pickers/capacity_bars")


def test_capacity_bar_is_against_the_best_peer(bench) -> None:
    capacity = {"ttft": 3.8, "llmd": 2.6, "llmd_precise": 3.05, "dynamo": 2.4, "smg": 2.1,
                "aibrix": None, "round_robin": 9.0}  # fmt: skip
    best, ratio = bench.capacity_bar(capacity)
    # round_robin is not a peer; a peer that holds the SLO nowhere counts as 0
    assert best == "llmd_precise"
    assert ratio == pytest.approx(3.8 / 3.05)
    assert bench.capacity_bar({**capacity, "ttft": None})[1] == 0.0


def test_curve_bar_is_against_the_lowest_peer_p90_at_that_load(bench) -> None:
    p90 = {"ttft": 2.5, "llmd": 3.0, "llmd_precise": 2.0, "dynamo": None, "smg": 4.0,
           "aibrix": 9.0}  # fmt: skip
    assert bench.curve_bar(p90) == ("llmd_precise", pytest.approx(1.25))


def test_the_table_says_which_bars_are_met(bench) -> None:
    cell = {
        "slo": "ttft_p90=2", "capacity": {"ttft": 3.831, "llmd_precise": 3.05},
        "best_peer": "llmd_precise", "ttft_over_best_peer": 3.831 / 3.05,
        "capacity_bar_met": True, "curve_bar_met": False,
        "curve": [{"ttft_over_best_peer_p90": 0.69}, {"ttft_over_best_peer_p90": 1.3}],
    }  # fmt: skip
    row = bench.markdown({"synthetic8": cell}).splitlines()[-1]
    assert row == (
        "| synthetic8 | ttft_p90=2 | 3.831 | llmd_precise 3.050 | 1.26 | met | 0.69 / 1.30 "
        "| not met |"
    )

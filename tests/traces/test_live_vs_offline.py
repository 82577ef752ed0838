"""bench/live_vs_offline/live_vs_offline.py's reading of its salts in groups of three
(issue 31's statistic)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("live_vs_offline/live_vs_offline")


def _row(policy: str, p90: list[float], hit: list[float]) -> dict:
    return {"policy": policy, "live_ttft_p90_salts": p90, "live_hit_rate_salts": hit}


def test_each_group_of_three_salts_is_read_on_its_own(bench) -> None:
    rows = [
        _row("ttft", [1.0, 1.0, 1.0, 3.0, 3.0, 1.0], [0.70, 0.70, 0.72, 0.70, 0.69, 0.71]),
        _row("unified", [2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [0.75, 0.73, 0.73, 0.71, 0.71, 0.71]),
    ]
    groups, md = bench.salt_groups(rows)
    assert [g["salts"] for g in groups] == [[0, 2], [3, 5]]
    assert [g["best_p90"] for g in groups] == ["ttft", "unified"]
    assert groups[1]["default_p90"] == 3.0 and groups[1]["best_other_p90"] == 2.0
    assert groups[0]["default_hit_gap"] == pytest.approx(0.03)
    assert groups[1]["default_hit_gap"] == pytest.approx(0.01)
    assert "| 3-5 | unified | 3.00 / 2.00 | 1.0 |" in md


def test_fewer_than_two_groups_or_no_other_policy_reads_nothing(bench) -> None:
    two = [_row("ttft", [1.0, 2.0, 3.0], [0.1, 0.2, 0.3]), _row("unified", [1.0] * 3, [0.1] * 3)]
    assert bench.salt_groups(two) == ([], "")
    alone = [_row("ttft", [1.0] * 6, [0.1] * 6)]
    assert bench.salt_groups(alone) == ([], "")


def test_the_router_is_given_the_workers_time_scale(bench, monkeypatch) -> None:
    import json

    from policies.ttft import TTFTPicker
    from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S

    monkeypatch.delenv("CACHE_ROUTER_PICKER_PARAMS", raising=False)
    assert bench.time_scaled_env("ttft", 1.0) == {}
    prior = float(bench.time_scaled_env("unified", 5.0)["CACHE_ROUTER_PREFILL_TOKENS_PER_S"])
    assert prior == DEFAULT_PREFILL_TOKENS_PER_S * 5
    assert "CACHE_ROUTER_PICKER_PARAMS" not in bench.time_scaled_env("unified", 5.0)
    params = json.loads(bench.time_scaled_env("ttft", 5.0)["CACHE_ROUTER_PICKER_PARAMS"])
    default = TTFTPicker().params
    assert params["hopeless_s"] == pytest.approx(default.hopeless_s / 5)
    assert params["step_s"] == pytest.approx(default.step_s / 5)
    assert params["prefill_tokens_per_s"] == pytest.approx(default.prefill_tokens_per_s * 5)
    assert "affinity_margin" not in params  # a ratio: the same at any time scale
    TTFTPicker(**params)  # every key is one of ttft's parameters
    monkeypatch.setenv("CACHE_ROUTER_PICKER_PARAMS", '{"affinity_margin": 1.0, "live_s": 7}')
    params = json.loads(bench.time_scaled_env("ttft", 5.0)["CACHE_ROUTER_PICKER_PARAMS"])
    assert params["affinity_margin"] == 1.0 and params["live_s"] == 7  # the user's, on top

"""bench/models/model_fleet.py, small: two models (one with LoRA adapters) behind one router vs one
router per model, live sim workers and routers on 127.0.0.1."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("models/model_fleet")


@pytest.mark.slow  # a live mixed-model replay, ~50 s on 2 cores
def test_a_mixed_fleet_routes_by_model_and_keeps_each_models_hit_rate(bench) -> None:
    args = argparse.Namespace(
        trace=bench.SAMPLE, requests=160, speedup=20.0, policy="ttft", workers_a=2,
        workers_b=2, adapters=2, max_loras=2, kv_capacity_tokens=262_144,
    )  # fmt: skip
    out = bench.run(args)
    assert out["unknown_model"] == (404, "model_not_found")  # the router's own answer
    assert out["misrouted"] == 0  # every request on a worker that serves its model
    for run in ("mixed", "separate"):
        assert {m: r.errors for m, r in out[run].items()} == dict.fromkeys(out["groups"], 0)
        assert {m: r.requests for m, r in out[run].items()} == out["groups"]
    mixed = bench.family_hit_rates(out["mixed"])
    separate = bench.family_hit_rates(out["separate"])
    assert mixed.keys() == {"model-a", "model-b"}
    for family, rate in mixed.items():
        assert abs(rate - separate[family]) <= 0.02, (family, rate, separate[family])

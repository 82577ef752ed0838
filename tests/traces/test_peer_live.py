"""bench/peers/peer_live.py's pure parts on hand-made runs: each run's figures, the summary
over repetitions, the default against the best real peer, the faithfulness table, capacity
over the grid; and the peers' command lines. The real peers are not needed."""

from __future__ import annotations

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("peers/peer_live")


@pytest.fixture(scope="module")
def peers(bench_module):
    return bench_module("peers/peer_routers")


def _run(router: str, load: float, p90: float, hit: float, errors: int = 0) -> dict:
    return {"router": router, "load": load, "salt": 0, "ttft_p50": p90 / 2, "ttft_p90": p90,
            "ttft_p99": 2 * p90, "hit_rate": hit, "errors": errors}  # fmt: skip


def test_routers_parse_as_kind_policy_variant(bench) -> None:
    spec = bench.parse_router("smg:cache_aware:steady")
    assert (spec.kind, spec.policy, spec.variant) == ("smg", "cache_aware", "steady")
    assert spec.real_peer
    assert spec.name == "smg:cache_aware:steady"
    assert bench.parse_router("serve:ttft").real_peer is False
    assert bench.parse_router("vllm-router:cache_aware").real_peer is True
    for bad in ("ttft", "nginx:rr", "serve:ttft:steady", "smg:cache_aware:fast", "smg::x"):
        with pytest.raises(ValueError):
            bench.parse_router(bad)


def test_steady_smg_runs_its_timers_in_the_workers_time(bench) -> None:
    args = bench.variant_args("smg", "steady", 10.0)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {
        "--worker-warmup-secs": "0", "--worker-warmup-divert-every": "0",
        "--load-monitor-interval": "1", "--worker-stale-secs": "2",
        "--worker-stall-secs": "1", "--worker-wedge-secs": "1",  # 0.2 and 0.3 s: at least 1
        "--eviction-interval-secs": "6",
    }  # fmt: skip
    assert bench.variant_args("smg", None, 10.0) == []
    with pytest.raises(ValueError):
        bench.variant_args("vllm-router", "steady", 10.0)


def test_a_run_reads_percentiles_over_the_requests_served(bench) -> None:
    ttft = np.array([1.0, 2.0, 3.0, 4.0, np.nan, 100.0])
    status = np.array([200, 200, 200, 200, 200, 503])  # a cut stream, a refusal
    record = bench.run_record("serve:ttft", 0.5, 3, ttft, status, 0.25, errors=1)
    assert (record["requests"], record["served"], record["errors"]) == (6, 4, 2)
    assert record["ttft_p50"] == pytest.approx(2.5)
    assert record["ttft_p90"] == pytest.approx(3.7)  # of 1, 2, 3, 4: the 503's 100 s is out
    assert record["hit_rate"] == 0.25
    none = bench.run_record("x:y", 1.0, 0, np.array([np.nan]), np.array([0]), None, 1)
    assert math.isnan(none["ttft_p90"]) and math.isnan(none["hit_rate"])


def test_where_the_work_went(bench) -> None:
    before = [{"requests": 10, "prompt_tokens": 1000, "hit_tokens": 100}] * 2
    after = [
        {"requests": 40, "prompt_tokens": 31000, "hit_tokens": 10100},
        {"requests": 20, "prompt_tokens": 11000, "hit_tokens": 100},
    ]
    out = bench.spread(before, after)
    assert out["requests_per_worker"] == [30, 10]
    assert out["prefill_tokens_per_worker"] == [20000, 10000]
    assert out["requests_max_over_mean"] == pytest.approx(1.5)
    assert out["prefill_max_over_mean"] == pytest.approx(20000 / 15000)


def test_summary_takes_medians_over_repetitions(bench) -> None:
    runs = [_run("serve:ttft", 0.5, p90, hit) for p90, hit in ((3.0, 0.7), (5.0, 0.6), (4.0, 0.8))]
    runs.append(_run("serve:ttft", 0.5, math.nan, math.nan, errors=3))
    (row,) = bench.summarize(runs)
    assert (row["runs"], row["ttft_p90"], row["hit_rate"], row["errors"]) == (4, 4.0, 0.7, 3)
    assert row["ttft_p90_runs"][:3] == [3.0, 5.0, 4.0]


def test_the_default_against_the_best_real_peer(bench) -> None:
    rows = bench.summarize([
        _run("serve:ttft", 0.3, 6.0, 0.74),
        _run("smg:cache_aware", 0.3, 20.0, 0.62),
        _run("smg:cache_aware:steady", 0.3, 10.0, 0.70),  # a variant counts as a real peer
        _run("vllm-router:cache_aware", 0.3, 12.0, 0.75),
        _run("serve:unified", 0.3, 5.0, 0.80),  # ours: never the bar
        _run("serve:ttft", 0.6, 9.0, 0.70),
        _run("vllm-router:cache_aware", 0.6, 10.0, 0.72),
    ])  # fmt: skip
    low, high = bench.default_vs_peers(rows)
    assert low["best_peer"] == "smg:cache_aware:steady"
    assert low["p90_ratio"] == pytest.approx(0.6) and low["p90_ok"]
    assert low["hit_ok"] and low["highest_peer_hit"] == 0.75  # >= the best peer's 70%
    assert high["p90_ratio"] == pytest.approx(0.9) and not high["p90_ok"]
    assert not high["hit_ok"]  # 70% < 72%


def test_faithfulness_in_points(bench) -> None:
    rows = bench.summarize([
        _run("serve:smg", 0.8, 4.0, 0.158), _run("smg:cache_aware", 0.8, 10.0, 0.101),
        _run("serve:vllm_router", 0.8, 4.5, 0.153),
        _run("vllm-router:cache_aware", 0.8, 6.0, 0.150),
    ])  # fmt: skip
    table = {(v["reimplementation"], v["binary"]): v for v in bench.faithfulness(rows)}
    smg = table[("serve:smg", "smg:cache_aware")]
    assert smg["points"] == pytest.approx(5.7) and not smg["within"]
    vllm = table[("serve:vllm_router", "vllm-router:cache_aware")]
    assert vllm["points"] == pytest.approx(0.3) and vllm["within"]
    assert ("serve:sglang_cache_aware", "vllm-router:cache_aware") not in table  # not run


def test_capacity_is_read_over_the_grid(bench) -> None:
    p90s = {
        "serve:ttft": [6.0, 9.0, 14.0, 18.0],  # holds to 0.45
        "vllm-router:cache_aware": [12.0, 16.0, 14.0, 30.0],  # 0.45 alone held: not counted
        "smg:cache_aware": [18.0, 20.0, 25.0, 40.0],  # never
        "serve:unified": [5.0, 6.0, 7.0, 8.0],  # all: a lower bound
    }
    loads = [0.2, 0.3, 0.45, 0.6]
    runs = [
        _run(r, load, p, 0.7) for r, ps in p90s.items() for load, p in zip(loads, ps, strict=True)
    ]
    runs.append(_run("serve:unified", 0.45, 7.0, 0.7, errors=1))  # an error: it missed
    caps = bench.capacity(bench.summarize(runs), 15.0)
    assert (caps["serve:ttft"]["load"], caps["serve:ttft"]["bound"]) == (0.45, "grid")
    vllm = caps["vllm-router:cache_aware"]
    assert (vllm["load"], vllm["bound"]) == (0.2, "grid")
    assert (caps["smg:cache_aware"]["load"], caps["smg:cache_aware"]["bound"]) == (None, "below")
    assert (caps["serve:unified"]["load"], caps["serve:unified"]["bound"]) == (0.3, "grid")
    ratio = bench.capacity_ratio(caps)
    assert ratio["best_peer"] == "vllm-router:cache_aware"
    assert (ratio["ratio"], ratio["bound"]) == (pytest.approx(2.25), "grid")


def test_capacity_ratio_says_how_far_the_grid_reads(bench) -> None:
    def cap(load, bound, lowest=0.2, highest=0.6):
        return {"load": load, "bound": bound, "lowest": lowest, "highest": highest}

    top = {"serve:ttft": cap(0.6, "at_least"), "smg:least_load": cap(0.3, "grid")}
    assert bench.capacity_ratio(top) == {"best_peer": "smg:least_load", "ratio": 2.0,
                                         "bound": "at_least"}  # fmt: skip
    none_held = {"serve:ttft": cap(0.3, "grid"), "smg:least_load": cap(None, "below")}
    assert bench.capacity_ratio(none_held) == {"best_peer": None, "ratio": pytest.approx(1.5),
                                               "bound": "at_least"}  # fmt: skip
    mine_below = {"serve:ttft": cap(None, "below"), "smg:least_load": cap(0.4, "grid")}
    assert bench.capacity_ratio(mine_below)["bound"] == "below"
    assert bench.capacity_ratio({"serve:ttft": cap(0.3, "grid")}) is None


def test_markdown_names_every_table(bench) -> None:
    runs = [_run("serve:ttft", 0.3, 6.0, 0.74), _run("vllm-router:cache_aware", 0.3, 12.0, 0.7),
            _run("serve:vllm_router", 0.3, 11.0, 0.71)]  # fmt: skip
    config = {"trace": "traces/data/x.jsonl", "requests": 3, "workers": 4,
              "kv_capacity_tokens": 1_000_000, "time_scale": 10.0, "pacing": "open",
              "repeats": 1, "slo_ttft_p90_s": 15.0, "loads": [0.3]}  # fmt: skip
    doc = {"config": config, "versions": {"vllm-router": "0.1.17"}, **bench.report(runs, 15.0)}
    md = bench.markdown(doc)
    assert "| 0.3 | serve:ttft | 1 | 3.00 | 6.00 (6.00) | 12.00 | 74.0% (74.0) | 0 |" in md
    assert "| 0.3 | 6.00 | vllm-router:cache_aware | 12.00 | 0.50x met |" in md
    assert "| serve:vllm_router | vllm-router:cache_aware | 71.0% | 70.0% | +1.0 within |" in md
    assert "serve:ttft / best real peer (vllm-router:cache_aware): 1.00x (unknown" in md


def test_peers_listen_on_loopback_only(peers) -> None:
    argv = peers.peer_argv("smg", "/bin/smg", ["http://127.0.0.1:1"], "least_load", 5, 6)
    assert argv[:2] == ["/bin/smg", "launch"]
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert flags["--host"] == "127.0.0.1" and flags["--prometheus-host"] == "127.0.0.1"
    assert (flags["--port"], flags["--prometheus-port"]) == ("5", "6")
    assert flags["--policy"] == "least_load"
    vllm = peers.peer_argv("vllm-router", "/bin/vr", ["u1", "u2"], "cache_aware", 5, 6, ["-x"])
    assert vllm[0] == "/bin/vr" and vllm[-1] == "-x" and "launch" not in vllm
    assert vllm[vllm.index("--worker-urls") + 1 : vllm.index("--policy")] == ["u1", "u2"]
    with pytest.raises(ValueError):
        peers.peer_argv("nginx", "/bin/nginx", [], "rr", 5, 6)

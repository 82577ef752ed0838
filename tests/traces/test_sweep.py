"""Live sweeps (sim workers + one router per policy) against the offline simulator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import traces
from router.cli import build_parser, main
from traces.formats import load_trace
from traces.simulate import run_and_report
from traces.sweep import run_sweep, select

CONVERSATION = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"
SLOW = pytest.mark.skipif(
    os.environ.get("CACHE_ROUTER_SLOW") != "1", reason="slow suite: set CACHE_ROUTER_SLOW=1"
)


def test_live_sweep_agrees_with_the_simulator(tmp_path: Path):
    common = ["--trace", str(CONVERSATION), "--policies", "ttft,lmetric,unified", "--max-requests",
              "120", "--max-output-tokens", "64"]  # fmt: skip
    parser = build_parser()
    live_args = parser.parse_args(
        ["sweep", *common, "--sim-workers", "4", "--speedup", "3", "--prompt-mode", "text",
         "--sim-worker-args", "--kv-capacity-tokens 1000000", "--out", str(tmp_path / "live")]
    )  # fmt: skip
    trace = load_trace(CONVERSATION)
    live, outcomes = run_sweep(select(trace, live_args), live_args)
    sim_args = parser.parse_args(
        ["simulate", *common, "--workers", "4", "--kv-capacity-tokens", "1000000",
         "--out", str(tmp_path / "sim"), "--no-plots"]
    )  # fmt: skip
    offline = run_and_report(str(CONVERSATION), trace, sim_args, tmp_path / "sim", plots=False)
    for name in ("ttft", "lmetric", "unified"):
        got, want = live["policies"][name], offline["policies"][name]
        assert got["errors"] == 0 and got["requests"] == want["requests"] == 120
        assert abs(got["hit_rate"] - want["hit_rate"]) <= 0.05, name
        assert abs(got["ttft_p50"] / want["ttft_p50"] - 1) <= 0.25, name
        assert got["send_lag_p99"] < 1.0  # open loop (tight bound: test_replay.py)
    assert live["time_scale"] == 3.0
    assert all(o.worker_hit_rate is not None for o in outcomes)


def test_demo_offline_prints_the_table(tmp_path: Path, capsys):
    assert main(["demo", "--offline", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for policy in ("ttft", "lmetric", "load_only", "sticky", "unified", "capped"):
        assert f"| {policy} |" in out
    assert (tmp_path / "offline" / "results.json").exists()


@SLOW
def test_demo_live_runs_the_six_policies(tmp_path: Path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "live" / "results.json").read_text())
    assert list(doc["policies"]) == ["ttft", "lmetric", "load_only", "sticky", "unified", "capped"]
    for entry in doc["policies"].values():
        assert entry["errors"] == 0 and entry["requests"] > 0 and entry["hit_rate"] > 0
    # the workload rewards cache affinity: sticky beats the cache-blind load_only
    assert doc["policies"]["sticky"]["hit_rate"] > doc["policies"]["load_only"]["hit_rate"]

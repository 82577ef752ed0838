"""``simulate --requests-out``: one JSON line per request and policy, through the real CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from router.cli import main
from traces.commands.options import make_sim_picker
from traces.reports.requests_out import request_lines
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.trace.cap import build_capped_trace
from traces.trace.formats import load_trace

FIELDS = {"policy", "index", "request_id", "session_id", "turn", "status", "arrival_s", "ttft_s",
          "e2e_s", "input_length", "output_length", "cached_tokens", "estimated_tokens",
          "worker", "predicted_ttft_s"}  # fmt: skip


def test_every_request_of_every_policy(tmp_path: Path, data: Path) -> None:
    path = data / "mooncake_conversation_head200.jsonl"
    out = tmp_path / "requests.jsonl"
    argv = ["simulate", "--trace", str(path), "--workers", "2", "--policies", "ttft,capped",
            "--max-turns", "1", "--gpu-profile", "h100-llama8b", "--out", str(tmp_path),
            "--no-plots", "--no-hit-gap", "--requests-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["gpu_profile"] == "h100-llama8b"
    trace = load_trace(path)
    capped = build_capped_trace(trace, 1)
    by_policy = {p: [x for x in lines if x["policy"] == p] for p in ("ttft", "capped")}
    assert len(lines) == len(trace) + len(capped) == 200 + 193
    assert [x["index"] for x in by_policy["ttft"]] == list(range(200))
    # capped runs a subset of the same requests: their positions in the full trace
    assert [x["index"] for x in by_policy["capped"]] == [r.request_id for r in capped]
    for name, rows in by_policy.items():
        assert all(set(x) == FIELDS for x in rows)
        assert all(x["status"] == "ok" and x["worker"] in (0, 1) for x in rows)
        for x in rows:
            req = trace[x["index"]]
            assert (x["input_length"], x["session_id"], x["request_id"]) == (
                req.input_length, req.session_id, req.request_id,
            )  # fmt: skip
        entry = document["policies"][name]
        ttft = np.array([x["ttft_s"] for x in rows])
        assert np.percentile(ttft, 90) == pytest.approx(entry["ttft_p90"], abs=1e-5)
        cached = sum(x["cached_tokens"] for x in rows)
        assert cached / sum(x["input_length"] for x in rows) == pytest.approx(entry["hit_rate"])


def test_a_rejected_request_has_no_ttft(data: Path) -> None:
    """Flow control's refusals: status rejected, no TTFT or end-to-end time."""
    trace = load_trace(data / "mooncake_conversation_head200.jsonl")[:5]
    run = simulate(trace, make_sim_picker("ttft"), SimConfig(workers=1), "ttft")
    refused = dataclasses.replace(run, rejected=np.array([False, True, False, False, False]))
    lines = list(request_lines(refused, trace, [10, 11, 12, 13, 14]))
    assert [x["index"] for x in lines] == [10, 11, 12, 13, 14]
    assert lines[1]["status"] == "rejected" and lines[1]["ttft_s"] is None
    assert lines[0]["status"] == "ok" and lines[0]["ttft_s"] > 0


@pytest.mark.parametrize("gpu", ["h100-llama8b", "h200-llama8b"])
def test_the_routers_prediction_of_a_prompt_extending_a_cached_one(gpu: str) -> None:
    """With the workers' own profile, the router predicts what the worker model takes for
    the second of a pair (p cached tokens, s new ones), every point; flat, it misses."""
    from router.cache.cost_profile import resolve
    from traces.sim.worker_model import WorkerModelConfig
    from traces.trace.record import TraceRequest

    trace, arrival = [], 0.0
    for k, (p, s) in enumerate([(16_384, 2048), (65_536, 4096), (131_072, 2048), (8192, 8192)]):
        blocks = tuple(range(k * 1000, k * 1000 + (p + s) // 512))
        trace.append(TraceRequest(arrival, f"s{k}", 0, p, 1, blocks[: p // 512]))
        trace.append(TraceRequest(arrival + 30.0, f"s{k}", 1, p + s, 1, blocks))
        arrival += 60.0
    profile = resolve(gpu)
    worker = WorkerModelConfig(profile=profile)
    for router, within in ((profile, 0.02), (None, None)):
        config = SimConfig(workers=1, worker=worker, cost_profile=router)
        run = simulate(trace, make_sim_picker("ttft"), config, "ttft")
        ttft = run.first_token - run.arrival
        error = np.abs(run.predicted_ttft - ttft) / ttft
        summary = run.summary()
        assert summary["ttft_pred_requests"] == len(trace)
        assert summary["ttft_pred_mdape"] == pytest.approx(float(np.median(error)))
        if within is not None:
            assert error.max() < within
        else:  # the flat prior: 2k new tokens after 128k cached read under half the time
            assert error[5] > 0.5


def test_sweep_writes_every_live_request(tmp_path: Path, data: Path) -> None:
    # a short live sweep (2 sim workers at 40x): the same lines as simulate's, with the
    # worker's URL; capped's requests keep the full trace's positions
    path = data / "mooncake_conversation_head200.jsonl"
    out = tmp_path / "live.jsonl"
    argv = ["sweep", "--trace", str(path), "--max-requests", "140", "--policies", "ttft,capped",
            "--max-turns", "1", "--max-output-tokens", "8", "--sim-workers", "2",
            "--speedup", "40", "--out", str(tmp_path), "--requests-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    document = json.loads((tmp_path / "results.json").read_text())
    trace = load_trace(path)[:140]
    capped = build_capped_trace(trace, 1)
    by_policy = {p: [x for x in lines if x["policy"] == p] for p in ("ttft", "capped")}
    assert len(by_policy["ttft"]) == 140 and len(by_policy["capped"]) == len(capped) < 140
    assert [x["index"] for x in by_policy["ttft"]] == list(range(140))
    position = {id(r): i for i, r in enumerate(trace)}
    assert [x["index"] for x in by_policy["capped"]] == [position[id(r)] for r in capped]
    urls = set()
    for line in lines:
        assert set(line) == (FIELDS - {"predicted_ttft_s"}) | {"worker_url"}
        assert line["status"] == "ok" and line["estimated_tokens"] is None
        assert 0 < line["ttft_s"] <= line["e2e_s"]
        assert line["input_length"] == trace[line["index"]].input_length
        urls.add(line["worker_url"])
        assert line["worker"] in (0, 1)
    assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
    # the lines are the tables' requests: the same TTFT p90, in the modelled seconds
    for policy, entries in by_policy.items():
        ttft = np.array([x["ttft_s"] for x in entries])
        assert np.percentile(ttft, 90) == pytest.approx(
            document["policies"][policy]["ttft_p90"], rel=1e-4
        )
        cached = sum(x["cached_tokens"] for x in entries)
        prompt = sum(x["input_length"] for x in entries)
        assert cached / prompt == pytest.approx(document["policies"][policy]["hit_rate"])


def test_an_unanswered_live_request_keeps_its_line() -> None:
    from traces.live.replay import ReplayOutcome
    from traces.reports.requests_out import live_request_lines
    from traces.trace.record import TraceRequest
    from traces.trace.run import PolicyRun

    trace = [TraceRequest(float(i), f"s{i}", 1, 512, 4, (i,), request_id=i) for i in range(3)]
    one = np.array([1.0])
    run = PolicyRun(
        name="ttft", requests=1, worker=np.array([0]), arrival=one, first_token=one * 1.5,
        finish=one * 2, output_length=np.array([4]), input_length=np.array([512]),
        cached=np.array([0]), estimated=np.zeros(1), pick_us=np.zeros(0), branches={},
        inflight_t=np.zeros(0), inflight=np.zeros((0, 1), dtype=np.int32), wall_seconds=1.0,
    )  # fmt: skip
    outcome = ReplayOutcome(
        run, 2, ["http://w"], None, 0.0, np.zeros(1), served_by=["http://w"],
        status=np.array([429, 200, 0]), trace=trace, answered=np.array([1]),
    )  # fmt: skip
    lines = list(live_request_lines(outcome, [5, 6, 7]))
    assert [x["index"] for x in lines] == [5, 6, 7]
    assert [x["status"] for x in lines] == ["429", "ok", "error"]
    assert lines[1]["ttft_s"] == 0.5 and lines[1]["worker_url"] == "http://w"
    assert lines[0]["ttft_s"] is None and lines[0]["worker"] is None


def test_sweep_without_the_flag_writes_no_request_lines(tmp_path: Path, data: Path) -> None:
    # the default: the tables only
    path = data / "mooncake_conversation_head200.jsonl"
    argv = ["sweep", "--trace", str(path), "--max-requests", "10", "--policies", "ttft",
            "--max-output-tokens", "4", "--sim-workers", "1", "--speedup", "40",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((tmp_path / "results.json").read_text())["policies"]["ttft"]["requests"] == 10
    assert not list(tmp_path.rglob("*.jsonl"))

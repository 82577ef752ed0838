"""Disaggregated prefill/decode fleets in the offline simulator (traces/sim/simulator.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import traces
import traces.sim.simulator as simulator
from policies.registry import make_picker
from router.cli import main
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest

DATA = Path(traces.__file__).parent / "data"
CONVERSATION = DATA / "conversation_sample.jsonl"
WEKA = DATA / "weka_agentic_sample.jsonl"
PD = SimConfig(prefill_workers=2, decode_workers=2)


@pytest.fixture(scope="module")
def conversation():
    return load_trace(CONVERSATION)[:600]


@pytest.fixture(scope="module")
def weka():
    return load_trace(WEKA)


def spaced(prompts: list[tuple[int, ...]], gap: float = 30.0, output: int = 16) -> list:
    """One request per prompt (block keys), ``gap`` seconds apart: no queueing anywhere."""
    return [
        TraceRequest(
            arrival=k * gap,
            session_id=str(k),
            turn=1,
            input_length=512 * len(blocks),
            output_length=output,
            blocks=blocks,
        )
        for k, blocks in enumerate(prompts)
    ]


def test_every_request_is_prefilled_then_decoded(conversation, monkeypatch):
    """Each request goes once to a prefill worker's model (one output token) and, after its
    KV transfer, once to a decode worker's model (kv_transferred, its whole output); the
    TTFT is the decode worker's first token, a step after the transfer."""
    submitted: list[tuple[int, int, bool, int]] = []
    submit = simulator.WorkerModel.submit

    def spy(model, request, now):
        submitted.append((id(model), request.tag, request.kv_transferred, request.output_length))
        submit(model, request, now)

    monkeypatch.setattr(simulator.WorkerModel, "submit", spy)
    trace = conversation[:300]
    run = simulate(trace, make_picker("ttft"), PD)
    n = len(trace)
    prefill = [s for s in submitted if not s[2]]
    decode = [s for s in submitted if s[2]]
    assert sorted(s[1] for s in prefill) == list(range(n))
    assert sorted(s[1] for s in decode) == list(range(n))
    assert all(s[3] == 1 for s in prefill)
    assert [s[3] for s in sorted(decode, key=lambda s: s[1])] == [
        max(1, r.output_length) for r in trace
    ]
    prefill_models, decode_models = {s[0] for s in prefill}, {s[0] for s in decode}
    assert len(prefill_models) == 2 and len(decode_models) == 2
    assert not prefill_models & decode_models
    assert set(run.worker) == {0, 1} and set(run.decode_worker) == {0, 1}
    assert sum(run.branches.values()) == n and sum(run.decode_branches.values()) == n
    assert run.inflight.shape[1] == 4
    # prefill, transfer, one decode step at least, then the output
    step = min(PD.worker.decode_step_s(1), PD.worker.prefill_step_s)  # the cheapest step
    assert (run.prefill_done >= run.arrival).all()
    assert (run.first_token >= run.prefill_done + run.transfer_s + step - 1e-9).all()
    assert (run.finish >= run.first_token).all()
    expected = PD.kv_transfer_latency_s + run.transferred * PD.kv_bytes_per_token / 25e9
    assert np.allclose(run.transfer_s, expected)
    assert ((run.transferred >= 0) & (run.transferred <= run.input_length)).all()
    s = run.summary()
    assert s["prefill_workers"] == 2 and s["decode_workers"] == 2
    assert s["prefill_hit_rate"] == s["hit_rate"] > 0
    assert 0 < s["transfer_p50"] <= s["transfer_p90"]
    assert s["ttft_p50"] > s["prefill_ttft_p50"]
    assert 0 < s["tpot_p50"] <= s["tpot_p90"]


def test_cache_aware_prefill_picks_hit_more_than_round_robin(weka):
    """Multi-turn agentic sessions: the default picker keeps a session's turns on the prefill
    worker that holds its prefix; round-robin scatters them."""
    config = replace(PD, speedup=0.5, worker=WorkerModelConfig(kv_capacity_tokens=1_000_000))
    ttft = simulate(weka, make_picker("ttft"), config).summary()
    rr = simulate(weka, make_picker("round_robin"), config).summary()
    assert ttft["prefill_hit_rate"] > 1.5 * rr["prefill_hit_rate"]
    assert ttft["ttft_p90"] < rr["ttft_p90"]


def test_decode_load_balances_the_decode_workers(conversation):
    for policy in ("ttft", "round_robin"):
        run = simulate(conversation, make_picker(policy), PD)
        assert run.summary()["decode_imbalance"] <= 1.2
        assert set(run.decode_branches) <= {"decode_load", "decode_tie", "decode_full"}


def test_a_slower_transfer_delays_the_first_token_by_its_time():
    prompts = [tuple(range(100 * k, 100 * k + 16)) for k in range(6)]  # 8192 tokens each
    trace = spaced(prompts)
    fast = simulate(trace, make_picker("ttft"), PD)
    slow = simulate(trace, make_picker("ttft"), replace(PD, kv_bytes_per_token=100 * 131_072))
    added = slow.transfer_s - fast.transfer_s
    assert np.allclose(added, 8192 * 99 * 131_072 / 25e9)  # about 4.3 s
    ttft_fast, ttft_slow = fast.first_token - fast.arrival, slow.first_token - slow.arrival
    assert np.allclose(ttft_slow - ttft_fast, added, atol=1e-6)
    # the decode worker's own output pace is the same
    assert np.allclose(slow.finish - slow.first_token, fast.finish - fast.first_token)


def test_a_prefix_the_decode_worker_holds_is_not_transferred():
    """One decode worker: a second request with the same prompt finds it in that worker's
    cache (its blocks entered it), so only the latency is paid."""
    trace = spaced([tuple(range(4)), tuple(range(4)), (0, 1, 2, 3, 99, 100)])
    config = SimConfig(prefill_workers=1, decode_workers=1)
    run = simulate(trace, make_picker("round_robin"), config)
    assert run.transferred.tolist() == [2048, 0, 1024]
    assert run.transfer_s[1] == pytest.approx(config.kv_transfer_latency_s)
    assert run.cached.tolist() == [0, 2048, 2048]  # the prefill worker's true hits


def test_aggregated_runs_ignore_the_disaggregation_settings(conversation):
    base = SimConfig(workers=4)
    other = replace(
        base,
        decode_policy="random",
        kv_transfer_latency_s=5.0,
        kv_transfer_gbps=0.001,
        kv_bytes_per_token=10**9,
    )
    a = simulate(conversation, make_picker("ttft"), base)
    b = simulate(conversation, make_picker("ttft"), other)
    for key in ("worker", "arrival", "first_token", "finish", "cached", "estimated", "inflight"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert a.decode_worker is None and "prefill_hit_rate" not in a.summary()
    assert a.summary()["tpot_p50"] <= a.summary()["tpot_p90"]


def test_a_fleet_needs_both_sides():
    with pytest.raises(ValueError, match="both"):
        SimConfig(prefill_workers=2)
    with pytest.raises(ValueError, match="bandwidth"):
        SimConfig(prefill_workers=1, decode_workers=1, kv_transfer_gbps=0)
    assert SimConfig(workers=3, prefill_workers=1, decode_workers=2).fleet_size == 3
    assert SimConfig(workers=3).fleet_size == 3


def test_simulate_command_runs_a_disaggregated_fleet(tmp_path: Path, capsys):
    out = tmp_path / "pd"
    code = main(
        [
            "simulate", "--trace", str(CONVERSATION), "--max-requests", "200",
            "--prefill-workers", "3", "--decode-workers", "1", "--policies", "ttft,round_robin",
            "--kv-transfer-latency-ms", "5", "--kv-transfer-gbps", "50",
            "--kv-bytes-per-token", "65536", "--out", str(out), "--no-plots",
        ]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["workers"] == 4
    assert doc["disaggregated"] == {
        "prefill_workers": 3,
        "decode_workers": 1,
        "decode_policy": "decode_load",
        "kv_transfer_latency_s": 0.005,
        "kv_transfer_gbps": 50.0,
        "kv_bytes_per_token": 65536,
    }
    for entry in doc["policies"].values():
        assert entry["decode_imbalance"] == 1.0
        assert entry["transfer_p50"] >= 0.005
        assert sum(entry["decode_branches"].values()) == 200
    printed = capsys.readouterr().out
    assert "| prefill hit rate | decode max/mean |" in printed
    assert "decode max/mean" in (out / "results.md").read_text()
    code = main(["simulate", "--trace", str(CONVERSATION), "--decode-workers", "2",
                 "--out", str(tmp_path / "bad"), "--no-plots"])  # fmt: skip
    assert code == 2
    assert "--prefill-workers" in capsys.readouterr().err

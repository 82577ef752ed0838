"""bench/models/lora_partition.py's partition picker: a new session goes to its adapter's home."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("models/lora_partition")


def test_strict_partition_sends_each_new_session_to_its_adapters_home(bench) -> None:
    base = load_trace(str(ROOT / "traces" / "data" / "conversation_sample.jsonl"))[:300]
    trace = bench.with_adapters(base, 8)
    config = SimConfig(workers=4, worker=WorkerModelConfig(max_loras=2), speedup=0.5)
    run = simulate(trace, bench.PartitionPicker(), config, "partition")
    seen = set()
    for i, req in enumerate(trace):
        if req.session_id not in seen:
            seen.add(req.session_id)
            assert run.worker[i] == int(req.model.rsplit("-", 1)[1]) % 4
    assert run.branches.get("partition", 0) == len(seen)
    # 8 adapters over 4 workers of 2 slots: a worker's new sessions never need a third adapter
    ttft = simulate(trace, bench.TTFTPicker(), config, "ttft")
    assert run.lora_swaps < ttft.lora_swaps


def test_gpu_profile_prices_the_workers_and_is_recorded(bench, tmp_path) -> None:
    """``--gpu-profile``: flat and the measured profile give different TTFTs, each recorded."""
    got = {}
    for profile in ("flat", "h100-llama8b"):
        out = tmp_path / f"{profile}.json"
        argv = ["--traces", "conversation_sample", "--requests", "300", "--adapters", "8"]
        argv += ["--speedups", "1"]
        argv += ["--lora-load-ms", "50", "--margins", "0.5", "--gpu-profile", profile]
        assert bench.main([*argv, "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["config"]["gpu_profile"] == profile
        got[profile] = {r["policy"]: r["ttft_p90"] for r in doc["rows"]}
    assert set(got["flat"]) == {"round_robin", "ttft", "partition", "partition<=0.5"}
    assert got["flat"] != got["h100-llama8b"]

"""The simulator with CPU KV tiers (issue 43): the router reads them on, off or exactly."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import traces
from policies.registry import make_picker
from router.cache.cost_profile import resolve
from router.cli import main
from traces.commands import simulate as simulate_cmd
from traces.commands.options import config_from_args
from traces.sim.bounds import trace_bounds
from traces.sim.config import SimConfig
from traces.sim.simulator import make_worker_states, simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest

SAMPLE = Path(traces.__file__).parent / "data" / "weka_agentic_sample.jsonl"
GPU = 131_072
# 2 workers with small GPU caches (the sample's prompts reach 256k tokens: eviction is
# common) and a CPU tier of 4x; arrivals stretched 10x so that queues stay short enough for
# a booking's view of the tiers to hold until admission (and no dispatch hold, which delays
# admission as a queue does: with it the CPU split errs 5-6%). The context is set past the GPU
# KV (sim-worker --max-model-len), else the longest prompts are refused as vLLM refuses them
# the flat model: the shadows' exactness below was measured on its timings
WORKER = WorkerModelConfig(profile=None, kv_capacity_tokens=GPU, cpu_kv_capacity_tokens=4 * GPU)
CONFIG = SimConfig(
    workers=2, worker=WORKER, speedup=0.1, max_model_len=5 * GPU, cost_profile=None,
    dispatch_hold_tokens=0,
)  # fmt: skip
TIER_KEYS = {"gpu_hit_rate", "cpu_hit_rate", "shadow_abs_error_gpu", "shadow_abs_error_cpu"}


@pytest.fixture(scope="module")
def sample():
    return load_trace(SAMPLE)[:60]


@pytest.fixture(scope="module")
def runs(sample):
    return {
        tiers: simulate(sample, make_picker("ttft"), replace(CONFIG, router_tiers=tiers))
        for tiers in ("off", "on", "exact")
    }


def test_every_request_finishes_and_tier_keys_are_reported(sample, runs):
    for run in runs.values():
        assert run.requests == len(sample) == 60
        assert np.all(run.finish >= run.first_token) and np.all(run.first_token > 0)
        summary = run.summary()
        assert set(summary) >= TIER_KEYS
        assert summary["gpu_hit_rate"] + summary["cpu_hit_rate"] == pytest.approx(
            summary["hit_rate"]
        )
        assert summary["cpu_hit_rate"] > 0.02  # evicted prefixes came back from the tier
        assert np.all(run.cpu_cached <= run.cached)


def test_tier_aware_router_estimates_the_cpu_part(runs):
    on, off, exact = (runs[k].summary() for k in ("on", "off", "exact"))
    assert runs["on"].cpu_estimated.sum() > 0
    assert on["shadow_abs_error_cpu"] < 0.05
    assert on["shadow_abs_error_cpu"] < on["cpu_hit_rate"]
    assert exact["shadow_abs_error_cpu"] == 0.0  # it reads the models at admission's state
    # off: the router has no CPU estimate, so its CPU error is the whole CPU hit
    assert not runs["off"].cpu_estimated.any()
    assert off["shadow_abs_error_cpu"] == pytest.approx(off["cpu_hit_rate"])


def test_a_shadow_that_evicts_as_the_worker_splits_the_tiers_right(sample, runs):
    """The worker model's GPU radix cache evicts whole leaves; the radix shadow does too, the
    block LRU evicts block by block, so it believes in GPU blocks the worker has moved to
    its CPU tier (the total of both tiers is the same)."""
    radix = simulate(
        sample, make_picker("ttft"), replace(CONFIG, router_tiers="on", shadow="radix")
    ).summary()
    blocks = runs["on"].summary()
    assert radix["shadow_abs_error_cpu"] < 0.002
    assert radix["shadow_abs_error_cpu"] < blocks["shadow_abs_error_cpu"] / 5
    assert radix["hit_rate"] == pytest.approx(blocks["hit_rate"], abs=0.02)


def test_router_tier_states(sample):
    states = make_worker_states(CONFIG)
    assert all(s.tiered and s.cpu.capacity_blocks == 4 * GPU // 512 for s in states)
    assert states[0].kv_load_s_per_token == pytest.approx(WORKER.load_s(1))
    # told a profile, the router prices a hit at the profile's bulk rate, as serve does (not
    # at a one-token piece's rate: 2.8x that on h100-llama8b)
    h100 = resolve("h100-llama8b")
    priced = make_worker_states(replace(CONFIG, cost_profile=h100))[0].kv_load_s_per_token
    assert priced == pytest.approx(h100.load_s(4096) / 4096)
    assert priced < h100.load_s(1) / 2
    off = make_worker_states(replace(CONFIG, router_tiers="off"))
    assert all(s.cpu is None and not s.tiered for s in off)
    untiered = make_worker_states(replace(CONFIG, worker=replace(WORKER, cpu_kv_capacity_tokens=0)))
    assert all(s.cpu is None and s.kv_load_s_per_token == 0.0 for s in untiered)
    with pytest.raises(ValueError):
        SimConfig(router_tiers="maybe")


def test_without_a_tier_no_tier_summary(sample):
    run = simulate(
        sample[:20],
        make_picker("ttft"),
        replace(CONFIG, worker=replace(WORKER, cpu_kv_capacity_tokens=0)),
    )
    assert run.cpu_cached is None and not TIER_KEYS & set(run.summary())


def _session(n_turns: int, blocks_per_turn: int, start: float, base: int) -> list[TraceRequest]:
    out, blocks = [], ()
    for t in range(n_turns):
        blocks = blocks + tuple(range(base + t * blocks_per_turn, base + (t + 1) * blocks_per_turn))
        out.append(TraceRequest(start + 30.0 * t, f"s{base}", t + 1, len(blocks) * 512, 16, blocks))
    return out


def test_hand_made_trace_one_worker_reloads_evicted_sessions():
    # one worker of 32 GPU blocks: two sessions of 20-block turns push each other out
    trace = sorted(
        _session(3, 20, 0.0, 1000) + _session(3, 20, 15.0, 5000), key=lambda r: r.arrival
    )
    trace = [replace(r, request_id=i) for i, r in enumerate(trace)]
    worker = WorkerModelConfig(kv_capacity_tokens=32 * 512, cpu_kv_capacity_tokens=256 * 512)
    config = SimConfig(workers=1, worker=worker, max_model_len=288 * 512)  # past the GPU KV
    run = simulate(trace, make_picker("ttft"), config)
    assert run.requests == 6
    later = [i for i, r in enumerate(trace) if r.turn > 1]
    # each later turn finds its previous turn's 20 (then 40) blocks in the CPU tier only
    assert list(run.cpu_cached[later]) == [20 * 512, 20 * 512, 40 * 512, 40 * 512]
    assert list(run.cached) == list(run.cpu_cached)
    # the router's estimate of both tiers is right; its split follows its GPU shadow, which
    # evicts block by block where the model's radix cache drops whole nodes
    assert list(run.estimated) == list(run.cached)
    assert np.all(run.cpu_estimated[later] > 0)
    assert np.all(run.cpu_estimated <= run.cpu_cached)
    exact = simulate(trace, make_picker("ttft"), replace(config, router_tiers="exact"))
    assert list(exact.cpu_estimated) == list(exact.cpu_cached) == list(run.cpu_cached)
    blind_worker = replace(worker, cpu_kv_capacity_tokens=0)
    blind = simulate(trace, make_picker("ttft"), replace(config, worker=blind_worker))
    assert not blind.cached.any()
    ttft = run.first_token - run.arrival
    blind_ttft = blind.first_token - blind.arrival
    assert np.all(ttft[later] < blind_ttft[later])


def test_bounds_pool_the_cpu_tiers(sample):
    with_tier = trace_bounds(sample, 2, WORKER)
    without = trace_bounds(sample, 2, replace(WORKER, cpu_kv_capacity_tokens=0))
    assert with_tier.pooled_kv_tokens == 2 * (GPU + 4 * GPU)
    assert without.pooled_kv_tokens == 2 * GPU
    assert with_tier.hit_ceiling >= without.hit_ceiling


def test_flags_reach_the_config():
    parser = argparse.ArgumentParser()
    simulate_cmd.add_parser(parser.add_subparsers())
    argv = ["simulate", "--trace", str(SAMPLE), "--cpu-kv-capacity-tokens", "4096",
            "--kv-load-gbps", "8", "--router-tiers", "exact", "--gpu-profile", "flat"]  # fmt: skip
    config = config_from_args(parser.parse_args(argv))
    assert config.router_tiers == "exact"
    assert (config.worker.cpu_kv_capacity_tokens, config.worker.kv_load_gbps) == (4096, 8.0)
    default = config_from_args(parser.parse_args(["simulate", "--trace", "x"]))
    assert default.router_tiers == "on" and default.worker.cpu_kv_capacity_tokens == 0


def test_simulate_command_with_a_tier(tmp_path: Path):
    out = tmp_path / "sim"
    code = main(
        [
            "simulate", "--trace", str(SAMPLE), "--max-requests", "60", "--workers", "2",
            "--policies", "ttft,tiered", "--kv-capacity-tokens", str(GPU),
            "--cpu-kv-capacity-tokens", str(4 * GPU), "--router-tiers", "off",
            "--speedup", "0.1", "--out", str(out), "--no-plots",
        ]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["policies"]) == {"ttft", "tiered"}
    for entry in doc["policies"].values():
        assert entry["requests"] == 60 and set(entry) >= TIER_KEYS
        assert entry["cpu_hit_rate"] > 0
        # off: no CPU estimates at all
        assert entry["shadow_abs_error_cpu"] == pytest.approx(entry["cpu_hit_rate"])
    assert doc["bounds"]["pooled_kv_tokens"] == 2 * 5 * GPU

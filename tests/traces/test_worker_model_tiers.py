"""The worker model's CPU KV tier (issue 43) against hand-computed timelines."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from traces.sim.worker_model import (
    SimRequest,
    WorkerModel,
    WorkerModelConfig,
    add_model_options,
    model_argv,
    model_config_from_args,
)
from traces.sim_worker import server

sys.path.insert(0, str(Path(__file__).parent))

from worker_model_support import Driver, req

B = 512
# prefill: 1024 tokens/s (a 512-token block in 0.5 s); loads: 1e6 bytes a token at 4 GB/s,
# so one token loads in 0.25 ms and a block in 0.128 s
CFG = WorkerModelConfig(
    profile=None,
    kv_capacity_tokens=B * 5,
    chunk_tokens=1024,
    prefill_tokens_per_s=1024.0,
    step_overhead_s=0.010,
    decode_s_per_seq=0.001,
    cpu_kv_capacity_tokens=B * 16,
    kv_load_gbps=4.0,
    kv_bytes_per_token=1_000_000,
)
NO_TIER = replace(CFG, cpu_kv_capacity_tokens=0)


def evicted_from_gpu(d: Driver) -> None:
    """a (blocks 1-3) runs, then b (the GPU's capacity less one block, plus one for its
    output) pushes it out of the GPU cache; both stay in the CPU tier."""
    fill = tuple(range(10, 10 + d.model.config.capacity_blocks - 1))
    d.run([(0.0, req("a", (1, 2, 3), 3 * B)), (10.0, req("b", fill, len(fill) * B))])
    assert d.model.cached_prefix_blocks((1, 2, 3)) == 0
    assert d.model.cpu_prefix_blocks((1, 2, 3, 4), 0) == 3


def test_config_load_time_and_validation():
    cfg = WorkerModelConfig(profile=None, kv_bytes_per_token=131_072, kv_load_gbps=20.0)
    assert cfg.load_s(1000) == pytest.approx(1000 * 131_072 / 20e9)
    assert CFG.load_s(512) == pytest.approx(0.128)
    assert CFG.cpu_capacity_blocks == 16 and NO_TIER.cpu_capacity_blocks == 0
    assert WorkerModelConfig().cpu_kv_capacity_tokens == 0  # off by default
    with pytest.raises(ValueError):
        WorkerModelConfig(cpu_kv_capacity_tokens=-1)
    with pytest.raises(ValueError):
        WorkerModelConfig(kv_load_gbps=0.0)
    with pytest.raises(ValueError):
        WorkerModelConfig(kv_bytes_per_token=-1)


def test_write_through_store_at_first_token():
    d = Driver(CFG)
    a = req("a", (1, 2, 3), 3 * B, output=5)
    d.run([(0.0, a)], until=1.0)  # mid prefill (first token at 1.52)
    assert len(d.model.cpu) == 0 and d.model.stats.cpu_stored_blocks == 0
    d.run([], until=1.52)
    assert d.first["a"] == pytest.approx(1.52)
    assert "a" not in d.done  # still decoding, yet its blocks are stored already
    assert all(b in d.model.cpu for b in (1, 2, 3))
    assert d.model.stats.cpu_stored_blocks == 3
    d.run([(5.0, req("a2", (1, 2, 3), 3 * B))])  # a GPU hit: stores nothing new
    assert d.model.stats.cpu_stored_blocks == 3 and d.model.stats.cpu_loads == 0


def test_prefix_evicted_from_gpu_is_loaded_from_cpu():
    d = Driver(CFG)
    evicted_from_gpu(d)
    c = req("c", (1, 2, 3, 4), 4 * B)
    d.run([(20.0, c)])
    assert (c.cached_tokens, c.cpu_cached_tokens) == (3 * B, 3 * B)
    load = 3 * B * CFG.kv_bytes_per_token / (CFG.kv_load_gbps * 1e9)
    assert load == pytest.approx(0.384)
    assert c.ready_at == pytest.approx(20.0 + load)
    # load, then one step with the 512 uncached tokens
    prefill = B / CFG.prefill_tokens_per_s
    assert d.first["c"] == pytest.approx(20.0 + load + CFG.step_overhead_s + prefill)
    stats = d.model.stats
    assert (stats.cached_tokens, stats.cpu_cached_tokens, stats.cpu_loads) == (3 * B, 3 * B, 1)
    assert c.loading == () and d.model.cpu.pinned_blocks == 0  # unpinned once loaded
    assert d.model.cached_prefix_blocks((1, 2, 3, 4)) == 4  # back on the GPU


def test_gpu_hit_then_cpu_continuation():
    d = Driver(replace(CFG, kv_capacity_tokens=B * 8))
    d.run([(0.0, req("a", (1, 2, 3), 3 * B))])
    d.model.cache.reset()  # the GPU lost the whole prefix: make it hold block 1 only
    d.run([(5.0, req("p", (1,), B))])
    assert d.model.cached_prefix_blocks((1, 2, 3)) == 1
    c = req("c", (1, 2, 3, 4), 4 * B - 100)  # the last block is partial
    d.run([(10.0, c)])
    assert (c.cached_tokens, c.cpu_cached_tokens) == (3 * B, 2 * B)
    load = CFG.load_s(2 * B)
    expected = 10.0 + load + CFG.step_overhead_s + (B - 100) / CFG.prefill_tokens_per_s
    assert d.first["c"] == pytest.approx(expected)


def test_whole_prompt_in_cpu_tier_needs_no_prefill():
    d = Driver(CFG)
    evicted_from_gpu(d)
    c = req("c", (1, 2, 3), 3 * B - 10)
    d.run([(20.0, c)])
    assert (c.cached_tokens, c.cpu_cached_tokens) == (3 * B - 10, 3 * B - 10)
    assert d.first["c"] == pytest.approx(20.0 + CFG.load_s(3 * B) + CFG.step_overhead_s)


def test_two_loads_queue_on_the_link():
    cfg = replace(CFG, kv_capacity_tokens=B * 9)
    d = Driver(cfg)
    d.run(
        [
            (0.0, req("a", (1, 2, 3), 3 * B)),
            (5.0, req("x", (20, 21), 2 * B)),
            (10.0, req("fill", tuple(range(30, 38)), 8 * B)),  # evicts a's and x's blocks
        ]
    )
    assert d.model.cached_prefix_blocks((1,)) == d.model.cached_prefix_blocks((20,)) == 0
    c1, c2 = req("c1", (1, 2, 3, 4), 4 * B), req("c2", (20, 21, 22), 3 * B)
    d.run([(100.0, c1), (100.0, c2)])
    first_load, second_load = cfg.load_s(3 * B), cfg.load_s(2 * B)
    assert c1.ready_at == pytest.approx(100.0 + first_load)
    assert c2.ready_at == pytest.approx(100.0 + first_load + second_load)  # after c1's
    assert d.model.link_free_at == pytest.approx(c2.ready_at)
    step = cfg.step_overhead_s + B / cfg.prefill_tokens_per_s
    assert d.first["c1"] == pytest.approx(c1.ready_at + step)
    # c2's load ends during c1's prefill step: it prefills in the step after
    assert c1.ready_at < c2.ready_at < d.first["c1"]
    assert d.first["c2"] == pytest.approx(d.first["c1"] + step)
    assert d.model.stats.cpu_loads == 2
    assert d.model.stats.cpu_cached_tokens == 5 * B


SLOW = replace(CFG, kv_capacity_tokens=B * 8, kv_load_gbps=1.0)  # a block loads in 0.512 s


def on_grid(t: float, origin: float, step: float) -> bool:
    k = (t - origin) / step
    return abs(k - round(k)) < 1e-6


def test_decode_batch_runs_on_while_a_load_runs():
    d = Driver(SLOW)
    evicted_from_gpu(d)
    x = req("x", (50,), B, output=21)
    c = req("c", (1, 2, 3, 4), 4 * B)
    d.run([(20.0, x), (20.6, c)])
    x_first = 20.0 + SLOW.step_overhead_s + B / SLOW.prefill_tokens_per_s
    step = SLOW.decode_step_s(1)
    assert d.first["x"] == pytest.approx(x_first)
    # 20 decode steps of one sequence, unaffected by c's load (c is not running yet)
    assert d.done["x"] == pytest.approx(x_first + 20 * step)
    assert d.done["x"] < c.ready_at
    # c was admitted (its load began) at the first of x's step boundaries after its arrival
    admitted = c.ready_at - SLOW.load_s(3 * B)
    assert 20.6 <= admitted < 20.6 + step and on_grid(admitted, x_first, step)
    # then waits out its load only (x is done by then: a step of its own prefill)
    assert d.first["c"] == pytest.approx(c.ready_at + SLOW.step_overhead_s + B / 1024.0)


def test_load_ends_inside_a_decode_stretch_joins_at_the_next_boundary():
    d = Driver(SLOW)
    evicted_from_gpu(d)
    x = req("x", (50,), B, output=1001)  # decodes for 11 s
    c = req("c", (1, 2, 3, 4), 4 * B)
    d.run([(20.0, x), (20.6, c)])
    x_first = 20.0 + SLOW.step_overhead_s + B / SLOW.prefill_tokens_per_s
    step = SLOW.decode_step_s(1)
    prefill_step = step + B / SLOW.prefill_tokens_per_s  # c's prefill beside x's decode
    start = d.first["c"] - prefill_step
    assert on_grid(start, x_first, step)  # c's prefill step starts on x's step grid
    assert c.ready_at - 1e-9 <= start < c.ready_at + step  # the first boundary after the load
    # x lost no step to c's load: 1000 tokens, one of them in c's (longer) prefill step
    assert d.done["x"] == pytest.approx(x_first + 999 * step + prefill_step)


def test_arrival_while_only_waiting_for_a_load_is_admitted_at_once():
    cfg = replace(CFG, kv_capacity_tokens=B * 8, kv_load_gbps=1.0)  # a 1.536 s load
    d = Driver(cfg)
    evicted_from_gpu(d)
    c = req("c", (1, 2, 3, 4), 4 * B)
    e = req("e", (60,), B)
    d.run([(20.0, c), (20.2, e)])
    assert d.first["e"] == pytest.approx(20.2 + CFG.step_overhead_s + B / 1024.0)
    assert d.first["e"] < c.ready_at == pytest.approx(20.0 + cfg.load_s(3 * B))
    assert d.first["c"] == pytest.approx(c.ready_at + CFG.step_overhead_s + B / 1024.0)


def test_cpu_lru_evicts_least_recent_tail_first_with_events():
    cfg = replace(CFG, kv_capacity_tokens=B * 20, cpu_kv_capacity_tokens=B * 4)
    d = Driver(cfg, events=True)
    d.run([(0.0, req("a", (1, 2, 3), 3 * B)), (10.0, req("b", (10, 11, 12), 3 * B))])
    # a's blocks: head most recent; b's three push out a's two oldest (its tail)
    assert d.model.cpu.lru_order() == [1, 12, 11, 10]
    cpu_events = [
        (e["type"], e["block_hashes"]) for e in d.model.take_events() if e.get("medium") == "CPU"
    ]
    assert cpu_events == [
        ("BlockStored", [1, 2, 3]),
        ("BlockStored", [10, 11, 12]),
        ("BlockRemoved", [3]),
        ("BlockRemoved", [2]),
    ]
    assert d.model.cpu_prefix_blocks((1, 2, 3), 0) == 1  # only the head is left to load


def test_events_order_gpu_store_then_cpu_store_then_cpu_removal():
    cfg = replace(CFG, kv_capacity_tokens=B * 20, cpu_kv_capacity_tokens=B * 2)
    d = Driver(cfg, events=True)
    d.run([(0.0, req("a", (1, 2, 3), 3 * B))])
    events = [(e["type"], e.get("medium"), e["block_hashes"]) for e in d.model.take_events()]
    assert events == [
        ("BlockStored", "GPU", [1, 2, 3]),  # at admission
        ("BlockStored", "CPU", [1, 2, 3]),  # at first token
        ("BlockRemoved", "CPU", [3]),  # two blocks fit: the tail goes
    ]
    assert d.model.take_events() == []


def test_pinned_blocks_stay_in_cpu_tier_while_loading():
    cfg = replace(CFG, kv_capacity_tokens=B * 20, cpu_kv_capacity_tokens=B * 4, kv_load_gbps=1.0)
    d = Driver(cfg, events=True)
    d.model.cpu.insert([1, 2, 3])  # the tier holds a prefix the GPU does not
    c = req("c", (1, 2, 3, 4), 4 * B)
    e = req("e", (60, 61), 2 * B)  # stores two blocks while c's load runs
    d.run([(0.0, c), (0.1, e)], until=1.2)
    assert d.first["e"] == pytest.approx(0.1 + CFG.step_overhead_s + 1.0)
    assert d.first["e"] < c.ready_at == pytest.approx(cfg.load_s(3 * B)) == pytest.approx(1.536)
    assert d.model.cpu.pinned_blocks == 3
    # 5 blocks for 4 places: only an unpinned one could go (e's tail)
    assert all(b in d.model.cpu for b in (1, 2, 3))
    assert 60 in d.model.cpu and 61 not in d.model.cpu
    d.run([])
    assert d.model.cpu.pinned_blocks == 0
    # c stored 1-4 at its first token: 60, now least recent, went
    assert d.model.cpu.lru_order() == [4, 3, 2, 1]
    removed = [
        e["block_hashes"]
        for e in d.model.take_events()
        if e["type"] == "BlockRemoved" and e["medium"] == "CPU"
    ]
    assert removed == [[61], [60]]


def test_kv_transferred_request_neither_loads_nor_stores():
    d = Driver(CFG)
    evicted_from_gpu(d)
    stored = d.model.stats.cpu_stored_blocks
    t = SimRequest((1, 2, 3, 99), 4 * B, 2, tag="t", kv_transferred=True)
    d.run([(20.0, t)])
    assert t.cpu_cached_tokens == 0 and d.model.stats.cpu_loads == 0
    assert d.first["t"] == pytest.approx(20.0 + CFG.step_overhead_s)
    assert 99 not in d.model.cpu and d.model.stats.cpu_stored_blocks == stored


def test_reset_cache_clears_both_tiers():
    d = Driver(CFG, events=True)
    evicted_from_gpu(d)
    d.model.take_events()
    d.model.reset_cache()
    assert len(d.model.cpu) == 0 and d.model.cache.total_tokens == 0
    assert d.model.take_events() == [{"type": "AllBlocksCleared"}]
    c = req("c", (1, 2, 3, 4), 4 * B)
    d.run([(20.0, c)])
    assert c.cached_tokens == 0 and c.cpu_cached_tokens == 0


def _timeline(config: WorkerModelConfig) -> tuple[dict, dict, WorkerModel]:
    d = Driver(config)
    d.run(
        [
            (0.0, req("a", (1, 2, 3), 3 * B, 4)),
            (0.3, req("x", (50,), B, 30)),
            (10.0, req("b", (10, 11, 12), 3 * B, 2)),
            (20.0, req("c", (1, 2, 3, 4), 4 * B, 3)),
            (20.1, req("e", (60, 61), 2 * B - 7, 5)),
        ]
    )
    return d.first, d.done, d.model


def test_no_tier_is_the_old_behaviour():
    base = NO_TIER
    first, done, model = _timeline(base)
    assert model.cpu is None and model.cpu_prefix_blocks((1, 2, 3), 0) == 0
    stats = model.stats
    assert (stats.cpu_cached_tokens, stats.cpu_loads, stats.cpu_stored_blocks) == (0, 0, 0)
    # the bandwidth fields change nothing without a tier
    other = replace(base, kv_load_gbps=0.001, kv_bytes_per_token=7)
    assert _timeline(other)[:2] == (first, done)
    # c recomputes its evicted prefix: admitted at once (nothing runs), 2048 tokens
    assert first["c"] == pytest.approx(20.0 + 2 * (0.010 + 1.0))
    tiered_first, _, _ = _timeline(CFG)
    assert tiered_first["c"] < first["c"]  # while the tier loads it


def test_flags_round_trip_through_sim_worker_parser():
    parser = argparse.ArgumentParser()
    server.add_parser(parser.add_subparsers())
    config = replace(
        WorkerModelConfig(profile=None),
        cpu_kv_capacity_tokens=4 * 262_144,
        kv_load_gbps=12.5,
        kv_bytes_per_token=65_536,
    )
    args = parser.parse_args(["sim-worker", *model_argv(config)])
    assert args.cpu_kv_capacity_tokens == 4 * 262_144 and args.kv_load_gbps == 12.5
    assert model_config_from_args(args) == config
    defaults = parser.parse_args(["sim-worker"])
    # the command's default: the measured H100 profile
    assert model_config_from_args(defaults) == WorkerModelConfig()


def test_model_options_without_bytes_flag_default_bytes_per_token():
    p = argparse.ArgumentParser()
    add_model_options(p, "kv")
    args = p.parse_args(
        ["--cpu-kv-capacity-tokens", "2048", "--kv-load-gbps", "3", "--gpu-profile", "flat"]
    )
    config = model_config_from_args(args)
    assert config.cpu_kv_capacity_tokens == 2048 and config.kv_load_gbps == 3.0
    assert config.kv_bytes_per_token == WorkerModelConfig().kv_bytes_per_token

"""The worker model against hand-computed timelines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from traces.sim.worker_model import SimRequest, WorkerModel, WorkerModelConfig

sys.path.insert(0, str(Path(__file__).parent))

from worker_model_support import Driver, req

CFG = WorkerModelConfig(
    profile=None,
    kv_capacity_tokens=512 * 20,
    chunk_tokens=1024,
    prefill_tokens_per_s=1024.0,  # one chunk per second
    step_overhead_s=0.010,
    decode_s_per_seq=0.001,
)


def test_single_request_timeline():
    d = Driver(CFG)
    d.run([(0.0, req("a", (1, 2), 1024, 5))])
    # one prefill step: overhead + 0 decoding seqs + 1024 tokens at 1024 tok/s
    assert d.first["a"] == pytest.approx(1.010)
    # then 4 decode steps of 10 ms + 1 ms
    assert d.done["a"] == pytest.approx(1.010 + 4 * 0.011)
    assert d.model.cache.total_tokens == 4  # two blocks stay cached (2 pseudo-tokens each)
    assert d.model.cache.protected_tokens == 0 and d.model.extra_blocks == 0


def test_cached_prefix_skips_prefill_and_is_reported():
    d = Driver(CFG)
    d.run([(0.0, req("a", (1, 2), 1024, 1)), (5.0, req("b", (1, 2, 3), 1536, 1))])
    assert d.model.stats.cached_tokens == 1024
    assert d.first["b"] == pytest.approx(5.0 + 0.010 + 512 / 1024)
    assert d.model.stats.prompt_tokens == 1024 + 1536


def test_long_prefill_is_chunked_and_decode_runs_beside_it():
    d = Driver(CFG)
    d.run([(0.0, req("a", (1,), 512, 3)), (0.5, req("b", tuple(range(10, 14)), 2048, 1))])
    # a: prefill 0.51 s; b arrives during it and is admitted at 0.51
    assert d.first["a"] == pytest.approx(0.51)
    # b's two chunks each share a step with a's decoding: 0.010 + 0.001 + 1.0
    assert d.first["b"] == pytest.approx(0.51 + 2 * 1.011)
    assert d.done["a"] == pytest.approx(0.51 + 2 * 1.011)


def test_arrival_during_decode_stretch_joins_at_next_boundary():
    d = Driver(CFG)
    d.run([(0.0, req("a", (1,), 512, 101)), (0.6, req("b", (1,), 512, 1))])
    start = 0.51  # a decodes from here in 11 ms steps
    boundary = start + 9 * 0.011  # the first step boundary after 0.6
    # b hits a's cached block: a zero-token prefill step after admission
    assert d.model.stats.cached_tokens == 512
    assert d.first["b"] == pytest.approx(boundary + 0.010 + 0.001)
    assert d.done["a"] > boundary


def test_waits_for_memory_held_by_running_requests():
    cfg = WorkerModelConfig(
        profile=None,
        kv_capacity_tokens=512 * 4,
        chunk_tokens=4096,
        prefill_tokens_per_s=1024.0,
        step_overhead_s=0.01,
        decode_s_per_seq=0.0,
    )
    d = Driver(cfg)
    # a holds 3 blocks until it finishes; b needs 3 more: must wait for a
    d.run([(0.0, req("a", (1, 2, 3), 1536, 50)), (0.1, req("b", (7, 8, 9), 1536, 1))])
    assert d.first["b"] > d.done["a"]
    assert d.model.cache.total_tokens <= 2 * 4  # a's blocks were evicted for b


def test_eviction_follows_the_last_use_not_the_admission():
    """As the engines evict: a prompt admitted first but used until later (a long answer)
    outlives one admitted after it that finished first."""
    d = Driver(CFG)
    long_answer, short_answer = tuple(range(1, 7)), tuple(range(11, 17))
    d.run([(0.0, req("a", long_answer, 512 * 6, 200)), (0.0, req("b", short_answer, 512 * 6, 1))])
    assert d.done["b"] < d.done["a"]
    # c needs 10 of the 20 blocks, 12 of which a and b hold: one of their prompts goes
    d.run([(100.0, req("c", tuple(range(21, 31)), 512 * 10, 1))])
    assert d.model.cached_prefix_blocks(long_answer) == 6
    assert d.model.cached_prefix_blocks(short_answer) == 0


def test_oversized_request_runs_alone():
    d = Driver(CFG)
    d.run([(0.0, req("big", tuple(range(30)), 512 * 30, 1))])
    assert "big" in d.done


# ---- LoRA adapters -----------------------------------------------------------------------


def lora_req(tag: str, adapter: str | None, blocks: tuple[int, ...] = (1, 2), output: int = 5):
    return SimRequest(blocks, 1024, output, tag=tag, adapter=adapter)


def test_an_adapter_pays_its_load_once_then_runs_resident():
    from dataclasses import replace

    d = Driver(replace(CFG, lora_load_s=0.25))
    d.run([(0.0, lora_req("a", "x", (1, 2))), (5.0, lora_req("b", "x", (3, 4)))])
    assert d.first["a"] == pytest.approx(1.010 + 0.25)  # the load lengthens its step
    assert d.first["b"] == pytest.approx(5.0 + 1.010)  # resident: no load
    assert d.model.stats.lora_swaps == 1
    assert list(d.model.loras) == ["x"] and d.model.lora_running == {}


def test_adapter_blocks_are_never_a_hit_for_the_base_model_or_another_adapter():
    order = [("base", None), ("x", "x"), ("y", "y"), ("x2", "x"), ("base2", None)]
    reqs = [lora_req(tag, adapter) for tag, adapter in order]  # one prompt, one at a time
    Driver(CFG).run([(10.0 * i, r) for i, r in enumerate(reqs)])
    cached = {r.tag: r.cached_tokens for r in reqs}
    assert cached == {"base": 0, "x": 0, "y": 0, "x2": 1024, "base2": 1024}


def test_a_batch_never_runs_more_than_max_loras_adapters():
    from dataclasses import replace

    cfg = replace(CFG, max_loras=2, kv_capacity_tokens=512 * 200, chunk_tokens=4096)
    model = WorkerModel(cfg)
    reqs = [
        SimRequest((100 + i,), 512, 3 + i % 7, tag=i, adapter=f"a{i % 5}" if i % 4 else None)
        for i in range(60)
    ]
    widest = 0
    arrivals = [(0.05 * i, r) for i, r in enumerate(reqs)]
    while arrivals or model.next_event is not None:
        if arrivals and (model.next_event is None or arrivals[0][0] < model.next_event):
            at, r = arrivals.pop(0)
            model.submit(r, at)
        else:
            model.advance(model.next_event)
        batch = list(model.prefilling) + [e[2] for e in model.decoding]
        adapters = {r.adapter for r in batch if r.adapter is not None}
        assert len(adapters) <= 2
        assert set(model.lora_running) == adapters
        assert set(model.lora_running) <= set(model.loras) and len(model.loras) <= 2
        widest = max(widest, len(adapters))
    assert widest == 2
    assert model.stats.finished == 60
    assert model.stats.lora_swaps >= 5  # five adapters through two slots


def test_a_request_without_a_slot_waits_and_the_ones_behind_it_go_first():
    from dataclasses import replace

    d = Driver(replace(CFG, lora_load_s=0.0))
    d.run(
        [
            (0.0, lora_req("x", "x", (1,), output=50)),
            (0.001, lora_req("y", "y", (2,))),  # max_loras 1: waits for x to finish
            (0.002, lora_req("base", None, (3,))),  # the base model needs no slot
            (0.003, lora_req("x2", "x", (4,))),  # x runs: joins
        ]
    )
    assert d.first["base"] < d.done["x"] and d.first["x2"] < d.done["x"]
    assert d.first["y"] > d.done["x"]
    assert d.model.stats.lora_swaps == 2  # x, then y in its place (x idle by then)


def test_the_least_recently_used_idle_adapter_gives_way():
    from dataclasses import replace

    d = Driver(replace(CFG, max_loras=2))
    d.run([(10.0 * i, lora_req(str(i), a, (i,))) for i, a in enumerate("xyxzx")])
    # x, y loaded; x again resident; z evicts y (x was used since); x still resident
    assert d.model.stats.lora_swaps == 3
    assert list(d.model.loras) == ["z", "x"]


def _prio(tag: str, blocks: tuple[int, ...], tokens: int, priority: int, output: int = 1):
    return SimRequest(blocks, tokens, output, tag=tag, priority=priority)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_orders_the_prefills_not_started_and_never_preempts(policy):
    from dataclasses import replace

    d = Driver(replace(CFG, scheduling_policy=policy))
    d.run(
        [
            (0.0, _prio("long", (1, 2, 3, 4, 5, 6, 7, 8), 4096, 9)),  # four 1 s chunks
            (0.5, _prio("big", (20, 21, 22, 23), 2048, 5)),
            (0.6, _prio("small", (30, 31), 1024, 1)),
        ]
    )
    # the long prefill under way keeps its place under either policy
    assert d.first["long"] == pytest.approx(4 * 1.010)
    if policy == "priority":  # then the lower priority first, whatever the arrival
        assert d.first["small"] == pytest.approx(5 * 1.010)
        assert d.first["big"] == pytest.approx(7 * 1.010)
    else:  # then arrival order
        assert d.first["big"] == pytest.approx(6 * 1.010)
        assert d.first["small"] == pytest.approx(7 * 1.010)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_orders_the_requests_waiting_for_memory(policy):
    from dataclasses import replace

    d = Driver(replace(CFG, scheduling_policy=policy))
    hog = _prio("hog", tuple(range(100, 116)), 8192, 0, output=200)  # 17 of the 20 blocks
    d.run(
        [
            (0.0, hog),
            (0.1, _prio("x", tuple(range(200, 208)), 4096, 5)),  # needs 9 blocks: waits
            (0.2, _prio("y", (300, 301), 1024, 1)),  # needs 3: fits beside the hog
        ]
    )
    if policy == "priority":  # y heads the queue and fits: it runs beside the hog
        assert d.first["y"] < d.done["hog"]
    else:  # x heads the queue and waits for memory; y waits behind it
        assert d.first["y"] > d.done["hog"]
        assert d.first["x"] < d.first["y"]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_block_is_cached_for_others_once_the_chunk_computing_it_is_scheduled(policy):
    """A request admitted on blocks another admitted request has not started computing
    finds them cached only if that one is scheduled first: under priority scheduling the
    later, lower-keyed turn starts first and computes the shared prefix itself (an engine
    caches a block when the step computing it is scheduled), and the first then finds it."""
    from dataclasses import replace

    d = Driver(replace(CFG, scheduling_policy=policy))
    cold = _prio("cold", tuple(range(40, 48)), 4000, 5)
    turn = _prio("turn", tuple(range(40, 50)), 5000, 1)
    d.run([(0.0, _prio("long", (1, 2, 3, 4, 5, 6, 7, 8), 4096, 9)), (0.5, cold), (0.6, turn)])
    if policy == "priority":
        assert d.first["turn"] <= d.first["cold"]  # in the step scheduling its last chunk
        assert turn.cached_tokens == 0  # cold's blocks were booked, not computed
        assert cold.cached_tokens == 4000  # computed by the turn by then
    else:  # arrival order: the cold prompt computes the prefix, the turn finds it
        assert d.first["cold"] < d.first["turn"]
        assert (cold.cached_tokens, turn.cached_tokens) == (0, 4096)
    assert d.model.pending == {}

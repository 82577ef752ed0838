"""Precise mode in the simulator: the worker models' KV events feed the router's index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import traces
from policies.registry import make_picker
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import SimRequest, WorkerModel, WorkerModelConfig
from traces.trace.formats import load_trace

SAMPLE = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"
SMALL = WorkerModelConfig(kv_capacity_tokens=64 * 512)


def test_worker_model_events_describe_its_cache():
    model = WorkerModel(SMALL, events=True)
    model.submit(SimRequest((1, 2, 3), 1536, 1), 0.0)
    while model.next_event is not None:
        model.advance(model.next_event)
    (stored,) = model.take_events()
    assert stored["type"] == "BlockStored"
    assert stored["block_hashes"] == [1, 2, 3] and stored["parent_block_hash"] is None
    assert len(stored["token_ids"]) == 3 * stored["block_size"]
    assert model.take_events() == []
    model.cache.evict(10**9)
    removed = model.take_events()
    assert {b for e in removed for b in e["block_hashes"]} == {1, 2, 3}


@pytest.mark.parametrize("loss", [0.0, 0.3])
def test_index_matches_truth_when_caches_have_room(loss):
    trace = load_trace(SAMPLE)[:400]
    config = SimConfig(workers=4, kv_events=True, kv_event_loss=loss, seed=3)
    run = simulate(trace, make_picker("lmetric"), config)
    kv = run.estimates["kv"]
    assert not np.isnan(kv).any()  # every booking was answered by a synced index
    assert run.summary()["shadow_abs_error_kv"] < 0.005


def test_lost_batches_are_replayed_and_the_index_stays_synced():
    trace = load_trace(SAMPLE)[:400]
    config = SimConfig(workers=2, kv_events=True, kv_event_loss=0.5, seed=1)
    states = []
    picker = make_picker("lmetric")
    pick = picker.pick

    def remember(request, workers):
        if not states:
            states.extend(workers)
        return pick(request, workers)

    picker.pick = remember
    simulate(trace, picker, config)
    assert all(s.kv_index.synced for s in states)
    assert sum(s.kv_index.stats.replays for s in states) > 0
    assert sum(s.kv_index.stats.gaps for s in states) > 0


def test_live_requests_store_their_token_ids_and_a_reset_clears():
    from router.cache.block_hash import hash_blocks, token_bytes

    ids = list(range(1, 1300))  # two full 512-token blocks and a partial one
    buf = token_bytes(ids)
    blocks = tuple(hash_blocks(buf))
    model = WorkerModel(SMALL, events=True)
    model.submit(SimRequest(blocks, len(ids), 1, tokens=buf), 0.0)
    while model.next_event is not None:
        model.advance(model.next_event)
    (stored,) = model.take_events()
    assert stored["block_size"] == 512 and stored["token_ids"] == ids[:1024]
    assert stored["block_hashes"] == list(blocks)
    model.reset_cache()
    assert model.take_events() == [{"type": "AllBlocksCleared"}]
    assert model.cached_prefix_blocks(blocks) == 0

"""The hit gap split into causes (traces/sim/hit_gap.py): exact token counts on hand-made fleets,
and the parts adding up to the ceiling on real samples."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from traces.commands.options import make_sim_picker
from traces.sim.bounds import belady_hits, hit_tokens, trace_bounds
from traces.sim.config import SimConfig
from traces.sim.hit_gap import PARTS, CeilingHits, HitGap, block_weights, pooled_lru_hits
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace
from traces.trace.run import PolicyRun

sys.path.insert(0, str(Path(__file__).parent))

from hit_gap_support import TIMELINE, TIMELINE_PICKS, req, run

REPO = Path(__file__).parents[2]


def gap_of(trace, result: PolicyRun, workers: int, kv_tokens: int = 262_144) -> HitGap:
    gap = CeilingHits(workers * kv_tokens // 512).gap(trace, result.block_states)
    assert gap.hit == int(result.cached.sum())
    assert gap.unexplained == 0
    return gap


def test_elsewhere_in_flight_and_duplicated_on_the_timeline() -> None:
    """The ceiling (room for every block) credits 1 with blocks 1-4 (2,048 tokens), 3 with
    10-25 (8,192) and 6 with 40-43 (2,048); the fleet hits none of them. 1's were on w0
    (elsewhere), 3's still prefilling there, 6's only in 5, queued on w0. 5, first with
    40-43, is no gap, but it computes them while w1 holds them: duplicated, with 1's and 3's."""
    gap = gap_of(TIMELINE, run(TIMELINE, TIMELINE_PICKS, 2), 2)
    assert gap.prompt_tokens == sum(r.input_length for r in TIMELINE) == 59_392
    assert (gap.hit, gap.ceiling, gap.gap) == (0, 12_288, 12_288)
    assert (gap.elsewhere, gap.prefilling, gap.queued) == (2_048, 8_192, 2_048)
    assert gap.evicted_lru == gap.evicted_split == gap.residual == gap.beyond_ceiling == 0
    assert gap.duplicated == gap.recomputed == 2_048 + 8_192 + 2_048


def test_a_prefix_on_both_workers_counts_once_per_recompute() -> None:
    """A 3-block prompt (1,536 tokens) three times, 10 s apart, on w0, w1, w0: the second is
    computed again on w1 (elsewhere); the third hits w0."""
    trace = [req(10.0 * i, (7, 8, 9), 1_536) for i in range(3)]
    gap = gap_of(trace, run(trace, [0, 1, 0], 2), 2)
    assert (gap.hit, gap.ceiling, gap.elsewhere, gap.duplicated) == (1_536, 3_072, 1_536, 1_536)


def test_evicted_where_a_pooled_lru_loses_it_too() -> None:
    """One worker of 3 blocks; one-block prompts of 511 tokens (no block for the output),
    10 s apart: a b c d a. The LRU evicts a for d; Belady keeps a (b, c, d never come back),
    and so does the ceiling; one pooled LRU of the same 3 blocks loses a as well."""
    trace = [req(10.0 * i, (k,), 511) for i, k in enumerate((1, 2, 3, 4, 1))]
    result = run(trace, [0] * 5, 1, kv_tokens=3 * 512)
    gap = gap_of(trace, result, 1, 3 * 512)
    assert (gap.hit, gap.ceiling, gap.evicted_lru, gap.evicted_split) == (0, 511, 511, 0)
    assert gap.recomputed == 511 and gap.duplicated == 0 and gap.pooled_lru == 0


def test_evicted_where_the_split_fleet_loses_what_one_pool_keeps() -> None:
    """Two workers of 2 blocks (4 pooled): a b c on w0 (which evicts a for c), then a on
    w1. One pooled LRU of 4 blocks still holds a: the split lost it."""
    trace = [req(10.0 * i, (k,), 511) for i, k in enumerate((1, 2, 3, 1))]
    gap = gap_of(trace, run(trace, [0, 0, 0, 1], 2, kv_tokens=1_024), 2, 1_024)
    assert (gap.hit, gap.ceiling, gap.evicted_lru, gap.evicted_split) == (0, 511, 0, 511)
    assert gap.pooled_lru == 511


def test_residual_and_beyond_the_ceiling_under_session_pacing() -> None:
    """Session pacing holds 1 (turn two of s1) until 0's long answer ends; 2 (s2), later in
    the trace, shares its prompt and goes first. The ceiling, in arrival order, credits 2
    with 1's blocks, which no worker ever saw by then (residual), and not 1 with 2's,
    which 1 hits (beyond the ceiling)."""
    trace = [
        req(0.0, (90,), 511, output=300, session="s1"),
        req(1.0, (1, 2, 3, 4), 2_048, session="s1"),
        req(2.0, (1, 2, 3, 4), 2_048, session="s2"),
    ]
    result = run(trace, [0, 0, 0], 1, pacing="session")
    assert result.arrival[1] > result.arrival[2]  # 1 was sent after 2
    gap = gap_of(trace, result, 1)
    assert (gap.hit, gap.ceiling, gap.residual, gap.beyond_ceiling) == (2_048, 2_048, 2_048, 2_048)
    assert gap.gap == 0


def test_pooled_lru_on_belady_s_textbook_sequence() -> None:
    """1 2 3 4 1 2 5 1 2 3 4 5 in three frames: LRU hits 1 and 2 after 4, once each."""
    sequence = (1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5)
    hits = pooled_lru_hits([req(float(i), (k,), 512) for i, k in enumerate(sequence)], 3)
    assert hits.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0]


def test_block_weights_sum_to_the_worker_model_s_token_counts() -> None:
    trace = [req(0.0, (1, 2, 3), 1_300), req(1.0, (4,), 100), req(2.0, (5, 6), 1_024)]
    counts = np.array([3, 1, 2])
    starts = np.concatenate([[0], np.cumsum(counts)])
    request, position, weight = block_weights(trace, starts)
    assert request.tolist() == [0, 0, 0, 1, 2, 2]
    assert position.tolist() == [0, 1, 2, 0, 0, 1]
    assert weight.tolist() == [512, 512, 276, 100, 512, 512]


@pytest.mark.parametrize(
    ("path", "workers", "kv_tokens", "speedup"),
    [
        ("traces/data/weka_agentic_sample.jsonl", 4, 1_000_000, 1.0),
        ("tests/data/mooncake_conversation_head200.jsonl", 2, 65_536, 2.0),
    ],
)
def test_the_parts_add_up_to_the_ceiling_on_real_samples(
    path: str, workers: int, kv_tokens: int, speedup: float
) -> None:
    """Every policy: its hit tokens are the simulator's, the ceiling's the bounds' (Belady on
    the pooled KV), and hit + parts - beyond ceiling is the ceiling, token for token."""
    trace = load_trace(REPO / path)
    worker = WorkerModelConfig(kv_capacity_tokens=kv_tokens)
    config = SimConfig(workers=workers, worker=worker, speedup=speedup, hit_gap=True)
    ceilings = CeilingHits(workers * worker.capacity_blocks)
    bounds = trace_bounds(trace, workers, worker)
    ceiling = int(hit_tokens(trace, belady_hits(trace, workers * worker.capacity_blocks)).sum())
    for policy in ("ttft", "round_robin", "sticky", "llmd"):
        result = simulate(trace, make_sim_picker(policy), config, policy)
        gap = ceilings.gap(trace, result.block_states)
        assert gap.hit == int(result.cached.sum()), policy
        assert gap.ceiling == ceiling
        assert gap.ceiling / gap.prompt_tokens == pytest.approx(bounds.hit_ceiling)
        parts = sum(getattr(gap, k) for k in PARTS)
        assert gap.hit + parts - gap.beyond_ceiling == gap.ceiling, policy
        assert min(getattr(gap, k) for k in (*PARTS, "beyond_ceiling")) >= 0
        assert gap.duplicated <= gap.recomputed <= gap.prompt_tokens - gap.hit
    rates = gap.as_dict()
    assert rates["gap_rate"] == pytest.approx((gap.ceiling - gap.hit) / gap.prompt_tokens)

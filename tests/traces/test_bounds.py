"""The bounds (traces/sim/bounds.py) on tiny traces worked by hand, and against the simulator."""

from __future__ import annotations

import functools
import itertools
import random
from pathlib import Path

import numpy as np
import pytest

import traces
from router.cli import build_parser
from traces.commands.options import make_sim_picker
from traces.commands.run_simulate import run_and_report
from traces.sim.bounds import (
    belady_hits,
    fleet_floors,
    hit_tokens,
    infinite_cache_hits,
    next_use,
    prefill_seconds,
    shared_step_seconds,
    trace_bounds,
    ttft_floors,
)
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace
from traces.trace.record import TraceFormatError, TraceRequest
from traces.trace.stats import hit_ceiling

CONVERSATION = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"
MODEL = WorkerModelConfig(
    profile=None
)  # the flat model: 8192-token chunks, 15k tokens/s, 12 ms a step


def req(blocks: tuple[int, ...], input_length: int | None = None, at: float = 0.0):
    length = input_length if input_length is not None else 512 * len(blocks)
    return TraceRequest(at, "", 0, length, 1, tuple(blocks))


def test_next_use_points_at_the_next_occurrence() -> None:
    ids = np.array([5, 7, 5, 5, 9, 7])
    assert next_use(ids).tolist() == [2, 5, 3, 6, 6, 6]


def test_belady_on_a_three_block_cache() -> None:
    """Belady's textbook sequence (1 2 3 4 1 2 5 1 2 3 4 5, three frames): seven misses,
    five hits. Keeping 4 would cost 3; with bypass 4 and 5 are never cached."""
    sequence = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]
    hits = belady_hits([req((k,)) for k in sequence], capacity_blocks=3)
    assert hits.tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0]
    lru = _lru_hits(sequence, 3)
    assert lru == 2 < hits.sum()  # LRU on the same cache: only 1 and 2 after 4, once each


def _lru_hits(sequence: list[int], capacity: int) -> int:
    cache: list[int] = []
    hits = 0
    for k in sequence:
        if k in cache:
            hits += 1
            cache.remove(k)
        cache.append(k)
        del cache[:-capacity]
    return hits


def test_only_a_prefix_hits() -> None:
    """The second prompt holds block 3, but not block 2 before it: one hit, not two."""
    trace = [req((1, 2, 3)), req((1, 4, 3)), req((1, 4, 3, 5))]
    assert infinite_cache_hits(trace).tolist() == [0, 1, 3]
    assert belady_hits(trace, capacity_blocks=10).tolist() == [0, 1, 3]
    assert belady_hits(trace, capacity_blocks=0).tolist() == [0, 0, 0]


def _chained_trace(rng: random.Random, requests: int) -> list[TraceRequest]:
    """Prompts that extend a prefix of an earlier prompt (block keys prefix-chained: a key
    is only ever seen after the same keys before it)."""
    fresh = itertools.count(1)
    trace: list[TraceRequest] = []
    for _ in range(requests):
        base = rng.choice(trace).blocks if trace and rng.random() < 0.7 else ()
        keep = base[: rng.randint(0, len(base))]
        trace.append(req(keep + tuple(next(fresh) for _ in range(rng.randint(0, 2)))))
    return [t for t in trace if t.blocks]


def _best_prefix_hits(trace: list[TraceRequest], capacity: int) -> int:
    """The most prefix hits any cache of ``capacity`` blocks gets: every choice of what to
    keep from the cache and the request's blocks, after each request."""

    @functools.cache
    def best(r: int, cache: frozenset[int]) -> int:
        if r == len(trace):
            return 0
        blocks = trace[r].blocks
        hits = next((i for i, b in enumerate(blocks) if b not in cache), len(blocks))
        pool = sorted(cache | set(blocks))
        keep = (frozenset(c) for n in range(min(capacity, len(pool)) + 1)
                for c in itertools.combinations(pool, n))  # fmt: skip
        return hits + max(best(r + 1, k) for k in keep)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(12))
def test_belady_prefix_hits_are_the_optimum(seed: int) -> None:
    """On prefix-chained prompts Belady's prefix hits equal the best any eviction gets
    (exhaustive search), so the hit ceiling is a ceiling."""
    rng = random.Random(seed)
    trace = _chained_trace(rng, 7)
    for capacity in (1, 2, 3):
        assert belady_hits(trace, capacity).sum() == _best_prefix_hits(trace, capacity)


def test_ttft_floor_arithmetic() -> None:
    """10,000 cold tokens: two chunks (8,192 + 1,808), two 12 ms steps + 10,000 / 15,000 s.
    3,440 cold after a 5-block shared prefix: one step. A repeat: nothing to compute, still
    one step. Block 2 of the first prompt without block 1: nothing shared."""
    first = tuple(range(1, 21))
    trace = [
        req(first, 10_000),
        req((*first[:5], 100, 101), 6_000),
        req(first, 10_000),
        req((200, *first[1:4]), 2_048),
    ]
    floors = ttft_floors(trace, MODEL)
    assert floors == pytest.approx(
        [2 * 0.012 + 10_000 / 15_000, 0.012 + 3_440 / 15_000, 0.012, 0.012 + 2_048 / 15_000]
    )
    assert prefill_seconds(np.array([8_192, 8_193]), MODEL) == pytest.approx(
        [0.012 + 8_192 / 15_000, 0.024 + 8_193 / 15_000]
    )


def test_load_ceiling_arithmetic() -> None:
    """30,720 prompt tokens over 10 s, the second prompt a repeat of the first: hit ceiling
    1/3, 20,480 tokens to prefill. Two workers at 1,000 tokens/s prefill 2,000 tokens/s, so
    the ceiling is 10 x 2,000 / 20,480 of the trace's speed. With one worker of 10 blocks,
    Belady keeps the first prompt's first 10 blocks for the repeat: 1/6."""
    model = WorkerModelConfig(
        profile=None, prefill_tokens_per_s=1_000.0, kv_capacity_tokens=512 * 100
    )
    a, b = tuple(range(1, 21)), tuple(range(21, 41))
    trace = [req(a, 10_240, 0.0), req(a, 10_240, 5.0), req(b, 10_240, 10.0)]
    bounds = trace_bounds(trace, 2, model)
    assert bounds.hit_ceiling == pytest.approx(1 / 3)
    assert bounds.load_ceiling == pytest.approx(10 * 2_000 / 20_480)
    assert bounds.load_ceiling_rps == pytest.approx(3 / 10 * bounds.load_ceiling)
    assert bounds.pooled_kv_tokens == 2 * 512 * 100
    small = trace_bounds(trace, 1, WorkerModelConfig(profile=None, kv_capacity_tokens=512 * 10))
    assert small.hit_ceiling == pytest.approx(1 / 6)
    assert small.infinite_hit_ceiling == pytest.approx(1 / 3)
    assert belady_hits(trace, 10).tolist() == [0, 10, 0]


def test_bounds_match_the_trace_stats_and_hold_for_every_router(data: Path) -> None:
    """With room for everything Belady is the infinite cache (trace stats' figure); every
    request's TTFT in the simulator is at least its floor, whatever the policy."""
    trace = load_trace(data / "mooncake_conversation_head200.jsonl")
    big = trace_bounds(trace, 8, WorkerModelConfig(profile=None, kv_capacity_tokens=1_000_000))
    assert big.hit_ceiling == pytest.approx(hit_ceiling(trace).token_ratio)
    floors = ttft_floors(trace, MODEL)
    for policy in ("ttft", "round_robin"):
        for speedup in (0.2, 2.0):
            config = SimConfig(workers=2, worker=MODEL, speedup=speedup)
            run = simulate(trace, make_sim_picker(policy), config, policy)
            assert np.all(run.first_token - run.arrival >= floors - 1e-9), (policy, speedup)
            assert run.cached.sum() / run.input_length.sum() <= big.hit_ceiling + 1e-12


def test_fleet_floors_by_hand() -> None:
    """Four requests at once on two workers, floors 3, 1, 4, 2 s: the m-th to start answering
    waits at least the m smallest floors over two workers, or its own; a later one alone
    keeps its floor."""
    trace = [req((i,), at=0.0) for i in range(4)] + [req((9,), at=5.0)]
    floors = np.array([3.0, 1.0, 4.0, 2.0, 10.0])
    # sorted 1, 2, 3, 4: sums over 2 workers 0.5, 1.5, 3, 5 -> 1, 2, 3, 5
    assert fleet_floors(trace, floors, 2).tolist() == [3.0, 1.0, 5.0, 2.0, 10.0]
    assert fleet_floors(trace, floors, 8).tolist() == floors.tolist()  # room for each


def test_fleet_floors_count_whole_requests_per_worker() -> None:
    """Three 1 s requests at once on two workers: one worker prefills two of them, so the
    third first token waits 2 s (the fleet's rate alone says 1.5 s). Six on four: two
    workers prefill two each, so the sixth waits 2 s even when the j = 1 term is too
    small to say so."""
    three = [req((i,), at=0.0) for i in range(3)]
    assert fleet_floors(three, np.ones(3), 2).tolist() == [1.0, 1.0, 2.0]
    six = [req((i,), at=0.0) for i in range(6)]
    floors = np.array([0.5, 0.5, 1.5, 1.5, 1.5, 1.5])
    # j = 1: two smallest 1.0; j = 2: four smallest / 2 = 2.0 (ceil(2 * 6 / 4) = 3 says 1.25)
    assert fleet_floors(six, floors, 4)[5] == 2.0


def test_fleet_floors_share_steps_by_work() -> None:
    """Requests on one worker share its chunked steps: the sum counts each one's ``work``
    (its overhead per token), while its own floor keeps its whole steps."""
    trace = [req((i,), at=0.0) for i in range(3)]
    floors, work = np.array([1.0, 1.0, 1.0]), np.array([0.9, 0.9, 0.9])
    assert fleet_floors(trace, floors, 2, work).tolist() == [1.0, 1.0, 1.8]


def test_fleet_bound_holds_for_every_router_on_the_agentic_burst() -> None:
    """The agentic sample opens with 42 sessions at once: at any load the bound's percentiles
    sit below every router's, and well above the floors' (4 workers)."""
    trace = load_trace(Path(traces.__file__).parent / "data" / "weka_agentic_sample.jsonl")
    model = WorkerModelConfig(profile=None, kv_capacity_tokens=1_000_000)
    bounds = trace_bounds(trace, 4, model)
    assert bounds.ttft_fleet_p90 > 2 * bounds.ttft_p90
    assert bounds.ttft_fleet_p90 > 5.0  # the 5 s SLO there is out of any router's reach
    burst = np.array([r.arrival == trace[0].arrival for r in trace])
    uncached = np.array([r.input_length for r in trace]) - hit_tokens(
        trace, infinite_cache_hits(trace)
    )
    floors, work = prefill_seconds(uncached, model), shared_step_seconds(uncached, model)
    fleet = np.sort(fleet_floors(trace, floors, 4, work)[burst])  # its order statistics
    for policy in ("ttft", "round_robin", "smg"):
        for speedup in (0.1, 1.0):
            config = SimConfig(workers=4, worker=model, speedup=speedup)
            run = simulate(trace, make_sim_picker(policy), config, policy)
            ttft = run.first_token - run.arrival
            for q in (50, 90, 99):
                bound = getattr(bounds, f"ttft_fleet_p{q}")
                assert np.percentile(ttft, q) >= bound - 1e-9, (policy, speedup, q)
            assert np.all(np.sort(ttft[burst]) >= fleet - 1e-9), (policy, speedup)


def test_full_conversation_bounds(conversation: list[TraceRequest]) -> None:
    """The issue's figures: 8 workers of 1M KV on Mooncake's conversation trace hold every
    reusable prefix (hit ceiling 37.4%, as never evicting) and carry at most ~4.7x."""
    bounds = trace_bounds(
        conversation, 8, WorkerModelConfig(profile=None, kv_capacity_tokens=1_000_000)
    )
    assert round(bounds.hit_ceiling, 3) == round(bounds.infinite_hit_ceiling, 3) == 0.374
    assert round(bounds.load_ceiling, 1) == 4.7


def test_simulate_reports_the_bounds(tmp_path: Path, data: Path) -> None:
    path = str(data / "mooncake_conversation_head200.jsonl")
    args = build_parser().parse_args(
        ["simulate", "--trace", path, "--workers", "2", "--policies", "ttft,round_robin",
         "--out", str(tmp_path), "--no-plots"]
    )  # fmt: skip
    document = run_and_report(path, load_trace(path), args, tmp_path, plots=False)
    bounds = document["bounds"]
    assert set(bounds) >= {"ttft_p90", "hit_ceiling", "load_ceiling"}
    for entry in document["policies"].values():
        assert entry["ttft_p90_x_bound"] == pytest.approx(entry["ttft_p90"] / bounds["ttft_p90"])
        assert entry["ttft_p90_x_bound"] >= 1 and entry["hit_rate_x_bound"] <= 1
    table = (tmp_path / "results.md").read_text()
    assert table.splitlines()[4].count("x bound") == 4
    assert "| bound | 200 |" in table and "load ceiling" in table


def test_a_negative_timestamp_is_refused_not_rebased_into_the_span(tmp_path: Path) -> None:
    """One line at -100 s (a typo) rebased to the trace's start stretched its span by 100 s:
    the load ceiling (a speedup over that span) moved with it. It is refused, naming the line."""
    lines = CONVERSATION.read_text().splitlines()[:50]
    moved = lines[5].replace('"timestamp": ', '"timestamp": -100000, "was": ', 1)
    path = tmp_path / "neg.jsonl"
    path.write_text("\n".join([*lines[:5], moved, *lines[6:]]) + "\n")
    with pytest.raises(TraceFormatError, match=f"{path}:6: field 'timestamp' must be >= 0"):
        load_trace(path)

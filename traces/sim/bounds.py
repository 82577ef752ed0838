"""What no router can beat on a trace and fleet: the TTFT floor, the hit and load ceilings.

Each bound is a property of the trace, the fleet's size and the worker model, not of a policy,
so a report can say how far every policy is from the best any router could do:

- **TTFT floor** (per request): infinite caches and no queue. The request's uncached tokens
  are those of its prompt that no earlier prompt (arrival order, any session) shared as a
  prefix; they run alone on an idle worker, priced as :mod:`traces.sim.worker_model` prices a
  prefill: ``ceil(uncached / chunk_tokens)`` steps (at least one) of ``step_overhead_s`` each,
  plus ``uncached / prefill_tokens_per_s``; under a GPU profile ``d`` a step plus the chunks'
  token and attention terms after the shared prefix (``a*u + c*(u*p + u**2/2)`` however
  chunked), which only grow when less of the prompt is cached. A percentile of the floors is
  below the same percentile of any router's TTFTs, since each request's floor is below its
  own TTFT.
- **TTFT bound with the fleet's parallelism**: requests that arrive at the same instant (a
  trace's opening burst: the bundled agentic sample starts 42 sessions at once) share the
  fleet's workers. Among ``g`` simultaneous requests with floors ``f_1 <= ... <= f_g``, the
  ``m``-th to get its first token waits at least ``f_m``, and at least the time the ``m``
  smallest take on ``workers`` workers, each request prefilled whole on one worker. With
  ``m = q workers + r``, the ``j`` workers that prefilled the most of them prefilled at least
  ``k = j q + min(j, r)`` (as many as when they are spread evenly), so one of them was busy
  ``(w_1 + ... + w_k) / j`` or more, for every ``j`` (``j = workers``: the fleet's whole
  rate; ``j = 1``: the busiest worker's queue). ``w_i`` is ``f_i`` with its step overheads
  per token, not per whole step, since requests on one worker share steps (the ``m``
  smallest ``w`` are summed, whichever requests they are: under a profile a smaller floor
  need not mean less work). These bound the
  order statistics of each group (not each request), so their percentiles over the trace
  bound every router's; simultaneous arrivals stay simultaneous at any speedup, so this
  holds at every load, however light.
- **Hit ceiling**: one pooled cache of the fleet's whole KV (workers x whole blocks of each),
  run with Belady's rule (evict the block whose next use is furthest ahead), a block a hit
  only when every earlier block of its prompt hit. Block keys are prefix-chained, so a block
  is never next used later than its parent (whatever carries it carries its parent first):
  Belady then evicts children before parents, its cache stays prefix-closed, and its prefix
  hits equal its plain block hits, the most blocks any eviction rule hits with that capacity
  (blocks entering only when a request brings them). A fleet of separate caches of the same
  total holds at most their union. Tokens are counted as the worker model counts them
  (``min(hit blocks x 512, prompt)``). Workers with a CPU KV tier pool it too: a block
  loaded from it is a hit that costs no prefill (the worker model counts it cached).
- **Load ceiling**: the trace speedup at which the fleet's prefill work at that hit ceiling
  fills every worker's prefill rate for the trace's whole (sped-up) span (under a profile:
  each request's token and attention terms after its prefix at the ceiling). Above it the fleet
  falls behind on average whatever the router does (step overheads and decode only lower the
  real knee); it is a sustained rate, so on a short trace an SLO's slack can carry a little
  more.

The TTFT floors and the hit ceiling follow arrival order (the simulator's open loop);
session pacing can send a turn after later requests of other sessions, which they do not
credit. A request's floor leaves out the fleet's queue, so a trace's bursts (many requests
sent at once) keep every router's percentiles above it at any load.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from traces.sim.worker_model import WorkerModelConfig
from traces.trace.record import BLOCK_TOKENS, TraceRequest

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Bounds:
    """A trace's bounds on one fleet (the ``bounds`` object of results.json)."""

    ttft_p50: float  # seconds: percentiles of the per-request TTFT floors
    ttft_p90: float
    ttft_p99: float
    ttft_fleet_p50: float  # seconds: percentiles of the bound with the fleet's parallelism
    ttft_fleet_p90: float
    ttft_fleet_p99: float
    hit_ceiling: float  # Belady on the pooled KV, fraction of prompt tokens
    hit_ceiling_blocks: float  # the same, fraction of blocks
    infinite_hit_ceiling: float  # a cache that never evicts, fraction of prompt tokens
    pooled_kv_tokens: int
    load_ceiling: float  # trace speedup
    load_ceiling_rps: float  # requests/s at that speedup
    load_ceiling_tokens_per_s: float  # prompt tokens/s at that speedup

    def as_dict(self) -> dict[str, float | int | None]:
        """The fields, an infinite one (no prefill work, or no span) as None (JSON)."""
        return {k: v if math.isfinite(v) else None for k, v in asdict(self).items()}


def flatten(trace: Sequence[TraceRequest]) -> tuple[np.ndarray, np.ndarray]:
    """Every request's block keys as dense ids (0..distinct-1), in arrival order, and each
    request's start offset into them (``len(trace) + 1`` offsets)."""
    counts = np.fromiter((len(r.blocks) for r in trace), dtype=np.int64, count=len(trace))
    starts = np.zeros(len(trace) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    keys = np.fromiter(
        itertools.chain.from_iterable(r.blocks for r in trace), dtype=np.uint64, count=starts[-1]
    )
    _, dense = np.unique(keys, return_inverse=True)
    return dense.astype(np.int64), starts


def next_use(ids: np.ndarray) -> np.ndarray:
    """For each occurrence, the index of the same id's next occurrence (``len(ids)``: none)."""
    n = len(ids)
    out = np.full(n, n, dtype=np.int64)
    if n < 2:
        return out
    order = np.argsort(ids, kind="stable")  # by id, then by position
    same = ids[order[1:]] == ids[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


def leading_hits(hit: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per request, how many of its leading occurrences are hits (``hit`` per occurrence)."""
    misses = np.append(np.flatnonzero(~hit), len(hit))
    first_miss = misses[np.searchsorted(misses, starts[:-1])]  # at or after each start
    return np.minimum(first_miss, starts[1:]) - starts[:-1]


def infinite_cache_hits(trace: Sequence[TraceRequest]) -> np.ndarray:
    """Per request, its leading blocks that some earlier request carried (a cache that never
    evicts: :func:`traces.trace.stats.hit_ceiling` per request)."""
    ids, starts = flatten(trace)
    request = np.repeat(np.arange(len(trace)), np.diff(starts))
    first = np.full(int(ids.max()) + 1 if len(ids) else 0, len(trace), dtype=np.int64)
    np.minimum.at(first, ids, request)
    return leading_hits(first[ids] < request, starts)


def hit_tokens(trace: Sequence[TraceRequest], hit_blocks: np.ndarray) -> np.ndarray:
    """Cached prompt tokens per request, as the worker model counts them."""
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    return np.minimum(hit_blocks * BLOCK_TOKENS, inputs)


def ttft_floors(trace: Sequence[TraceRequest], worker: WorkerModelConfig) -> np.ndarray:
    """Per request, its TTFT with infinite caches and no queue (module docstring)."""
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    shared = hit_tokens(trace, infinite_cache_hits(trace))
    return prefill_seconds(inputs - shared, worker, shared)


def prefill_seconds(
    uncached: np.ndarray, worker: WorkerModelConfig, cached: np.ndarray | int = 0
) -> np.ndarray:
    """An idle worker's time to first token for ``uncached`` prompt tokens after ``cached``
    ones: its chunked prefill steps, each one engine step's fixed cost (no decode batch),
    plus its tokens' work."""
    steps = np.maximum(1, -(-uncached // worker.chunk_tokens))
    return steps * worker.prefill_step_s + worker.prefill_work_s(uncached, cached)


def shared_step_seconds(
    uncached: np.ndarray, worker: WorkerModelConfig, cached: np.ndarray | int = 0
) -> np.ndarray:
    """A prefill's least share of its worker's time when it shares chunked steps with
    others: its tokens' work, and its tokens' part of each step's fixed cost."""
    if worker.profile is None:  # the flat model's figures, unchanged to the last bit
        per_token = 1 / worker.prefill_tokens_per_s + worker.step_overhead_s / worker.chunk_tokens
        return uncached * per_token
    steps = uncached * (worker.prefill_step_s / worker.chunk_tokens)
    return steps + worker.prefill_work_s(uncached, cached)


def fleet_floors(
    trace: Sequence[TraceRequest],
    floors: np.ndarray,
    workers: int,
    work: np.ndarray | None = None,
) -> np.ndarray:
    """The TTFT bound with the fleet's parallelism (module docstring), one per request: the
    ``m``-th smallest of each group of simultaneous arrivals gets that group's ``m``-th order
    statistic's bound; its percentiles bound every router's. ``work``: each request's share
    of a worker's time when it shares the worker's steps (default: its floor), no more than
    its floor and increasing with it."""
    work = floors if work is None else work
    arrivals = np.fromiter((r.arrival for r in trace), dtype=np.float64, count=len(trace))
    order = np.lexsort((floors, arrivals))  # by arrival, then floor
    at, floor = arrivals[order], floors[order]
    done = np.cumsum(work[np.lexsort((work, arrivals))])  # the same groups, by work
    first = np.r_[True, at[1:] != at[:-1]]
    start = np.flatnonzero(first)[np.cumsum(first) - 1]  # each one's group's first index
    before = np.r_[0.0, done][start]  # the work of earlier groups
    m = np.arange(len(order)) - start + 1  # its rank in its group
    bound = floor.copy()
    workers = max(1, workers)
    q, r = np.divmod(m, workers)
    for j in range(1, workers + 1):  # the j workers with the most of them: at least k
        k = j * q + np.minimum(j, r)
        bound = np.maximum(bound, (done[start + k - 1] - before) / j)
    out = np.empty_like(floors)
    out[order] = bound
    return out


def belady_hits(trace: Sequence[TraceRequest], capacity_blocks: int) -> np.ndarray:
    """Per request, its prefix hits (leading blocks) in one cache of ``capacity_blocks`` run
    with Belady's rule (module docstring); a request's blocks enter after its hits are
    counted, and whichever blocks of the cache and the request are used furthest ahead are
    evicted (so a block never used again is not kept)."""
    ids, starts = flatten(trace)
    n = len(ids)
    following = next_use(ids).tolist()
    flat = ids.tolist()
    bounds = starts.tolist()
    cached = bytearray(int(ids.max()) + 1 if n else 0)
    due = [0] * len(cached)  # a cached id's next use (matches its live heap entry)
    heap: list[tuple[int, int]] = []  # (-next use, id), stale entries skipped
    size = 0
    hits = np.zeros(len(trace), dtype=np.int64)
    for r in range(len(trace)):
        lo, hi = bounds[r], bounds[r + 1]
        h = lo
        while h < hi and cached[flat[h]]:
            h += 1
        hits[r] = h - lo
        for j in range(lo, hi):
            key, when = flat[j], following[j]
            if not cached[key]:
                cached[key] = 1
                size += 1
            due[key] = when
            heapq.heappush(heap, (-when, key))
        while size > capacity_blocks:
            when, key = heapq.heappop(heap)
            if cached[key] and due[key] == -when:
                cached[key] = 0
                size -= 1
    return hits


def pooled_blocks(workers: int, worker: WorkerModelConfig) -> int:
    """The hit ceiling's one cache: every worker's KV blocks, both tiers."""
    return workers * (worker.capacity_blocks + worker.cpu_capacity_blocks)


def load_ceiling(
    inputs: np.ndarray, cached: np.ndarray, span: float, workers: int, worker: WorkerModelConfig
) -> float:
    """The speedup at which the prefill work left by ``cached`` fills the fleet (module
    docstring); infinite without work or span."""
    if worker.profile is None:  # tokens over the fleet's rate, as before profiles
        work = float((inputs - cached).sum())
        rate = workers * worker.prefill_tokens_per_s
        return span * rate / work if work > 0 and span > 0 else math.inf
    seconds = float(worker.prefill_work_s(inputs - cached, cached).sum())
    return span * workers / seconds if seconds > 0 and span > 0 else math.inf


def trace_bounds(trace: Sequence[TraceRequest], workers: int, worker: WorkerModelConfig) -> Bounds:
    """The bounds of ``trace`` on ``workers`` workers of ``worker`` (module docstring)."""
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    prompt = max(1, int(inputs.sum()))
    shared = hit_tokens(trace, infinite_cache_hits(trace))
    floors = prefill_seconds(inputs - shared, worker, shared)
    pct = [float(np.percentile(floors, q)) if len(floors) else 0.0 for q in PERCENTILES]
    work = shared_step_seconds(inputs - shared, worker, shared)
    fleet = fleet_floors(trace, floors, workers, work)
    fleet_pct = [float(np.percentile(fleet, q)) if len(fleet) else 0.0 for q in PERCENTILES]
    capacity = pooled_blocks(workers, worker)
    hits = belady_hits(trace, capacity)
    blocks = sum(len(r.blocks) for r in trace)
    hit = float(hit_tokens(trace, hits).sum()) / prompt
    span = trace[-1].arrival - trace[0].arrival if trace else 0.0
    load = load_ceiling(inputs, hit_tokens(trace, hits), span, workers, worker)
    return Bounds(
        ttft_p50=pct[0],
        ttft_p90=pct[1],
        ttft_p99=pct[2],
        ttft_fleet_p50=fleet_pct[0],
        ttft_fleet_p90=fleet_pct[1],
        ttft_fleet_p99=fleet_pct[2],
        hit_ceiling=hit,
        hit_ceiling_blocks=float(hits.sum()) / blocks if blocks else 0.0,
        infinite_hit_ceiling=float(shared.sum()) / prompt,
        pooled_kv_tokens=capacity * BLOCK_TOKENS,
        load_ceiling=load,
        load_ceiling_rps=len(trace) / span * load if span > 0 else math.inf,
        load_ceiling_tokens_per_s=prompt / span * load if span > 0 else math.inf,
    )

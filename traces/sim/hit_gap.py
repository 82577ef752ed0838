"""The gap between a policy's hit rate and the hit ceiling, split into its causes.

The ceiling (:mod:`traces.sim.bounds`) runs the trace, in arrival order, through one pooled cache
of the fleet's KV with Belady's rule; it gives each request a prefix hit of ``c`` blocks. The
policy's run gave it ``p`` blocks (at its admission on its worker). Tokens are counted as
the worker model counts them: block ``i`` of a prompt of ``L`` tokens weighs
``min(512 (i+1), L) - min(512 i, L)``, so blocks ``[p, c)`` weigh exactly the request's
ceiling tokens less its policy tokens. Per request:

- ``c > p``: the blocks ``[p, c)`` are the *gap*. Each takes the state the ledger gave it at
  the request's admission (:mod:`traces.sim.miss_causes`), which names its cause:

  - **elsewhere** (``ELSEWHERE``): another worker held it, prefilled: routing sent the
    request away from its prefix, which is computed again on a second worker;
  - **in flight, prefilling** (``PREFILLING``): another worker held it only as part of a
    request still prefilling there: the request came while its prefix was being computed
    (the worker model caches a prompt's blocks at admission, before its prefill, so on the
    *same* worker such a request hits: this cause is always a second worker's);
  - **in flight, queued** (``QUEUED``): no worker had cached it yet; the request that brings
    it waited in a worker's queue (the ceiling credits a block from its request's arrival);
  - **evicted** (``EVICTED``): cached before, evicted from every worker since. Split by a
    pooled LRU, one cache of the fleet's KV run in arrival order as the ceiling is, with the
    workers' rule (least recently used leaf first): *evicted, LRU too* where that cache also
    misses the block (the ceiling's own advantage: Belady's foresight, which no routing of
    LRU workers has), *evicted, split* where it hits it (the fleet's separate caches lost
    what the same memory pooled kept: duplicates, uneven fill, and the room the workers'
    running requests take for their prompts' tails and outputs, which neither pool has);
  - **residual** (``NEW``, ``UNSERVED``): none of these: what brought the block earlier had
    not reached a worker (not yet sent under session pacing, held in the flow-control
    queue, refused), or the request was never admitted. Reported, not hidden.

- ``p > c``: the blocks ``[c, p)`` are hits the policy got and the ceiling's run did not
  (Belady gave them up to keep blocks used more often later, or session pacing sent the
  request after a later one that brought its prefix): **beyond ceiling**, which the gap's sum
  subtracts.

So ``hit + elsewhere + prefilling + queued + evicted_lru + evicted_split + residual -
beyond_ceiling = ceiling``, token for token. Two more lines, outside that sum, count the
prefill work wasted whatever the ceiling: **duplicated**, prompt tokens a worker computed
while another worker held them (``ELSEWHERE`` or ``PREFILLING`` past the hit, inside the
ceiling or not), and **recomputed**, those plus the ones computed again after an eviction
(any block some worker had cached before). ``pooled_lru`` is the pooled LRU's own hit
total, for reference.

With a CPU tier the ceiling pools both tiers and both count as hits. LoRA adapters key a
request's blocks under its adapter on the workers but not in the ceiling, so their gap's
"new" share is the ceiling crediting another adapter's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from router.cache.block_hash import KEY_TOKENS, keys_as_tokens
from router.cache.radix_tree import RadixTree
from traces.sim.bounds import belady_hits
from traces.sim.miss_causes import ELSEWHERE, EVICTED, HIT, NEW, PREFILLING, QUEUED, UNSERVED
from traces.trace.record import BLOCK_TOKENS, TraceRequest

PARTS = ("elsewhere", "prefilling", "queued", "evicted_lru", "evicted_split", "residual")
"""The gap's parts, which with ``beyond_ceiling`` subtracted sum to it (module docstring)."""


@dataclass(frozen=True)
class HitGap:
    """One policy run's hit gap, in prompt tokens (module docstring)."""

    prompt_tokens: int
    hit: int  # the policy's cached prompt tokens
    ceiling: int  # Belady on the pooled KV
    elsewhere: int
    prefilling: int
    queued: int
    evicted_lru: int
    evicted_split: int
    residual: int
    beyond_ceiling: int
    duplicated: int
    recomputed: int
    pooled_lru: int  # the pooled LRU's hits (a reference: where "evicted" splits)

    @property
    def gap(self) -> int:
        return self.ceiling - self.hit

    @property
    def unexplained(self) -> int:
        """What the parts miss of the gap: 0 by construction (a check, not a cause)."""
        return self.gap - (sum(getattr(self, k) for k in PARTS) - self.beyond_ceiling)

    def as_dict(self) -> dict[str, float | int]:
        """Tokens, and each as a fraction of prompt tokens (``*_rate``), for results.json."""
        tokens = asdict(self) | {"gap": self.gap}
        prompt = max(1, self.prompt_tokens)
        rates = {f"{k}_rate": v / prompt for k, v in tokens.items() if k != "prompt_tokens"}
        return tokens | rates


def pooled_lru_hits(trace: Sequence[TraceRequest], capacity_blocks: int) -> np.ndarray:
    """Per request, its prefix hit in one radix cache of ``capacity_blocks`` blocks evicting
    its least recently used leaf (the workers' rule), requests in arrival order, each one's
    blocks entering after its hit is counted (as the ceiling's)."""
    tree = RadixTree(capacity_tokens=capacity_blocks * KEY_TOKENS, page_size=KEY_TOKENS)
    hits = np.zeros(len(trace), dtype=np.int64)
    for i, r in enumerate(trace):
        tokens = keys_as_tokens(r.blocks)
        hits[i] = tree.match_prefix(tokens).length // KEY_TOKENS
        tree.insert(tokens)
    return hits


def block_weights(trace: Sequence[TraceRequest], starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per block of the flat trace: its request, its position in the prompt and its prompt
    tokens (``min(512 (i+1), L) - min(512 i, L)``)."""
    request = np.repeat(np.arange(len(trace)), np.diff(starts))
    position = np.arange(int(starts[-1])) - starts[request]
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    length = inputs[request]
    weight = np.minimum((position + 1) * BLOCK_TOKENS, length) - np.minimum(
        position * BLOCK_TOKENS, length
    )
    return request, position, weight


def hit_gap(
    trace: Sequence[TraceRequest],
    states: np.ndarray,
    ceiling_blocks: np.ndarray,
    lru_blocks: np.ndarray,
) -> HitGap:
    """The gap of a run whose ledger recorded ``states`` (:mod:`traces.sim.miss_causes`), against
    the ceiling's per-request hits ``ceiling_blocks`` and the pooled LRU's ``lru_blocks``."""
    counts = np.fromiter((len(r.blocks) for r in trace), dtype=np.int64, count=len(trace))
    starts = np.zeros(len(trace) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    request, position, weight = block_weights(trace, starts)
    is_hit = states == HIT
    policy = np.bincount(request, weights=is_hit, minlength=len(trace)).astype(np.int64)
    p, c = policy[request], np.asarray(ceiling_blocks)[request]
    gap = (position >= p) & (position < c)
    beyond = (position >= c) & (position < p)
    computed = position >= p

    def tokens(mask: np.ndarray) -> int:
        return int(weight[mask].sum())

    def state(*codes: int) -> np.ndarray:
        return np.isin(states, codes)

    lru_hit = position < np.asarray(lru_blocks)[request]
    evicted = gap & state(EVICTED)
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.int64, count=len(trace))
    return HitGap(
        prompt_tokens=int(inputs.sum()),
        hit=tokens(is_hit),
        ceiling=tokens(position < c),
        elsewhere=tokens(gap & state(ELSEWHERE)),
        prefilling=tokens(gap & state(PREFILLING)),
        queued=tokens(gap & state(QUEUED)),
        evicted_lru=tokens(evicted & ~lru_hit),
        evicted_split=tokens(evicted & lru_hit),
        residual=tokens(gap & state(NEW, UNSERVED)),
        beyond_ceiling=tokens(beyond),
        duplicated=tokens(computed & state(ELSEWHERE, PREFILLING)),
        recomputed=tokens(computed & state(ELSEWHERE, PREFILLING, EVICTED)),
        pooled_lru=tokens(lru_hit),
    )


class CeilingHits:
    """The ceiling's and the pooled LRU's per-request hits of each trace, computed once for
    every policy that runs it (a capped trace is another trace)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._done: dict[int, tuple[Sequence[TraceRequest], np.ndarray, np.ndarray]] = {}

    def __call__(self, trace: Sequence[TraceRequest]) -> tuple[np.ndarray, np.ndarray]:
        known = self._done.get(id(trace))
        if known is None or known[0] is not trace:
            cap = self.capacity_blocks
            known = (trace, belady_hits(trace, cap), pooled_lru_hits(trace, cap))
            self._done[id(trace)] = known
        return known[1], known[2]

    def gap(self, trace: Sequence[TraceRequest], states: np.ndarray) -> HitGap:
        return hit_gap(trace, states, *self(trace))


def gap_metrics(gap: HitGap) -> dict[str, float]:
    """``gap``'s metrics in ``capacity`` (traces/reports/hit_gap.py's GAP_METRICS) as
    ``gap_<name>`` fractions of prompt tokens."""
    prompt = max(1, gap.prompt_tokens)
    parts = {
        "gap": gap.gap,
        "elsewhere": gap.elsewhere,
        "in_flight": gap.prefilling + gap.queued,
        "evicted": gap.evicted_lru + gap.evicted_split,
    }
    return {f"gap_{k}": v / prompt for k, v in parts.items()}

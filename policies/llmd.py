"""llmd: llm-d's endpoint picker, default profile, over its approximate prefix index.

Follows llm-d/llm-d-router @ebab6879 (2026-08), ``pkg/epp/config/loader/defaults.go``, the
profile used with no config (GIE v1.2.0's chart shipped the same weights); a baseline for
what an llm-d deployment does out of the box. Each healthy pod ``e`` is scored

    total(e) = 2 * queue(e) + 2 * kv(e) + 3 * prefix(e)      (weights not normalised)

- ``queue = (q_max - q) / (q_max - q_min)`` over the pods, 1 when all ``q`` are equal; ``q``
  is the pod's waiting-request count;
- ``kv = 1 - kv_usage_fraction``;
- ``prefix = M / N``: ``N`` the request's blocks (at most 131,072 tokens' worth), ``M`` the
  pod's matched blocks in the index: the walk goes block by block until the first block no
  pod holds, and every pod holding a block gets +1 for it (so a pod may score a block after
  missing an earlier one another pod holds);
- max-score picker: the highest total, ties at random (llm-d shuffles, then stable-sorts).

The index is llm-d's own, fed by its decisions, not by the workers: one LRU per pod, capacity
the pod's ``num_gpu_blocks`` (31,250 when unknown); after the pick every block of the request
is added to the chosen pod, in order (so under pressure a prompt's head goes before its tail,
as in llm-d); lookups do not refresh recency; nothing is removed when a request completes.

Modelling choices and deviations:

- ``q`` and the KV usage are the pod's own metrics in llm-d; we derive them from the router's
  booked state (:mod:`policies.peer_views`: waiting = requests still without a first token
  less the one in prefill; usage = in-flight KV over capacity), current where llm-d's are
  scraped, so slightly fresher than what llm-d sees.
- llm-d hashes pseudo-tokens (4 bytes of the prompt text each) in blocks of ``B = max(the
  pod's block size or 16, 64)``; we have no raw text on the hot path, so, as
  :mod:`policies.sglang_cache_aware` maps character trees onto tokens, we take a pseudo-token
  for a token and use the request's block keys: our blocks are coarser (512 tokens in
  traces), so a match is whole blocks of ours; ``M / N`` is the same fraction otherwise.
- Capacity: llm-d counts ``num_gpu_blocks`` entries of its own ``B``-token blocks, so its
  index spans ``num_gpu_blocks * B`` tokens: four times a vLLM pod's cache at its default
  16-token blocks. We keep that span, read from the view (``kv_capacity_tokens`` over the
  pod's block size, 16 when the view does not know it), in blocks of ours; it follows the
  capacity as the view corrects it.
- Blocks are added at pick time; llm-d adds them asynchronously after the pick.
- Pods are indexed by their position in the views, as every picker here keeps its state.
- Ties draw from the picker's seeded generator (``seed``), for reproducible runs.

``hit_tokens`` / ``best_hit_tokens`` come from the views, as for every picker. Branches:
``max_score`` (one best pod), ``max_score_tie`` (drawn among equal totals).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from policies.base import (
    BlockShadow,
    EngineFigures,
    Pick,
    PrefillProgress,
    RequestFeatures,
    WorkerView,
)
from policies.hits import UNHEALTHY, estimate_hits
from policies.peer_views import kv_usage, waiting_requests

QUEUE_WEIGHT = 2.0
KV_WEIGHT = 2.0
PREFIX_WEIGHT = 3.0
DEFAULT_CAPACITY_BLOCKS = 31_250
"""llm-d's LRU capacity per pod when its ``num_gpu_blocks`` is unknown."""
MIN_BLOCK_TOKENS = 64
"""llm-d's index block: ``max(the pod's block size, 64)`` pseudo-tokens."""
ENGINE_BLOCK_TOKENS = 16
"""The pod's KV block size when the view does not know it (vLLM's default)."""
MAX_PREFIX_TOKENS = 131_072
"""llm-d hashes at most ``131072 / B`` blocks of a request."""


class PodLRU:
    """One pod's blocks, least recently added first; lookups leave the order alone."""

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def add(self, blocks: Sequence[int], capacity: int) -> None:
        """Add (or refresh) ``blocks`` in order, then drop the oldest beyond ``capacity``."""
        held = self._blocks
        for block in blocks:
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
        while len(held) > capacity:
            held.popitem(last=False)


def queue_scores(waiting: Sequence[int]) -> list[float]:
    """llm-d's queue-scorer: ``(q_max - q) / (q_max - q_min)``, 1 when all are equal."""
    top, bottom = max(waiting), min(waiting)
    if top == bottom:
        return [1.0] * len(waiting)
    return [(top - q) / (top - bottom) for q in waiting]


def max_score(totals: Sequence[float], rng: random.Random) -> tuple[int, bool]:
    """The position of the best total, drawn at random among exact ties; and if it was a tie."""
    best = max(totals)
    tied = [k for k, total in enumerate(totals) if total == best]
    if len(tied) == 1:
        return tied[0], False
    return tied[rng.randrange(len(tied))], True


class LLMDPicker:
    """queue w2 + kv-cache-utilization w2 + prefix-cache w3 over llm-d's approximate index."""

    name = "llmd"
    needs = (PrefillProgress, BlockShadow, EngineFigures)

    def __init__(
        self,
        *,
        queue_weight: float = QUEUE_WEIGHT,
        kv_weight: float = KV_WEIGHT,
        prefix_weight: float = PREFIX_WEIGHT,
        capacity_blocks: int | None = None,
        seed: int | None = 0,
    ) -> None:
        if min(queue_weight, kv_weight, prefix_weight) < 0:
            raise ValueError("scorer weights must be >= 0")
        if capacity_blocks is not None and capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive (None: the pod's own)")
        self.queue_weight = queue_weight
        self.kv_weight = kv_weight
        self.prefix_weight = prefix_weight
        self.capacity_blocks = capacity_blocks  # in llm-d's blocks; None: num_gpu_blocks
        self.seed = seed
        self._rng = random.Random(seed)
        self._pods: list[PodLRU] = []

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit, matched = self.estimate(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        prefix, blocks = self.prefix_scores(request, workers, healthy, matched)
        queue = queue_scores([waiting_requests(workers[i]) for i in healthy])
        totals = [
            self.queue_weight * queue[k]
            + self.kv_weight * (1.0 - kv_usage(workers[i]))
            + self.prefix_weight * min(1.0, max(0.0, prefix[k]))
            for k, i in enumerate(healthy)
        ]
        k, tie = max_score(totals, self._rng)
        chosen = healthy[k]
        self.record(request, workers, chosen, blocks)
        return Pick(chosen, "max_score_tie" if tie else "max_score", hits[chosen], best_hit)

    def estimate(
        self, request: RequestFeatures, workers: Sequence[WorkerView]
    ) -> tuple[list[int], int, Sequence[float]]:
        """Per worker the router's hit estimate (``UNHEALTHY`` for unhealthy ones), the best,
        and the tokens the prefix scorer counts as matched (here the estimates themselves,
        which only :meth:`prefix_scores` of a subclass reads)."""
        hits, best = estimate_hits(request, workers)
        return hits, best, hits

    def prefix_scores(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        healthy: list[int],
        matched: Sequence[float],
    ) -> tuple[list[float], Sequence[int]]:
        """``M / N`` per healthy pod from the index, and the blocks it hashed."""
        size = request.block_size
        blocks = request.blocks[: max(1, MAX_PREFIX_TOKENS // size)]
        total = len(blocks)
        pods = self._pods
        while len(pods) < len(workers):
            pods.append(PodLRU())
        matched = [0] * len(healthy)
        for block in blocks:
            holders = [k for k, i in enumerate(healthy) if block in pods[i]]
            if not holders:
                break
            for k in holders:
                matched[k] += 1
        return [m / total if total else 0.0 for m in matched], blocks

    def record(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        chosen: int,
        blocks: Sequence[int],
    ) -> None:
        """After the pick: every hashed block of the request goes to the chosen pod."""
        if blocks:
            self._pods[chosen].add(blocks, self.pod_capacity(workers[chosen], request.block_size))

    def pod_capacity(self, view: WorkerView, block_size: int) -> int:
        """The pod's LRU capacity in blocks of ``block_size`` tokens (at least 1)."""
        engine_block = view.worker_block_size or ENGINE_BLOCK_TOKENS
        llmd_block = max(engine_block, MIN_BLOCK_TOKENS)
        entries = self.capacity_blocks
        if entries is None:
            entries = view.kv_capacity_tokens // engine_block or DEFAULT_CAPACITY_BLOCKS
        return max(1, entries * llmd_block // block_size)

"""tiered: the peers' rule for tiered KV caches, fixed credits per tier (a baseline).

vllm-router 0.1.17's ``kv_aware`` and Dynamo's newer cost (../shared/peers/ROUTING_ALGORITHMS.md,
section 2; the issue that added tiers quotes vllm-router's credits) price a request's overlap
on each tier as a fixed fraction of a GPU hit, whatever the tier's bandwidth:

    credit_w = gpu_overlap_w + host_credit * cpu_overlap_w                  (blocks of B tokens)
    cost_w   = prefill_load_scale * prefill_blocks_w + decode_blocks_w
    prefill_blocks_w     = active_prefill_tokens_w / B + max(ISL / B - credit_w, 0)
    decode_blocks_w      = |active_blocks_w| + |request blocks not already active on w|

and the cheapest wins (ties at random, seeded). ``host_credit`` is vllm-router's 0.8 (Dynamo
uses 0.75). Overlaps are the router's per-tier shadows (``WorkerState.estimate_tiers``; the
peers read KV events that name each block's medium), so this picker and ``ttft`` see the
same tiers and differ only in how they price them: ``ttft`` charges a CPU hit its load time
at the tier's bandwidth. On workers without a tier (or with ``--router-tiers off``) the cost
is Dynamo's classic one with the router's shadow as the overlap.

Branches: ``cost`` (one cheapest worker), ``cost_tie`` (drawn among equal costs).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import BlockShadow, CPUTier, Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_tier_split
from policies.peer_views import active_blocks, new_active_blocks

HOST_CREDIT = 0.8
PREFILL_LOAD_SCALE = 1.0


class TieredPicker:
    """argmin of uncredited prefill blocks plus decode blocks, fixed credits per tier."""

    name = "tiered"
    needs = (CPUTier, BlockShadow)

    def __init__(
        self,
        *,
        host_credit: float = HOST_CREDIT,
        prefill_load_scale: float = PREFILL_LOAD_SCALE,
        seed: int | None = 0,
    ) -> None:
        if not 0.0 <= host_credit <= 1.0 or prefill_load_scale < 0:
            raise ValueError("host_credit must be in [0, 1] and prefill_load_scale >= 0")
        self.host_credit = host_credit
        self.prefill_load_scale = prefill_load_scale
        self.seed = seed
        self._rng = random.Random(seed)

    def costs(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        cpu_hits: Sequence[int],
    ) -> list[float]:
        """Each worker's cost (inf for unhealthy ones) from its GPU and CPU-tier hits."""
        size = request.block_size
        length = request.input_length
        costs = []
        for view, gpu, cpu in zip(workers, hits, cpu_hits, strict=True):
            if gpu == UNHEALTHY:
                costs.append(float("inf"))
                continue
            credit = (gpu + self.host_credit * cpu) / size
            prefill = view.pending_prefill_tokens / size + max(length / size - credit, 0.0)
            decode = active_blocks(view) + new_active_blocks(view, request.blocks)
            costs.append(self.prefill_load_scale * prefill + decode)
        return costs

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, cpu_hits, best_hit = estimate_tier_split(request, workers)
        costs = self.costs(request, workers, hits, cpu_hits or [0] * len(hits))
        low = min(costs)
        tied = [i for i, cost in enumerate(costs) if cost == low]
        chosen = tied[self._rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
        return Pick(chosen, "cost_tie" if len(tied) > 1 else "cost", hits[chosen], best_hit)

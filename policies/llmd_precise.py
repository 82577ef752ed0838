"""llmd_precise: llm-d's precise prefix-cache routing, the sample precise profile.

Follows llm-d/llm-d-router @ebab6879 (2026-08): ``deploy/config/``'s precise sample, prefix
from the pods' KV events (llm-d/llm-d-kv-cache) with weight 2, kv-cache-utilization 1,
queue 1, max-score picker:

    total(e) = 2 * prefix(e) + 1 * kv(e) + 1 * queue(e)

- ``prefix = matched / total``: the longest prefix of the request the pod holds, block by
  block, over the request's blocks, each block weighted by the best tier that holds it (GPU
  1.0, CPU ``cpu_weight`` 0.8, llm-d's defaults);
- ``kv`` and ``queue`` as in :mod:`policies.llmd`; ties at random.

Modelling choices and deviations:

- The pod's holdings are what the router itself knows of them, the view's estimate: its
  KV-event index while synced (the simulator's ``--kv-events``, the proxy's precise mode),
  else its shadow. That is llm-d's precise path when events flow; without them it is our
  shadow, not llm-d's. ``matched / total`` is counted in tokens (hit tokens over the prompt),
  the same fraction as llm-d's blocks at the view's granularity.
- Tiers as the router's views see them: the GPU prefix, then what the worker's CPU tier holds
  after it (:func:`policies.hits.estimate_tier_split`, the per-tier shadows, or the KV-event
  index's split); without a tier every matched block weighs 1.0.
- No index of its own: nothing is recorded at pick time (llm-d's precise scorer learns only
  from events).
- Waiting count and KV usage from the booked state, as in :mod:`policies.llmd`.

Branches: ``max_score`` and ``max_score_tie``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import CPUTier, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_tier_split
from policies.llmd import LLMDPicker

PREFIX_WEIGHT = 2.0
KV_WEIGHT = 1.0
QUEUE_WEIGHT = 1.0
CPU_WEIGHT = 0.8
"""llm-d's weight of a block held in a pod's CPU tier (a GPU block weighs 1.0)."""


class LLMDPrecisePicker(LLMDPicker):
    """prefix (from the views' exact estimates) w2 + kv-cache-utilization w1 + queue w1."""

    name = "llmd_precise"
    needs = (*LLMDPicker.needs, CPUTier)

    def __init__(
        self,
        *,
        queue_weight: float = QUEUE_WEIGHT,
        kv_weight: float = KV_WEIGHT,
        prefix_weight: float = PREFIX_WEIGHT,
        cpu_weight: float = CPU_WEIGHT,
        seed: int | None = 0,
    ) -> None:
        if not 0.0 <= cpu_weight <= 1.0:
            raise ValueError("cpu_weight must be in [0, 1]")
        super().__init__(
            queue_weight=queue_weight, kv_weight=kv_weight, prefix_weight=prefix_weight, seed=seed
        )
        self.cpu_weight = cpu_weight

    def estimate(
        self, request: RequestFeatures, workers: Sequence[WorkerView]
    ) -> tuple[list[int], int, Sequence[float]]:
        """The GPU hits (what :class:`~policies.base.Pick` reports, as ``tiered``'s do), the
        best, and the matched tokens: the GPU hit plus ``cpu_weight`` times the CPU tier's."""
        hits, cpu_hits, best = estimate_tier_split(request, workers)
        if cpu_hits is None:
            return hits, best, hits
        weight = self.cpu_weight
        matched = [
            h + weight * c if h != UNHEALTHY else h for h, c in zip(hits, cpu_hits, strict=True)
        ]
        return hits, best, matched

    def prefix_scores(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        healthy: list[int],
        matched: Sequence[float],
    ) -> tuple[list[float], Sequence[int]]:
        total = request.input_length
        if total <= 0:
            return [0.0] * len(healthy), ()
        return [min(matched[i], total) / total for i in healthy], ()

    def record(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        chosen: int,
        blocks: Sequence[int],
    ) -> None:
        """Nothing: the precise path learns from the workers' events only."""

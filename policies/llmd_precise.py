"""llmd_precise: llm-d's precise prefix-cache routing, the sample precise profile.

Follows llm-d/llm-d-router @ebab6879 (2026-08): ``deploy/config/``'s precise sample, prefix
from the pods' KV events (llm-d/llm-d-kv-cache) with weight 2, kv-cache-utilization 1,
queue 1, max-score picker:

    total(e) = 2 * prefix(e) + 1 * kv(e) + 1 * queue(e)

- ``prefix = matched / total``: the longest prefix of the request the pod holds, block by
  block, over the request's blocks (each block weighted by its best tier in llm-d: GPU 1.0,
  CPU 0.8);
- ``kv`` and ``queue`` as in :mod:`policies.llmd`; ties at random.

Modelling choices and deviations:

- The pod's holdings are what the router itself knows of them, the view's estimate: its
  KV-event index while synced (the simulator's ``--kv-events``, the proxy's precise mode),
  else its shadow. That is llm-d's precise path when events flow; without them it is our
  shadow, not llm-d's. ``matched / total`` is counted in tokens (hit tokens over the prompt),
  the same fraction as llm-d's blocks at the view's granularity.
- One tier: the views know GPU-resident prefixes only (no CPU offload is modelled), so every
  matched block weighs 1.0.
- No index of its own: nothing is recorded at pick time (llm-d's precise scorer learns only
  from events).
- Waiting count and KV usage from the booked state, as in :mod:`policies.llmd`.

Branches: ``max_score`` and ``max_score_tie``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import RequestFeatures, WorkerView
from policies.llmd import LLMDPicker

PREFIX_WEIGHT = 2.0
KV_WEIGHT = 1.0
QUEUE_WEIGHT = 1.0


class LLMDPrecisePicker(LLMDPicker):
    """prefix (from the views' exact estimates) w2 + kv-cache-utilization w1 + queue w1."""

    name = "llmd_precise"

    def __init__(
        self,
        *,
        queue_weight: float = QUEUE_WEIGHT,
        kv_weight: float = KV_WEIGHT,
        prefix_weight: float = PREFIX_WEIGHT,
        seed: int | None = 0,
    ) -> None:
        super().__init__(
            queue_weight=queue_weight, kv_weight=kv_weight, prefix_weight=prefix_weight, seed=seed
        )

    def prefix_scores(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        healthy: list[int],
        hits: list[int],
    ) -> tuple[list[float], Sequence[int]]:
        total = request.input_length
        if total <= 0:
            return [0.0] * len(healthy), ()
        return [min(hits[i], total) / total for i in healthy], ()

    def record(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        chosen: int,
        blocks: Sequence[int],
    ) -> None:
        """Nothing: the precise path learns from the workers' events only."""

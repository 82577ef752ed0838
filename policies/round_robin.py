"""round_robin: cycle through the healthy workers; ignores cache and load (baseline).

The counter advances once per pick and indexes the list of currently healthy workers, as
SGLang's router does, so an unhealthy worker is skipped rather than leaving a gap.
Branch: ``round_robin``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits


class RoundRobinPicker:
    """Worker ``k mod healthy`` on the k-th pick."""

    name = "round_robin"
    needs = ()  # the core view alone

    def __init__(self) -> None:
        self._count = 0

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        chosen = healthy[self._count % len(healthy)]
        self._count += 1
        return Pick(chosen, "round_robin", hits[chosen], best_hit)

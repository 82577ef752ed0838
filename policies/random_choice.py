"""random: a uniformly random healthy worker from a seeded generator (baseline).

Seeded so simulator runs are reproducible; each picker owns its generator. (The module is
not named ``random`` so it can never shadow the standard library.) Branch: ``random``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits


class RandomPicker:
    """Uniform choice among healthy workers."""

    name = "random"

    def __init__(self, *, seed: int | None = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        chosen = healthy[self._rng.randrange(len(healthy))]
        return Pick(chosen, "random", hits[chosen], best_hit)

"""random: a uniformly random healthy worker from a seeded generator (baseline).

Seeded so simulator runs are reproducible; each picker owns its generator. (The module is
not named ``random`` so it can never shadow the standard library.) Branch: ``random``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits


class SeededPicker:
    """A picker that draws from a generator of its own, seeded for reproducible runs."""

    needs = ()  # the core view alone

    def __init__(self, *, seed: int | None = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    @staticmethod
    def healthy(
        request: RequestFeatures, workers: Sequence[WorkerView]
    ) -> tuple[list[int], list[int], int]:
        """(healthy worker indices, every worker's hit, the best hit) for ``request``."""
        hits, best_hit = estimate_hits(request, workers)
        return [i for i, hit in enumerate(hits) if hit != UNHEALTHY], hits, best_hit


class RandomPicker(SeededPicker):
    """Uniform choice among healthy workers."""

    name = "random"

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        healthy, hits, best_hit = self.healthy(request, workers)
        chosen = healthy[self._rng.randrange(len(healthy))]
        return Pick(chosen, "random", hits[chosen], best_hit)

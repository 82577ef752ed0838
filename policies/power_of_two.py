"""power_of_two: sample two distinct healthy workers, send to the less loaded (baseline).

Load is ``num_requests`` (the router's own in-flight count, as SGLang's router uses when it
has no load monitor); on equal load the first sampled wins, as in SGLang (``load1 <= load2``).
With one healthy worker it is chosen. The generator is seeded for reproducible runs.
Branch: ``power_of_two``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.random_choice import SeededPicker


class PowerOfTwoPicker(SeededPicker):
    """The less loaded of two random healthy workers."""

    name = "power_of_two"

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        healthy, hits, best_hit = self.healthy(request, workers)
        if len(healthy) == 1:
            chosen = healthy[0]
        else:
            a, b = self._rng.sample(healthy, 2)
            chosen = a if workers[a].num_requests <= workers[b].num_requests else b
        return Pick(chosen, "power_of_two", hits[chosen], best_hit)

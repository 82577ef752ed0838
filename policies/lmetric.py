"""lmetric: the seed 002 main baseline, pure per-request LMetric scoring.

``score = (pending_prefill_tokens + max(0, input_length - cache_hit)) * num_requests``;
the smallest score wins. A cache hit shrinks the new prefill, so a warm worker wins at
equal load; the batch-size factor steers away from busy workers. No session affinity.

Ties (see :mod:`policies.tiebreak`), default ``"multikey"``:

- ``"multikey"``: the unified 4-key order ``(score, new_prefill, num_requests)``, then a
  round-robin counter among exact ties. Needed because with every worker idle
  (``num_requests == 0``) every score is 0, cache hit or not: ``new_prefill`` then sends the
  request to the warm worker, and cold traffic is spread round-robin.
- ``"first"``: the seed's ``pick_lmetric`` exactly (strict ``<`` on score, first-seen wins).

Branches: ``score`` (one best worker), ``tie_rr`` (the counter chose among exact ties),
``tie_first`` (several workers shared the best score; the lowest index won).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.tiebreak import FIRST, MULTIKEY, RoundRobinCounter, TieBreak, check_tie_break


class LMetricPicker:
    """Smallest ``(pending_prefill + new_prefill) * num_requests`` wins."""

    name = "lmetric"
    needs = ()  # the core view alone

    def __init__(self, *, tie_break: TieBreak = MULTIKEY) -> None:
        self.tie_break = check_tie_break(tie_break)
        self._rr = RoundRobinCounter()

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        chosen, branch = self.select(request.input_length, workers, hits)
        return Pick(chosen, branch, hits[chosen], best_hit)

    def select(
        self, input_length: int, workers: Sequence[WorkerView], hits: Sequence[int]
    ) -> tuple[int, str]:
        """Best worker index and branch, given precomputed hits (``UNHEALTHY`` skipped).

        Shared with :mod:`policies.unified`, whose fallback is this scoring; at least one
        worker must be healthy (``estimate_hits`` guarantees it).
        """
        if self.tie_break == FIRST:
            return _select_first(input_length, workers, hits)
        best_key: tuple[int, int, int] | None = None
        tied: list[int] = []
        for i, worker in enumerate(workers):
            hit = hits[i]
            if hit == UNHEALTHY:
                continue
            key = score_key(input_length, worker, hit)
            if best_key is None or key < best_key:
                best_key = key
                tied = [i]
            elif key == best_key:
                tied.append(i)
        if len(tied) == 1:
            return tied[0], "score"
        return self._rr.choose(tied), "tie_rr"


def score_key(input_length: int, worker: WorkerView, hit: int) -> tuple[int, int, int]:
    """``(score, new_prefill, num_requests)``: the seed's score, then the multikey tie-break."""
    new_prefill = max(input_length - hit, 0)
    batch = worker.num_requests
    return (worker.pending_prefill_tokens + new_prefill) * batch, new_prefill, batch


def _select_first(
    input_length: int, workers: Sequence[WorkerView], hits: Sequence[int]
) -> tuple[int, str]:
    """The seed's loop verbatim: strict ``<`` on score, so the first-seen minimum wins."""
    best, best_score, ties = -1, 0, 0
    for i, worker in enumerate(workers):
        hit = hits[i]
        if hit == UNHEALTHY:
            continue
        score = score_key(input_length, worker, hit)[0]
        if best < 0 or score < best_score:
            best, best_score, ties = i, score, 1
        elif score == best_score:
            ties += 1
    return best, ("tie_first" if ties > 1 else "score")

"""load_only: fewest ``num_requests`` wins; no cache awareness, no affinity (seed 002 §2).

The B3 control that isolates the contribution of cache awareness (lmetric vs load_only).

Ties (see :mod:`policies.tiebreak`), default ``"first"`` as in the seed's ``min()``: the
lowest index among the least loaded wins, which pins an idle fleet on worker 0 (the seed's
"unintentional stickiness"; B3's load_only APC of 54.1% is partly that). ``"multikey"``
goes round-robin among the least loaded instead; there are no secondary keys.

Branches: ``least_load``, ``tie_first``, ``tie_rr``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.tiebreak import FIRST, RoundRobinCounter, TieBreak, check_tie_break


def least_loaded(
    workers: Sequence[WorkerView], hits: Sequence[int], tie_break: str, rr: RoundRobinCounter
) -> tuple[int, str]:
    """Index of a healthy worker with the fewest requests, and the branch that chose it."""
    best = -1
    tied: list[int] = []
    for i, worker in enumerate(workers):
        if hits[i] == UNHEALTHY:
            continue
        n = worker.num_requests
        if not tied or n < best:
            best = n
            tied = [i]
        elif n == best:
            tied.append(i)
    if len(tied) == 1:
        return tied[0], "least_load"
    if tie_break == FIRST:
        return tied[0], "tie_first"
    return rr.choose(tied), "tie_rr"


class LoadOnlyPicker:
    """Fewest requests wins."""

    name = "load_only"
    needs = ()  # the core view alone

    def __init__(self, *, tie_break: TieBreak = FIRST) -> None:
        self.tie_break = check_tie_break(tie_break)
        self._rr = RoundRobinCounter()

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        chosen, branch = least_loaded(workers, hits, self.tie_break, self._rr)
        return Pick(chosen, branch, hits[chosen], best_hit)

"""sticky: hard session affinity (seed 002 §3), the upper bound on locality.

A bound session always goes to its worker, whatever the load; a new session goes to the
least loaded worker (:func:`policies.load_only.least_loaded`, ties ``"first"`` by default
as in the seed's ``min()``) and is bound there.

Where the seed is silent:

- Bindings live in a bounded LRU table (:class:`~policies.sessions.SessionTable`); a session
  forgotten there is routed as new.
- A request without a session id is routed like a new session but binds nothing.
- A session bound to an unhealthy worker is rebound to the least loaded healthy worker
  (the only break of a binding: the seed never breaks one, but its workers never died).
- A binding to an index beyond the current worker list is treated as unbound.

Branches: ``affinity_stick``, ``affinity_new``, ``affinity_unhealthy``, ``no_session``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.load_only import least_loaded
from policies.sessions import DEFAULT_MAX_SESSIONS, SessionTable
from policies.tiebreak import FIRST, RoundRobinCounter, TieBreak, check_tie_break


class StickyPicker:
    """Once bound, a session never leaves its (healthy) worker."""

    name = "sticky"
    needs = ()  # the core view alone

    def __init__(
        self, *, max_sessions: int = DEFAULT_MAX_SESSIONS, tie_break: TieBreak = FIRST
    ) -> None:
        self.tie_break = check_tie_break(tie_break)
        self.sessions = SessionTable(max_sessions)
        self._rr = RoundRobinCounter()

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        session = request.session_id
        if session is None:
            branch = "no_session"
        else:
            bound = self.sessions.get(session)
            if bound is None or bound >= len(workers):
                branch = "affinity_new"
            elif hits[bound] != UNHEALTHY:
                return Pick(bound, "affinity_stick", hits[bound], best_hit)
            else:
                branch = "affinity_unhealthy"
        chosen, _ = least_loaded(workers, hits, self.tie_break, self._rr)
        if session is not None:
            self.sessions.bind(session, chosen)
        return Pick(chosen, branch, hits[chosen], best_hit)

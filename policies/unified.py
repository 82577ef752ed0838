"""unified: gated session affinity with LMetric fallback (seed 002 §4).

A bound session sticks to its worker only when both gates hold:

- warm: ``hit / max(input_length, 1) > hit_ratio_gate`` (default 0.5, strict: exactly 0.5
  falls back);
- not overloaded: ``num_requests <= overload_factor * max(mean num_requests, 1)`` (default
  factor 2.0, inclusive: exactly 2x the mean sticks). The mean is over healthy workers,
  the bound worker included. Both gates are evaluated in integers/products, not by
  dividing, so "exactly" means exactly.

Otherwise the request goes to LMetric (:meth:`policies.lmetric.LMetricPicker.select`) with
the 4-key tie-break ``(score, new_prefill, num_requests)`` + round-robin by default
(``tie_break="first"`` gives the seed's plain first-seen LMetric instead).

Where the seed is silent:

- The seed's pseudocode reads the affinity table but never writes it. We bind the session
  to whichever worker this pick chose, after a fallback too: the request's prefix is about
  to be cached there, so that is where the next turn's warm gate can pass; keeping the old
  binding would test a worker whose copy of the session grows stale.
- Requests without a session id go straight to LMetric and bind nothing.
- A session bound to an unhealthy worker falls back to LMetric and is rebound; a binding to
  an index beyond the current worker list is treated as no binding.
- Bindings live in a bounded LRU table (:class:`~policies.sessions.SessionTable`).

Branches: ``affinity_stick``; when a bound session falls back, why: ``affinity_cold``
(checked first, so a cold *and* overloaded worker reports cold), ``affinity_overloaded``,
``affinity_unhealthy``; for unbound sessions and requests without id, LMetric's own
``score`` / ``tie_rr`` / ``tie_first``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.lmetric import LMetricPicker
from policies.sessions import DEFAULT_MAX_SESSIONS, SessionTable
from policies.tiebreak import MULTIKEY, TieBreak

OVERLOAD_FACTOR = 2.0
"""Stick only while the bound worker has at most this many times the mean load."""

HIT_RATIO_GATE = 0.5
"""Stick only while the bound worker's estimated hit ratio is above this."""


class UnifiedPicker:
    """Stick when warm and not overloaded; otherwise LMetric with the 4-key tie-break."""

    name = "unified"
    needs = ()  # the core view alone

    def __init__(
        self,
        *,
        overload_factor: float = OVERLOAD_FACTOR,
        hit_ratio_gate: float = HIT_RATIO_GATE,
        tie_break: TieBreak = MULTIKEY,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        if overload_factor <= 0:
            raise ValueError("overload_factor must be positive")
        self.overload_factor = overload_factor
        self.hit_ratio_gate = hit_ratio_gate
        self.sessions = SessionTable(max_sessions)
        self._lmetric = LMetricPicker(tie_break=tie_break)

    @property
    def tie_break(self) -> str:
        return self._lmetric.tie_break

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        session = request.session_id
        reason = None
        if session is not None:
            bound = self.sessions.get(session)
            if bound is not None and bound < len(workers):
                reason = self._gate(request.input_length, workers, hits, bound)
                if reason is None:
                    return Pick(bound, "affinity_stick", hits[bound], best_hit)
        chosen, branch = self._lmetric.select(request.input_length, workers, hits)
        if session is not None:
            self.sessions.bind(session, chosen)
        return Pick(chosen, reason or branch, hits[chosen], best_hit)

    def _gate(
        self, input_length: int, workers: Sequence[WorkerView], hits: list[int], bound: int
    ) -> str | None:
        """None if the session may stick to ``bound``, else the reason it may not."""
        hit = hits[bound]
        if hit == UNHEALTHY:
            return "affinity_unhealthy"
        if not hit > self.hit_ratio_gate * max(input_length, 1):
            return "affinity_cold"
        total = healthy = 0
        for i, worker in enumerate(workers):
            if hits[i] != UNHEALTHY:
                total += worker.num_requests
                healthy += 1
        # num_requests <= factor * max(total / healthy, 1), without the division
        if workers[bound].num_requests * healthy > self.overload_factor * max(total, healthy):
            return "affinity_overloaded"
        return None

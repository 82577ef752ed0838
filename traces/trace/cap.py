"""Seed 002's capped trace: every session cut to its first ``max_turns`` turns.

Comparing a policy on the full and the capped trace isolates how much of its hot-spotting is
caused by heavy-tail sessions (seed 002, §5 "capped"). Rules, as in ``build_capped_trace``:
group by session, order each session by ``(turn, timestamp)`` and keep the first
``max_turns``, then restore wall-clock order. Ties keep the input order (``request_id``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from traces.trace.record import TraceRequest

DEFAULT_MAX_TURNS = 8


def build_capped_trace(
    requests: Iterable[TraceRequest], max_turns: int = DEFAULT_MAX_TURNS
) -> list[TraceRequest]:
    """The kept requests (the same objects, arrivals and ids untouched) in arrival order."""
    if max_turns < 1:
        raise ValueError("max_turns must be >= 1")
    by_session: dict[str, list[TraceRequest]] = defaultdict(list)
    for req in requests:
        by_session[req.session_id].append(req)
    kept: list[TraceRequest] = []
    for turns in by_session.values():
        turns.sort(key=lambda r: (r.turn, r.arrival, r.request_id))
        kept.extend(turns[:max_turns])
    kept.sort(key=lambda r: (r.arrival, r.request_id))
    return kept

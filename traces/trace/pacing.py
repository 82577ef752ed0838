"""When a trace's requests are sent: open loop, or session-paced (each turn after its answer).

``open``: every request at its recorded arrival (divided by the speedup), whether or not the
session's previous turn has been answered. That is a fixed offered load, but for multi-turn
traces it is not what clients do once the fleet falls behind: an agent (or a person) sends the
next turn only after reading the previous answer. Open-loop replay of an overloaded fleet
queues a session's next turn behind its own previous turn, on the worker that is about to
compute the prefix both share, and by the time the next turn is admitted that prefix has been
evicted again: a workload that cannot occur.

``session``: a turn is sent at its recorded arrival, but never before its session's previous
turn has finished plus the client's pause (``think_s`` where the format records it, as Weka's
``think_time``; 0 otherwise), both divided by the speedup. When the fleet keeps up with the
trace this is the open-loop schedule; when it falls behind, each session slows down instead of
piling up. This is how the Weka traces' own replayer (kv-cache-tester's
``trace_replay_tester``) sends them: a user's next request only after the previous one
completed, then its think time.

Sessions are the trace's ``session_id``; requests without one (``""``: Azure, Bailian) are
never held. Shared by the offline simulator and the live replay, so both send the same
schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from traces.trace.record import TraceRequest

Pacing = Literal["open", "session"]
PACINGS: tuple[Pacing, ...] = ("open", "session")


def predecessors(trace: Sequence[TraceRequest], pacing: Pacing = "session") -> list[int]:
    """For each request, the index of the request it waits for (-1: none): its session's
    previous request in session pacing, none in open loop.

    ``trace`` is in arrival order (as every loader returns it).
    """
    if pacing not in PACINGS:
        raise ValueError(f"unknown pacing {pacing!r}")
    last: dict[str, int] = {}
    out = [-1] * len(trace)
    if pacing == "open":
        return out
    for i, req in enumerate(trace):
        session = req.session_id
        if session:
            out[i] = last.get(session, -1)
            last[session] = i
    return out


def release_time(req: TraceRequest, speedup: float, previous_finish: float) -> float:
    """When a session-paced request with a predecessor is sent: its recorded arrival, or its
    session's previous turn's finish (on the run's clock) plus the client's pause."""
    return max(req.arrival / speedup, previous_finish + (req.think_s or 0.0) / speedup)

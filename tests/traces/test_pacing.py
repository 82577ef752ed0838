"""Session pacing: who waits for whom, and when a waiting turn is sent."""

from __future__ import annotations

import pytest

from traces.trace.pacing import predecessors, release_time
from traces.trace.record import TraceRequest


def req(arrival: float, session: str, think: float | None = None) -> TraceRequest:
    return TraceRequest(arrival, session, 0, 512, 4, (1,), think_s=think)


def test_each_turn_waits_for_its_sessions_previous_turn_only():
    trace = [req(0, "a"), req(1, "b"), req(2, "a"), req(3, ""), req(4, ""), req(5, "a")]
    # requests without a session (Azure, Bailian) are never held
    assert predecessors(trace) == [-1, -1, 0, -1, -1, 2]
    assert predecessors(trace, "open") == [-1] * 6  # open loop: nobody waits
    with pytest.raises(ValueError, match="unknown pacing"):
        predecessors(trace, "closed")  # type: ignore[arg-type]


def test_a_turn_goes_at_its_arrival_or_after_the_answer_and_the_think_time():
    turn = req(100.0, "a", think=8.0)
    # the fleet kept up: the recorded schedule (sped up 4x)
    assert release_time(turn, 4.0, previous_finish=10.0) == pytest.approx(25.0)
    # it fell behind: the answer came at 30 s, then the client's (sped-up) 8 s pause
    assert release_time(turn, 4.0, previous_finish=30.0) == pytest.approx(32.0)
    # no recorded think time: at once after the answer
    assert release_time(req(100.0, "a"), 1.0, previous_finish=130.0) == pytest.approx(130.0)

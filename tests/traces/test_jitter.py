"""Replays with jittered arrivals (traces/trace/jitter.py)."""

from __future__ import annotations

import pytest

from traces.trace.jitter import jittered
from traces.trace.record import TraceRequest


def request(arrival: float, session: str = "", turn: int = 0) -> TraceRequest:
    return TraceRequest(arrival, session, turn, 512, 8, (hash((session, turn, arrival)),))


def test_each_arrival_moves_by_at_most_the_fraction_of_the_mean_gap() -> None:
    trace = [request(10.0 * i, f"s{i}") for i in range(50)]  # one turn each: mean gap 10 s
    out = jittered(trace, seed=1, fraction=0.5)
    assert len(out) == len(trace)
    assert [r.request_id for r in out] == list(range(len(trace)))
    assert [r.arrival for r in out] == sorted(r.arrival for r in out)
    moved = {r.session_id: r.arrival for r in out}
    shifts = [moved[r.session_id] - r.arrival for r in trace]
    assert all(abs(s) <= 5.0 for s in shifts)
    assert max(shifts) > 2.5 and min(shifts) < -2.5  # moved, both ways
    assert min(moved.values()) >= 0.0


def test_a_sessions_turns_keep_their_order() -> None:
    # a session's turns 0.1 s apart, the trace's mean gap ~10 s: jitter alone would swap them
    trace = sorted(
        [request(100.0 * i, f"s{i}", 0) for i in range(10)]
        + [request(100.0 * i + 0.1, f"s{i}", 1) for i in range(10)],
        key=lambda r: r.arrival,
    )
    for seed in range(5):
        out = jittered(trace, seed=seed, fraction=1.0)
        for s in range(10):
            turns = [r.turn for r in out if r.session_id == f"s{s}"]
            assert turns == [0, 1]


def test_seeded_and_off_at_zero() -> None:
    trace = [request(float(i)) for i in range(20)]
    assert jittered(trace, 3, 0.5) == jittered(trace, 3, 0.5)
    assert jittered(trace, 3, 0.5) != jittered(trace, 4, 0.5)
    assert jittered(trace, 3, 0.0) == trace
    assert jittered(trace[:1], 3, 0.5) == trace[:1]
    assert sum(r.input_length for r in jittered(trace, 3, 0.5)) == pytest.approx(512 * 20)

import itertools
from collections import Counter, defaultdict

import pytest

from traces.trace.cap import build_capped_trace
from traces.trace.record import TraceRequest, finalize


def seed_002(requests: list[TraceRequest], max_turns: int) -> list[TraceRequest]:
    """Seed 002's build_capped_trace pseudocode, transcribed."""
    by_session = defaultdict(list)
    for r in requests:
        by_session[r.session_id].append(r)
    capped = []
    for turns in by_session.values():
        turns.sort(key=lambda t: (t.turn, t.arrival))
        capped.extend(turns[:max_turns])
    capped.sort(key=lambda t: t.arrival)
    return capped


def make(rows: list[tuple[str, int, float]]) -> list[TraceRequest]:
    return finalize(TraceRequest(t, s, turn, 100, 10, ()) for s, turn, t in rows)


def test_first_turns_by_turn_then_timestamp() -> None:
    requests = make(
        [
            ("a", 3, 0.0),  # turn 3 logged before turns 1 and 2
            ("a", 1, 1.0),
            ("b", 1, 1.5),
            ("a", 2, 2.0),
            ("a", 2, 2.5),  # duplicate turn 2: the later one sorts after
            ("b", 2, 3.0),
            ("a", 4, 4.0),
        ]
    )
    kept = build_capped_trace(requests, max_turns=3)
    assert [(r.session_id, r.turn, r.arrival) for r in kept] == [
        ("a", 1, 1.0),
        ("b", 1, 1.5),
        ("a", 2, 2.0),
        ("a", 2, 2.5),
        ("b", 2, 3.0),
    ]  # a's turns 3 and 4 are cut although turn 3 came first; wall-clock order restored
    assert build_capped_trace(requests, max_turns=1) == [requests[1], requests[2]]
    assert build_capped_trace(requests, max_turns=100) == requests


def test_rejects_non_positive_cap() -> None:
    with pytest.raises(ValueError):
        build_capped_trace([], max_turns=0)


def test_real_mooncake_against_seed_002(conversation: list[TraceRequest]) -> None:
    kept = build_capped_trace(conversation, max_turns=8)
    sizes = Counter(r.session_id for r in conversation)
    assert len(kept) == sum(min(n, 8) for n in sizes.values()) == 11_712
    assert max(Counter(r.session_id for r in kept).values()) == 8
    assert all(
        (a.arrival, a.request_id) < (b.arrival, b.request_id) for a, b in itertools.pairwise(kept)
    )
    reference = seed_002(list(conversation), 8)
    # same requests; equal timestamps (ms resolution) keep the trace's order instead of the
    # grouped-by-session order the pseudocode's stable sort leaves
    assert kept == sorted(reference, key=lambda r: (r.arrival, r.request_id))
    assert build_capped_trace(kept, 8) == kept  # idempotent

import pytest

from traces.trace.record import TraceRequest
from traces.trace.sessions import infer_sessions


def reqs(*blocks: tuple[int, ...]) -> list[TraceRequest]:
    return [
        TraceRequest(float(i), "", 0, 512 * len(b), 1, b, request_id=i)
        for i, b in enumerate(blocks)
    ]


def sessions_and_turns(requests: list[TraceRequest]) -> list[tuple[str, int]]:
    return [(r.session_id, r.turn) for r in requests]


def test_sharing_only_the_system_block_starts_new_sessions() -> None:
    rs = reqs((0, 1, 2), (0, 3), (0, 4, 5))
    assert infer_sessions(rs) == 3
    assert sessions_and_turns(rs) == [("0", 1), ("1", 1), ("2", 1)]


def test_continuation_becomes_next_turn() -> None:
    rs = reqs((0, 1), (0, 9), (0, 1, 2, 3), (0, 1, 2, 3, 4, 5))
    assert infer_sessions(rs) == 2
    assert sessions_and_turns(rs) == [("0", 1), ("1", 1), ("0", 2), ("0", 3)]


def test_longest_shared_prefix_wins_then_most_recent() -> None:
    # request 3 shares 3 blocks with request 1 and 2 with request 2: parent is request 1.
    # request 2 shares 2 blocks with requests 0 and 1: the most recent (1) is its parent.
    rs = reqs((0, 1), (0, 1, 2, 3), (0, 1, 7), (0, 1, 2, 8))
    infer_sessions(rs)
    assert [r.turn for r in rs] == [1, 2, 3, 3]
    # request 3 shares 2 blocks with requests 0, 1 and 2: the most recent one (2) is its parent.
    rs = reqs((0, 1), (0, 1, 2), (0, 1, 2, 5), (0, 1, 4))
    infer_sessions(rs)
    assert [r.turn for r in rs] == [1, 2, 3, 4]


def test_min_shared_blocks() -> None:
    rs = reqs((0, 1), (0, 2))
    assert infer_sessions(rs, min_shared_blocks=1) == 1
    assert sessions_and_turns(rs) == [("0", 1), ("0", 2)]
    with pytest.raises(ValueError):
        infer_sessions(rs, min_shared_blocks=0)


def test_no_blocks_means_one_session_per_request() -> None:
    rs = reqs((), ())
    assert infer_sessions(rs) == 2

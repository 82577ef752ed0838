"""The dispatch hold's bookkeeping: sent while there is room, held in key order otherwise,
released as first tokens make room; every count left exactly once."""

from __future__ import annotations

import pytest

from router.core.dispatch_hold import DispatchHold


def test_room_sends_at_once_and_the_held_go_in_key_order():
    hold = DispatchHold(limit_tokens=8192)
    a = hold.enter("w", 8000, key=50)
    b = hold.enter("w", 500, key=40)  # 8000 sent: still within the limit
    assert a.sent and b.sent and hold.sent_tokens("w") == 8500
    late = [hold.enter("w", 3000, key=k) for k in (30, 10, 20)]
    assert not any(s.sent for s in late) and hold.held("w") == 3 and hold.waited == 3
    other = hold.enter("v", 100_000, key=99)  # another worker has its own room
    assert other.sent and hold.held() == 3
    # a first token makes room: the held go lowest key first while the count is within
    # the limit (500, 3500, 6500: the third still goes)
    assert [s.key for s in hold.leave(a)] == [10, 20, 30]
    assert hold.sent_tokens("w") == 9500 and hold.held("w") == 0
    assert hold.leave(b) == [] and hold.sent_tokens("w") == 9000


def test_every_slot_leaves_once_whatever_its_state():
    hold = DispatchHold(limit_tokens=1)
    sent = hold.enter("w", 10, key=1)
    gone = hold.enter("w", 10, key=2)  # held, then its client leaves
    kept = hold.enter("w", 10, key=3)
    assert hold.leave(gone) == [] and hold.held("w") == 1
    assert hold.leave(gone) == []  # twice: nothing more
    assert hold.leave(sent) == [kept]  # the one that left is skipped
    assert hold.leave(sent) == []
    assert hold.sent_tokens("w") == 10
    assert hold.leave(kept) == [] and hold.sent_tokens("w") == 0 and hold.held() == 0
    # a fully cached prompt still counts one token (the engine computes its last one)
    assert hold.enter("w", 0, key=0).tokens == 1


def test_the_limit_is_positive():
    with pytest.raises(ValueError):
        DispatchHold(0)

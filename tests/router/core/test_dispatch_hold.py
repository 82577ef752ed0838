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


def test_a_request_relying_on_a_held_prefix_goes_after_the_request_that_computes_it():
    hold = DispatchHold(limit_tokens=1)
    busy = hold.enter("w", 10, key=0)  # the worker has no room: the rest are held
    cold = hold.enter("w", 4096, key=900, blocks=[11, 12, 13, 14])  # computes 11-14
    # the next turn, booked on 11-14 cached, is priced short: it would compute them itself
    assert hold.after("w", [11, 12, 13, 14, 15], hit_blocks=4) == 900
    assert hold.after("w", [11, 12, 99], hit_blocks=2) == 900  # a sibling: a shared head
    assert hold.after("w", [11, 12, 13], hit_blocks=0) is None  # nothing cached: no relation
    assert hold.after("w", [7, 8], hit_blocks=2) is None  # another prefix
    assert hold.after("v", [11, 12], hit_blocks=2) is None  # another worker
    turn = hold.enter("w", 1024, key=900, blocks=[11, 12, 13, 14, 15])  # its key raised
    short = hold.enter("w", 1024, key=100, blocks=[21, 22])
    assert [s.key for s in hold.leave(busy)] == [100]  # lowest first, one at a time
    assert hold.leave(short) == [cold]  # same key: the one that computes the prefix first
    # once sent, the prefix is on its way in the engine: nothing held computes it
    assert hold.after("w", [11, 12, 13, 14, 15], hit_blocks=4) is None
    assert hold.leave(cold) == [turn]
    assert hold.leave(turn) == [] and hold.held() == 0 and hold.sent_tokens("w") == 0


def test_a_held_request_that_leaves_hands_its_prefix_to_the_next_holder():
    hold = DispatchHold(limit_tokens=1)
    hold.enter("w", 10, key=0)
    gone = hold.enter("w", 4096, key=900, blocks=[11, 12])
    later = hold.enter("w", 4096, key=950, blocks=[11, 12, 13])  # also holds 11-12
    assert hold.after("w", [11, 12], hit_blocks=2) == 900
    hold.leave(gone)  # its client left: the next holder computes 11-12 now
    assert hold.after("w", [11, 12], hit_blocks=2) == 950
    assert hold.after("w", [11, 12, 13], hit_blocks=3) == 950
    hold.leave(later)
    assert hold.after("w", [11, 12], hit_blocks=2) is None and hold.held() == 0

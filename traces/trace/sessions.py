"""Sessions for traces that carry none (Mooncake), inferred from shared block prefixes.

Rule: walk the requests in arrival order. A request joins the session of the earlier request
with which it shares the longest block prefix (the most recent such request on ties) and
becomes that request's next turn (``turn = parent.turn + 1``), provided the shared prefix is at
least ``min_shared_blocks`` blocks; otherwise it starts a new session at turn 1.

Why this rule (measured on Mooncake's ``conversation_trace.jsonl``, 12,031 requests):

- Block 0 is a one-block system prompt: it starts all 12,031 requests, while the next most
  shared id appears in only 43. Sharing one block therefore says nothing (``min_shared_blocks
  = 1`` makes the whole trace one session); sharing two or more means sharing conversation
  content, hence the default of 2.
- The stricter "parent = earlier request whose full-block list is a prefix of mine" links
  3,975 requests; longest-common-prefix links 4,658. The 683 extra are edits, truncations
  and regenerations of an earlier turn (e.g. 45 of 48 blocks shared with an earlier request):
  the same conversation and the same cached prefix, which is what affinity routing needs.
- Matching the parent's whole id list fails: Mooncake's last id covers a partial block whose
  id changes once the next turn fills it (only 130 requests would link).

Keys are prefix-chained, so "shares ``n`` leading blocks with some earlier request" is "its
first ``n`` keys were seen before", and the most recent request holding key ``n - 1`` is the
parent: one dict lookup per block.
"""

from __future__ import annotations

from collections.abc import Sequence

from traces.trace.record import TraceRequest

MIN_SHARED_BLOCKS = 2


def infer_sessions(
    requests: Sequence[TraceRequest], min_shared_blocks: int = MIN_SHARED_BLOCKS
) -> int:
    """Set ``session_id`` ("0", "1", ... by first appearance) and ``turn`` in place.

    ``requests`` must be in arrival order. Returns the number of sessions.
    """
    if min_shared_blocks < 1:
        raise ValueError("min_shared_blocks must be >= 1")
    holder: dict[int, int] = {}  # block key -> index of the latest request containing it
    sessions = 0
    for i, req in enumerate(requests):
        shared = 0
        for key in req.blocks:
            if key not in holder:
                break
            shared += 1
        if shared >= min_shared_blocks:
            parent = requests[holder[req.blocks[shared - 1]]]
            req.session_id = parent.session_id
            req.turn = parent.turn + 1
        else:
            req.session_id = str(sessions)
            req.turn = 1
            sessions += 1
        for key in req.blocks:
            holder[key] = i
    return sessions

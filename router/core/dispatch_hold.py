"""Holding requests at the router until their worker's engine has room for them, released in
the engine-priority order (:mod:`router.core.engine_priority`): the router's order on engines
that keep their own first come first served (vLLM's and SGLang's default).

An FCFS engine takes its waiting prefills in arrival order, so a short turn sent behind a
long cold prompt waits for all of it; the router knows both prefills before either is sent.
With ``--dispatch-hold-tokens N`` each request is still picked and booked at once (its
worker's queue as the picker prices it includes it), but it is sent only while the prefill
already sent to that worker and not through (no first token yet) is at most ``N`` tokens;
otherwise it waits at the router, and each first token there releases the held requests with
the lowest keys while there is room. The engine's own queue stays about one chunk deep, and
the order in which prefills reach it is the router's.

A request whose estimated hit ends in a block that a held request will compute goes right
after that one (:mod:`router.core.prefix_owners`).

Only streamed generation requests are held or counted: the router sees a streamed answer's
first token when it comes, a plain one's only at its end. :class:`DispatchHold` is pure
bookkeeping shared by the proxy (which wakes the held request's task) and the simulator
(which submits it to its worker model).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from router.core.prefix_owners import PrefixOwners

HELD, SENT, DONE = 0, 1, 2


class Slot:
    """One request's place: held, sent (its prefill counted on its worker), or done."""

    __slots__ = ("blocks", "key", "payload", "seq", "state", "tokens", "worker")

    def __init__(
        self, worker: Any, tokens: int, key: int, seq: int, payload: Any, blocks: Sequence[int]
    ) -> None:
        self.worker = worker
        self.tokens = tokens
        self.key = key
        self.seq = seq
        self.payload = payload  # the caller's: what to wake or submit on release
        self.blocks = blocks  # its prompt's chained block hashes (what its prefill computes)
        self.state = HELD

    @property
    def sent(self) -> bool:
        return self.state == SENT

    def __lt__(self, other: Slot) -> bool:
        return (self.key, self.seq) < (other.key, other.seq)


class _Worker:
    __slots__ = ("held", "sent_tokens", "waiting")

    def __init__(self) -> None:
        self.sent_tokens = 0  # prefill sent and not through
        self.held: list[Slot] = []  # a heap by (key, arrival); done ones dropped lazily
        self.waiting = 0  # held and not done


class DispatchHold:
    """Per worker: the prefill tokens sent and not through, and the requests held for room."""

    __slots__ = ("_seq", "_workers", "limit_tokens", "owners", "waited")

    def __init__(self, limit_tokens: int) -> None:
        if limit_tokens <= 0:
            raise ValueError("limit_tokens must be positive")
        self.limit_tokens = limit_tokens
        self._workers: dict[Any, _Worker] = {}
        self._seq = 0
        self.waited = 0  # requests that were held, ever
        self.owners = PrefixOwners()  # the held requests' blocks, until sent

    def held(self, worker: Any = None) -> int:
        """Requests held (for ``worker``, or in all)."""
        if worker is not None:
            w = self._workers.get(worker)
            return w.waiting if w is not None else 0
        return sum(w.waiting for w in self._workers.values())

    def sent_tokens(self, worker: Any) -> int:
        w = self._workers.get(worker)
        return w.sent_tokens if w is not None else 0

    def after(self, worker: Any, blocks: Sequence[int], hit_blocks: int) -> int | None:
        """The key of the held request on ``worker`` whose prefill computes the last of the
        first ``hit_blocks`` of ``blocks`` (a request's estimated hit); None: no held one.
        A request with that hit goes after it (its key at least this)."""
        return self.owners.after(worker, blocks, hit_blocks)

    def enter(
        self, worker: Any, tokens: int, key: int, payload: Any = None, blocks: Sequence[int] = ()
    ) -> Slot:
        """A request of ``tokens`` uncached prompt tokens for ``worker``, priority ``key``,
        prompt ``blocks``: sent now (``slot.sent``) when the worker has room, else held."""
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker()
        self._seq += 1
        slot = Slot(worker, max(tokens, 1), key, self._seq, payload, blocks)
        if w.sent_tokens <= self.limit_tokens and not w.waiting:
            slot.state = SENT
            w.sent_tokens += slot.tokens
        else:
            heapq.heappush(w.held, slot)
            w.waiting += 1
            self.waited += 1
            self.owners.add(worker, slot)
        return slot

    def _unhold(self, w: _Worker, slot: Slot, sent: bool) -> None:
        """``slot`` is no longer held: sent (its prefill computes its blocks now), or its
        client left (the other held requests with its blocks compute them now)."""
        w.waiting -= 1
        owners = self.owners
        owners.remove(slot.worker, slot)
        if not sent and slot.blocks:
            for other in sorted(s for s in w.held if s.state == HELD):
                owners.add(slot.worker, other)

    def leave(self, slot: Slot) -> list[Slot]:
        """``slot``'s prefill is through (its first token) or it ended: its tokens leave
        its worker's count (once); the held requests that now fit, released in key order
        (each ``sent``), for the caller to send."""
        state = slot.state
        if state == DONE:
            return []
        slot.state = DONE
        w = self._workers[slot.worker]
        if state == HELD:
            self._unhold(w, slot, sent=False)
            return []
        w.sent_tokens -= slot.tokens
        released = []
        held = w.held
        while held and w.sent_tokens <= self.limit_tokens:
            nxt = heapq.heappop(held)
            if nxt.state != HELD:  # its client left while it was held
                continue
            nxt.state = SENT
            self._unhold(w, nxt, sent=True)
            w.sent_tokens += nxt.tokens
            released.append(nxt)
        if not w.sent_tokens and not w.waiting and not held:
            del self._workers[slot.worker]
        return released

"""What the router learns about each worker from its own bookings and reports.

Two small structures that live on each :class:`router.cache.worker_state.WorkerState` (so the proxy
and the simulator feed them with the same booking / report code) and that the ``ttft``
picker reads:

- :class:`PrefillRate`: the worker's effective prefill rate, learned online from observed time
  to first token. A streamed request that found nothing queued ahead gives one sample: its own
  uncached tokens (as the worker reported them) over its time to first token, less one step's
  overhead (a queue's partly done prefill would make a busy worker look fast). Samples are
  folded into exponentially weighted sums of work and time (``rate = work / time``, so a long
  prompt weighs more than a short one), starting from a prior worth ``PRIOR_SAMPLES`` samples at
  the configured rate, and the result is clamped to ``[rate / BOUND, rate * BOUND]`` of the
  configured rate: a burst of odd samples (a worker paused, a cache reset) can skew it only so
  far. Under load the queue ahead was partly prefilled already and memory waits add time, so the
  rate is an *effective* one; what matters to the picker is how workers compare.
- :class:`SessionFootprint`: the sessions recently served by the worker and how many tokens
  of KV each holds there (its last prompt plus output), with their sum over the sessions
  seen within ``horizon_s``: the worker's warm working set. When it exceeds the worker's KV
  capacity, whatever a new placement inserts pushes out blocks a warm session will ask for
  (:meth:`SessionFootprint.displaced` says whose, and what their recompute costs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

DEFAULT_PREFILL_TOKENS_PER_S = 15_000.0
"""The configured prefill rate when nothing else is known (the worker model's default)."""

STEP_OVERHEAD_S = 0.012
"""Fixed cost of one engine step, taken off each observed time to first token."""

PRIOR_SAMPLES = 8.0
"""The configured rate counts as this many samples of an average request's work."""

ALPHA = 0.05
"""Weight of a new sample in the exponentially weighted sums (about 20 samples of memory)."""

BOUND = 4.0
"""The learned rate stays within [configured / BOUND, configured * BOUND]."""

MIN_WORK_TOKENS = 512
"""Samples with less prefill work than one block are overhead-dominated: skipped."""

FOOTPRINT_HORIZON_S = 300.0
"""A session last seen longer ago than this no longer counts as warm on the worker."""


class PrefillRate:
    """A worker's effective prefill rate in tokens/s, learned from time to first token."""

    __slots__ = ("_time", "_work", "configured", "samples", "tokens_per_s")

    def __init__(self, configured: float = DEFAULT_PREFILL_TOKENS_PER_S) -> None:
        if configured <= 0:
            raise ValueError("configured prefill rate must be positive")
        self.configured = configured
        prior_work = PRIOR_SAMPLES * 8192.0
        self._work = prior_work
        self._time = prior_work / configured
        self.tokens_per_s = configured
        self.samples = 0

    def observe(self, work_tokens: int, ttft_s: float) -> None:
        """One request waited ``ttft_s`` for ``work_tokens`` of prefill (its own and ahead)."""
        if work_tokens < MIN_WORK_TOKENS or ttft_s <= 0:
            return
        busy = max(ttft_s - STEP_OVERHEAD_S, ttft_s * 0.1)
        self._work += ALPHA * (work_tokens - self._work)
        self._time += ALPHA * (busy - self._time)
        rate = self._work / self._time
        lo, hi = self.configured / BOUND, self.configured * BOUND
        self.tokens_per_s = lo if rate < lo else hi if rate > hi else rate
        self.samples += 1


UNCAPPED = 1 << 62
"""A displacement cap that caps nothing (``SessionFootprint.displaced``'s default)."""


class SessionFootprint:
    """Sessions warm on one worker: tokens each holds there, summed over a time horizon."""

    __slots__ = ("_head_seen", "_sessions", "clock", "horizon_s", "warm_tokens")

    def __init__(self, horizon_s: float = FOOTPRINT_HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._sessions: OrderedDict[str, tuple[int, float]] = OrderedDict()  # oldest first
        self.warm_tokens = 0
        self.clock = 0.0  # time of the latest booking
        self._head_seen = float("inf")  # when the oldest session was seen (inf: none)

    def __len__(self) -> int:
        return len(self._sessions)

    def tokens_of(self, session_id: str | None) -> int:
        """Tokens ``session_id`` holds here while warm (0 if it is not warm here)."""
        if session_id is None:
            return 0
        entry = self._sessions.get(session_id)
        return entry[0] if entry is not None else 0

    def others_tokens(self, session_id: str | None, now: float) -> int:
        """Warm tokens at ``now`` of the sessions other than ``session_id`` (one call per pick)."""
        warm = self.expire(now)
        if session_id is not None:
            entry = self._sessions.get(session_id)
            if entry is not None:
                warm -= entry[0]
        return warm

    def displaced(
        self,
        session_id: str | None,
        tokens: int,
        cap: int = UNCAPPED,
        home_of: Callable[[str], int | None] | None = None,
        here: int = -1,
        skip: int = 0,
    ) -> int:
        """Tokens to recompute when inserting ``tokens`` here pushes out other sessions.

        The sessions are pushed out least recently seen first, whole (a turn that finds its
        prefix gone recomputes it), until ``tokens`` are freed; each is charged its tokens,
        at most ``cap``; a session that ``home_of`` (the router's session bindings) says now
        lives on a worker other than ``here`` is stale here and freed at no charge, and
        ``session_id``'s own entry is skipped. The oldest ``skip`` tokens are out of the
        cache already (pushed out before): they free nothing and cost nothing. O(sessions
        pushed out). Call
        after :meth:`others_tokens`, which forgets the sessions past the horizon.
        """
        if tokens <= 0:
            return 0
        freed = charged = 0
        for sid, (held, _seen) in self._sessions.items():
            if sid == session_id:
                continue
            if skip:  # pushed out already
                if held <= skip:
                    skip -= held
                    continue
                held -= skip
                skip = 0
            freed += held
            if home_of is not None:
                home = home_of(sid)
                if home is not None and home != here:
                    if freed >= tokens:
                        break
                    continue
            charged += held if held < cap else cap
            if freed >= tokens:
                break
        return charged

    def pushed_out(
        self,
        session_id: str | None,
        length: int,
        uncached: int,
        capacity: int,
        now: float,
        cap: int = UNCAPPED,
        home_of: Callable[[str], int | None] | None = None,
        here: int = -1,
    ) -> int:
        """What placing ``session_id``'s prompt of ``length`` tokens here (``uncached`` of
        them to insert) costs the other warm sessions, in tokens to recompute: 0 while the
        others' warm tokens at ``now`` plus ``length`` fit in ``capacity``, else
        :meth:`displaced` for the inserted tokens beyond it."""
        warm = self.warm_tokens
        if self._head_seen < now - self.horizon_s:
            warm = self.expire(now)
        sessions = self._sessions
        if session_id is not None:
            own = sessions.get(session_id)
            if own is not None:
                warm -= own[0]
        over = warm + length - capacity
        if over <= 0 or uncached <= 0:
            return 0
        tokens = uncached if uncached < over else over
        # the oldest ``over - tokens`` are out of the worker's cache already: its LRU pushed
        # them out when newer ones came in, so the victims are the oldest still held
        return self.displaced(session_id, tokens, cap, home_of, here, over - tokens)

    def live_sessions(
        self,
        session_id: str | None,
        since: float,
        home_of: Callable[[str], int | None] | None = None,
        here: int = -1,
        limit: int = 1 << 30,
    ) -> int:
        """Sessions other than ``session_id`` seen here at ``since`` or later and not bound
        (``home_of``) to another worker: the ones likely to send their next turn here soon;
        at most ``limit``. Walks from the most recent: O(min(sessions since, limit))."""
        count = 0
        sessions = self._sessions
        for sid in reversed(sessions):
            if count >= limit or sessions[sid][1] < since:
                break
            if sid == session_id:
                continue
            if home_of is not None:
                home = home_of(sid)
                if home is not None and home != here:
                    continue
            count += 1
        return count

    def touch(self, session_id: str, tokens: int, now: float) -> None:
        """``session_id`` was booked here at ``now`` and will hold ``tokens`` of KV."""
        if now > self.clock:
            self.clock = now
        sessions = self._sessions
        old = sessions.pop(session_id, None)
        if old is not None:
            self.warm_tokens -= old[0]
        sessions[session_id] = (tokens, self.clock)
        self.warm_tokens += tokens
        self._head_seen = next(iter(sessions.values()))[1]
        self.expire(self.clock)

    def expire(self, now: float) -> int:
        """Forget sessions last seen before ``now - horizon_s``; the warm tokens left."""
        limit = now - self.horizon_s
        if self._head_seen >= limit:  # the usual case: nothing to forget, O(1)
            return self.warm_tokens
        sessions = self._sessions
        while sessions:
            session_id, (tokens, seen) = next(iter(sessions.items()))
            if seen >= limit:
                self._head_seen = seen
                break
            del sessions[session_id]
            self.warm_tokens -= tokens
        else:
            self._head_seen = float("inf")
        return self.warm_tokens

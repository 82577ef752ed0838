"""A shadow of one worker's prefill under priority scheduling: the TTFT prediction when the
router sets the engines' priorities (``serve --engine-priority``).

With vLLM's ``--scheduling-policy priority`` and chunked prefill, each engine step's token
budget goes to the prefills under way first (a started prefill keeps its place), then to
the others by ``(priority, arrival)``; a request that arrives mid-step joins at the step's
end. Its first token comes once the prefill ahead of it *in that order* is through, in steps
whose length the chunks they carry set. Pricing the queue first come first served
(:meth:`router.cache.cost_model.WorkerCost.ttft_s`) misses both ways: a short prompt passes
a queue of long ones, and it rides in steps that long prefills fill.

:class:`PriorityPrefill` replays that order over what the router booked there (each
request's uncached tokens after its cached ones), step by step with the cost model's terms
and the decode batch as booked, advancing from event to event. A first token drops its
request; nothing else resynchronises it, and what it left out (later arrivals with lower
keys, KV memory waits) shows in the prediction error. :meth:`PriorityPrefill.add` answers
the seconds until a request's last chunk is through with nothing more arriving. Pure: the
caller passes ``now``.
"""

from __future__ import annotations

from typing import Protocol

from router.cache.cost_profile import pairs_of


class StepTerms(Protocol):
    """The cost model's terms a step is priced with (:class:`router.cache.cost_model.CostTerms`)."""

    a: float
    c: float
    d: float
    decode_base: float
    per_context_token: float
    per_sequence: float
    chunk_tokens: int


Decode = tuple[int, float]
"""The decode batch each step carries: running sequences, their context tokens."""


class _Job:
    __slots__ = ("handle", "key", "left", "prior", "started")

    def __init__(self, handle: object, tokens: int, key: int, cached: int) -> None:
        self.handle = handle
        self.key = key
        self.left = max(tokens, 1)  # prompt tokens to compute (the engine computes one
        self.prior = cached  # of a fully cached prompt); tokens before its next chunk
        self.started = False


class PriorityPrefill:
    """One worker's prefill in the engine's priority order (module docstring), at the
    terms' pace: a learned correction scales its answers, not its steps (fed back into the
    steps, a correction moved by a few early outliers sped or slowed every later step)."""

    __slots__ = ("_jobs", "_plan", "_step_end")

    def __init__(self) -> None:
        self._jobs: list[_Job] = []  # started first (in their order), then by key
        self._plan: list[tuple[_Job, int]] = []  # the step under way: (job, its tokens)
        self._step_end: float | None = None  # when that step ends (None: idle)

    def __len__(self) -> int:
        return len(self._jobs)

    def add(
        self,
        handle: object,
        tokens: int,
        cached: int,
        key: int,
        now: float,
        terms: StepTerms,
        decode: Decode,
    ) -> float:
        """A request (``handle``: the caller's, for :meth:`first_token` and :meth:`remove`)
        of ``tokens`` uncached tokens after ``cached`` ones sent at ``now`` with priority
        ``key``, queued in the engine's order: the seconds until its first token with
        nothing more arriving."""
        self.advance(now, terms, decode)
        jobs = self._jobs
        i = len(jobs)
        while i > 0 and not jobs[i - 1].started and jobs[i - 1].key > key:
            i -= 1
        job = _Job(handle, tokens, key, cached)
        jobs.insert(i, job)
        if self._step_end is None:  # idle: the engine starts a step now
            self._start(now, terms, decode)
        return self._eta(i, now, terms, decode)

    def advance(self, now: float, terms: StepTerms, decode: Decode) -> None:
        """The steps that end by ``now`` run; the one under way at ``now`` goes on."""
        while self._step_end is not None and self._step_end <= now:
            end = self._step_end
            for job, take in self._plan:
                job.left -= take
                job.prior += take
            self._jobs = [j for j in self._jobs if j.left > 0]
            self._start(end, terms, decode)

    def first_token(self, handle: object, now: float, terms: StepTerms, decode: Decode) -> None:
        """``handle``'s first token came at ``now``: the steps up to ``now`` run (with its
        chunks: when the shadow runs behind the engine, they were computed), then it
        leaves."""
        self.advance(now, terms, decode)
        self.remove(handle)

    def remove(self, handle: object) -> None:
        """``handle``'s request leaves (its first token came, or it ended without one)."""
        jobs = self._jobs
        for i, job in enumerate(jobs):
            if job.handle is handle:
                del jobs[i]
                return

    def _eta(self, i: int, now: float, terms: StepTerms, decode: Decode) -> float:
        """Seconds from ``now`` until job ``i``'s last chunk is through, nothing arriving:
        the step under way, then full steps of the jobs up to ``i`` in order, the last one
        filled by the jobs after it. Summed in closed form (a job's attention over its
        chunks telescopes to its whole span's), not step by step: a deep queue is hundreds
        of steps."""
        jobs = self._jobs
        left = [j.left for j in jobs]
        prior = [j.prior for j in jobs]
        if self._plan:  # the step under way
            at = {id(j): k for k, j in enumerate(jobs)}
            for job, take in self._plan:
                k = at.get(id(job))
                if k is not None:
                    left[k] -= take
                    prior[k] += take
        start = (self._step_end if self._step_end is not None else now) - now
        if left[i] <= 0:
            return start
        tokens, pairs = 0, 0.0
        for k in range(i + 1):
            rest = left[k]
            if rest > 0:
                tokens += rest
                pairs += pairs_of(rest, prior[k])
        chunk = terms.chunk_tokens
        steps = -(-tokens // chunk)
        last = tokens - (steps - 1) * chunk  # job i's last step: its own jobs' tokens ...
        last_pairs, need = 0.0, last
        for k in range(i, -1, -1):
            rest = left[k]
            if rest <= 0:
                continue
            part = rest if rest < need else need
            last_pairs += pairs_of(part, prior[k] + rest - part)
            need -= part
            if need <= 0:
                break
        room = chunk - last  # ... and what the jobs after i fill it with
        for k in range(i + 1, len(jobs)):
            if room <= 0:
                break
            rest = left[k]
            if rest <= 0:
                continue
            take = rest if rest < room else room
            fill = pairs_of(take, prior[k])
            tokens, pairs, last, last_pairs = (
                tokens + take,
                pairs + fill,
                last + take,
                last_pairs + fill,
            )
            room -= take
        running, context = decode
        per_step = terms.per_sequence * running + terms.per_context_token * context
        # the full steps: their prefill is above the decode floor (a chunk of a few hundred
        # tokens is, on any measured profile); the last one priced as a step
        full = (steps - 1) * (terms.d + per_step)
        full += terms.a * (tokens - last) + terms.c * (pairs - last_pairs)
        return start + full + step_s(terms, last, last_pairs, decode)

    def _start(self, at: float, terms: StepTerms, decode: Decode) -> None:
        """The next step from ``at``: the budget in the jobs' order."""
        if not self._jobs:
            self._plan, self._step_end = [], None
            return
        budget, tokens, pairs = terms.chunk_tokens, 0, 0.0
        plan = []
        for job in self._jobs:
            take = job.left if job.left < budget else budget
            plan.append((job, take))
            job.started = True
            pairs += pairs_of(take, job.prior)
            tokens += take
            budget -= take
            if budget <= 0:
                break
        self._plan = plan
        self._step_end = at + step_s(terms, tokens, pairs, decode)


def step_s(terms: StepTerms, tokens: int, pairs: float, decode: Decode) -> float:
    """One engine step carrying ``tokens`` prefill tokens (``pairs`` query-key pairs) beside
    the decode batch (the worker model's step, in the cost model's terms)."""
    running, context = decode
    prefill = terms.d + terms.a * tokens + terms.c * pairs
    floor = terms.decode_base if running else 0.0
    return (
        (prefill if prefill > floor else floor)
        + terms.per_sequence * running
        + terms.per_context_token * context
    )

"""The router's TTFT cost model: a request's time to first token on a worker, priced in the
shape a GPU profile measures (:mod:`router.cache.cost_profile`) and corrected per worker
from what the workers' answers show.

The flat prior (a prefill rate, a step cost per running request) misses where long prompts
extend earlier ones: 2k new tokens after 128k cached take 0.47 s on an H100, the flat rate
says 0.14 s (docs/simulation.md, "GPU cost profiles"). With a profile's terms, the prefill
queued on a worker plus a request's own ``s`` uncached tokens after its ``p`` cached ones is

    tokens = queued + s                 pairs = queued_pairs + s*p + s**2/2
    steps  = tokens / chunk_tokens + 1  (chunked prefill: each step carries a chunk)
    ttft   = max(d*steps + a*tokens + c*pairs, base*steps if decoding)
             + steps * (per_sequence*running + per_context_token*context)

``queued_pairs`` is the query-key pairs of the prefill booked there (each booking's own
``s*p + s**2/2``, as booked); ``running`` / ``context`` are the sequences past their first
token and their context tokens (prompt plus half the booked output): every engine step
while prefill is queued also carries their decode. The flat prior is the same formula with
``a = 1 / rate``, ``c = 0``, ``d = base = step_s`` and ``per_sequence = seq_s``.

Learned online (:class:`WorkerCost`): each answer's observed TTFT against the prediction
made when it was booked (with the queue ahead of it then, so queueing is in both) moves a
per-worker multiplicative correction: a running median of log(observed / predicted), each
observation moving it toward itself by at most ``STEP`` (more while there are few), bounded
to ``[1/BOUND, BOUND]`` like :class:`router.cache.workload.PrefillRate`. A median, not a
mean: what the model leaves out comes in rare, large excursions (a request waiting for KV
memory behind a long one: the ttft picker's ``wait_i``), and a mean moved by them mispriced
every other request (on the agentic sample, 4 H100 workers, 0.1x: a median error of 4.5%
with a mean of the logs, 0.4% with the terms alone, the workers being the same shape).
Every observation is also scored (:class:`PredictionErrors`: the absolute error as a
fraction of the observed TTFT), which ``/metrics`` exports and the simulator reports.

Pure: no I/O, no clock; the caller passes ``now`` (the proxy's monotonic clock, the
simulator's virtual time). Flow control's saturation test reads the same prediction for a
request when the terms come from a profile (:func:`router.core.flow_queue.predicted_ttft`:
``worker_state.cost.ttft_s(uncached, cached, now)``); with the flat prior it prices its own
terms (the learned rate, the decode by held context) through :meth:`CostTerms.ttft_s` too.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from router.cache.cost_profile import GpuProfile, pairs_of
from router.cache.engine_queue import PriorityPrefill
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S, STEP_OVERHEAD_S

CHUNK_TOKENS = 8192
"""Prefill tokens an engine step carries (vLLM's and the worker model's default)."""

SEQ_S = 0.00015
"""The flat prior's cost of one running sequence in each step (the worker model's)."""

STEP = 0.02
"""How far one observation moves the correction's log, at most, once it has settled (the
first observations move it up to ``1 / (n + 1)``)."""

BOUND = 4.0
"""The correction stays within [1 / BOUND, BOUND]."""

MIN_TOKENS = 512
"""Observations with less prefill (queued ahead plus its own) than one block are the
engine's fixed costs and the network's: scored, not learned from."""

ERROR_BOUNDS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
"""Bucket bounds of the absolute error as a fraction of the observed TTFT."""


@dataclass(frozen=True, slots=True)
class CostTerms:
    """The cost model's terms in seconds (module docstring); ``profiled``: from a GPU
    profile (the ttft picker prices with them only then)."""

    a: float  # per new prefill token
    c: float  # per query-key pair of the prefill
    d: float  # per engine step that carries prefill
    decode_base: float  # per step while sequences decode
    per_context_token: float  # per context token of the running sequences, each step
    per_sequence: float  # per running sequence, each step
    chunk_tokens: int = CHUNK_TOKENS
    profiled: bool = False
    name: str = "flat"

    @classmethod
    def flat(
        cls,
        tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        step_s: float = STEP_OVERHEAD_S,
        seq_s: float = SEQ_S,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> CostTerms:
        """The flat prior: ``tokens_per_s`` prefill, ``step_s + seq_s * running`` a step."""
        if tokens_per_s <= 0 or chunk_tokens <= 0:
            raise ValueError("the prefill rate and chunk_tokens must be positive")
        return cls(1.0 / tokens_per_s, 0.0, step_s, step_s, 0.0, seq_s, chunk_tokens)

    @classmethod
    def of_profile(
        cls, profile: GpuProfile, time_scale: float = 1.0, chunk_tokens: int = CHUNK_TOKENS
    ) -> CostTerms:
        """``profile``'s terms, for workers that run ``time_scale`` times faster than real
        time (sim workers' ``--time-scale``): every second divided by it."""
        if time_scale <= 0 or chunk_tokens <= 0:
            raise ValueError("time_scale and chunk_tokens must be positive")
        k = 1.0 / time_scale
        return cls(
            profile.a * k,
            profile.c * k,
            profile.d * k,
            profile.decode_base * k,
            profile.decode_per_context_token * k,
            profile.decode_per_sequence * k,
            chunk_tokens,
            True,
            profile.name,
        )

    def ttft_s(self, tokens: float, pairs: float, running: int, context: float) -> float:
        """``tokens`` of prefill (``pairs`` query-key pairs) in chunked steps beside a decode
        batch of ``running`` sequences holding ``context`` tokens."""
        steps = tokens / self.chunk_tokens + 1.0
        prefill = self.d * steps + self.a * tokens + self.c * pairs
        floor = self.decode_base * steps if running else 0.0
        decode = self.per_sequence * running + self.per_context_token * context
        return (prefill if prefill > floor else floor) + steps * decode

    def decode_step_s(self, running: int, context: float) -> float:
        """One decode step of a batch of ``running`` sequences holding ``context`` tokens."""
        return self.decode_base + self.per_sequence * running + self.per_context_token * context


class PredictionErrors:
    """Predicted against observed TTFT, summed: the absolute error as a fraction of the
    observed one, bucketed (:data:`ERROR_BOUNDS`), and both sums of seconds."""

    __slots__ = ("abs_error_sum", "buckets", "count", "observed_s", "predicted_s")

    def __init__(self) -> None:
        self.count = 0
        self.abs_error_sum = 0.0
        self.buckets = [0] * (len(ERROR_BOUNDS) + 1)  # the last one: above every bound
        self.predicted_s = 0.0
        self.observed_s = 0.0

    def observe(self, predicted_s: float, observed_s: float) -> None:
        error = abs(predicted_s - observed_s) / observed_s
        self.count += 1
        self.abs_error_sum += error
        self.buckets[bisect_left(ERROR_BOUNDS, error)] += 1
        self.predicted_s += predicted_s
        self.observed_s += observed_s


class CostEntry:
    """One booking as the cost model counts it (released once each way, as the booking)."""

    __slots__ = (
        "base_s",
        "booked_at",
        "context",
        "finished",
        "observed",
        "order_base_s",
        "pairs",
        "predicted_s",
        "queued",
        "running",
        "tokens",
        "work_tokens",
    )

    def __init__(self, tokens: int, pairs: float, context: int, booked_at: float) -> None:
        self.tokens = tokens  # its uncached prompt tokens
        self.pairs = pairs
        self.context = context  # what its decode reads each step (prompt + half its output)
        self.booked_at = booked_at
        self.base_s = 0.0  # the prediction at booking before the correction
        self.predicted_s = 0.0  # ... and after it: what the router expected
        self.work_tokens = 0  # prefill queued ahead plus its own, at booking
        self.queued = tokens > 0  # its prefill is counted in the queue
        self.running = False  # counted in the decode batch
        self.finished = False
        self.observed = False
        self.order_base_s = 0.0  # sent with an engine priority: the engine-order prediction


class WorkerCost:
    """One worker's cost model: its terms, its queue and decode batch as booked, and the
    correction learned from its answers."""

    __slots__ = (
        "_head_since",
        "_log_factor",
        "_order_log_factor",
        "_ordered",
        "_queue",
        "clock",
        "context",
        "errors",
        "factor",
        "order_factor",
        "order_samples",
        "queued_pairs",
        "queued_tokens",
        "running",
        "samples",
        "terms",
    )

    def __init__(self, terms: CostTerms | None = None) -> None:
        self.terms = terms if terms is not None else CostTerms.flat()
        self.queued_tokens = 0
        self.queued_pairs = 0.0
        self.running = 0
        self.context = 0
        self._queue: deque[CostEntry] = deque()  # queued entries, oldest first
        self._head_since = 0.0  # when the last first token came (the next prefill began)
        self.clock = 0.0  # the latest booking's time
        self._log_factor = 0.0
        self.factor = 1.0
        self.samples = 0
        self._ordered: PriorityPrefill | None = None  # the engine's order, once it has one
        self._order_log_factor = 0.0
        self.order_factor = 1.0
        self.order_samples = 0
        self.errors = PredictionErrors()

    @property
    def profiled(self) -> bool:
        """Whether the terms come from a GPU profile."""
        return self.terms.profiled

    def ttft_s(
        self, uncached: int, cached: int, now: float | None = None, corrected: bool = True
    ) -> float:
        """Predicted seconds to the first token of a request with ``uncached`` new prompt
        tokens after ``cached`` ones, booked at ``now``: the queue ahead less what its head
        (the one in progress) has had since it began, when ``now`` is given; with the
        learned correction, or at the terms as they are (``corrected=False``)."""
        return self._predict(uncached, cached, now, self.factor if corrected else 1.0)[0]

    def alone_s(self, uncached: int, cached: int, corrected: bool = True) -> float:
        """The request's own prefill on this worker with nothing queued ahead of it (the
        decode batch as booked still rides along): what :meth:`ttft_s` predicts once the
        worker's queue has drained."""
        base = self.terms.ttft_s(uncached, pairs_of(uncached, cached), self.running, self.context)
        return self.factor * base if corrected else base

    def prefill_s(self, uncached: int, cached: int, corrected: bool = True) -> float:
        """The seconds of engine time a request's own ``uncached`` prompt tokens after
        ``cached`` ones take, whatever queue or batch they share it with: its token and
        attention terms and the fixed cost of the steps it fills (a fraction of a step for
        the last chunk). What the request adds to the prefill of anyone queued behind it;
        the ttft picker's own-prefill seconds under a profile (a flat rate prices a 191k-token
        cold prompt at 5 s where its attention alone takes 29 s on an H100)."""
        terms = self.terms
        base = (
            terms.a * uncached
            + terms.c * pairs_of(uncached, cached)
            + terms.d * uncached / terms.chunk_tokens
        )
        return self.factor * base if corrected else base

    def _predict(
        self, uncached: int, cached: int, now: float | None, factor: float
    ) -> tuple[float, float]:
        """(corrected, base) predictions."""
        terms = self.terms
        tokens = self.queued_tokens + uncached
        pairs = self.queued_pairs + pairs_of(uncached, cached)
        base = terms.ttft_s(tokens, pairs, self.running, self.context)
        queue = self._queue
        if now is None or not queue:
            return factor * base, base
        head = queue[0]
        began = head.booked_at if head.booked_at > self._head_since else self._head_since
        elapsed = now - began
        if elapsed <= 0.0:
            return factor * base, base
        rest = terms.ttft_s(tokens - head.tokens, pairs - head.pairs, self.running, self.context)
        predicted = max(factor * base - elapsed, factor * rest)
        return predicted, predicted / factor

    def book(self, uncached: int, cached: int, prompt: int, output: int, now: float) -> CostEntry:
        """A request booked here at ``now`` (``prompt`` tokens, ``uncached`` of them new
        after ``cached``, ``output`` booked): its entry, with the prediction it was booked on."""
        entry = CostEntry(uncached, pairs_of(uncached, cached), prompt + output // 2, now)
        entry.predicted_s, entry.base_s = self._predict(uncached, cached, now, self.factor)
        if now > self.clock:
            self.clock = now
        entry.work_tokens = self.queued_tokens + uncached
        if entry.queued:
            if not self._queue:
                self._head_since = now
            self._queue.append(entry)
            self.queued_tokens += uncached
            self.queued_pairs += entry.pairs
        return entry

    def order(self, entry: CostEntry, key: int, cached: int, now: float) -> None:
        """``entry`` (booked here at ``now``, ``cached`` tokens before its uncached ones) was
        sent with engine priority ``key``: this worker's engine takes its prefills in that
        order, and the prediction ``entry`` is scored on becomes the one in that order
        (:mod:`router.cache.engine_queue`), with its own learned correction. Pricing for
        the picker stays first come first served."""
        if entry.finished:
            return
        if self._ordered is None:
            self._ordered = PriorityPrefill()
        decode = (self.running, self.context)
        eta = self._ordered.add(entry, entry.tokens, cached, key, now, self.terms, decode)
        entry.predicted_s, entry.order_base_s = self.order_factor * eta, eta

    def first_token(self, entry: CostEntry, now: float) -> None:
        """``entry``'s first token came at ``now``: its prefill leaves the queue, its decode
        joins the batch."""
        if entry.finished:
            return
        if self._ordered is not None:
            decode = (self.running, self.context)
            self._ordered.first_token(entry, now, self.terms, decode)
        if entry.queued:  # the next one's prefill began now
            self._dequeue(entry)
            self._head_since = now
        if not entry.running:
            entry.running = True
            self.running += 1
            self.context += entry.context

    def finish(self, entry: CostEntry) -> None:
        """``entry`` is over (whatever the outcome): everything it holds released, once."""
        if entry.finished:
            return
        entry.finished = True
        if self._ordered is not None:
            self._ordered.remove(entry)
        self._dequeue(entry)
        if entry.running:
            entry.running = False
            self.running -= 1
            self.context -= entry.context

    def _dequeue(self, entry: CostEntry) -> None:
        if not entry.queued:
            return
        entry.queued = False
        self.queued_tokens -= entry.tokens
        self.queued_pairs -= entry.pairs
        queue = self._queue
        while queue and not queue[0].queued:
            queue.popleft()
        if not queue:
            self.queued_pairs = 0.0  # no rounding drift across busy periods

    def observe(self, entry: CostEntry, ttft_s: float) -> None:
        """``entry``'s request waited ``ttft_s`` for its first token: score the prediction
        it was booked on and learn from it (once)."""
        if entry.observed or not ttft_s > 0.0 or not entry.base_s > 0.0:
            return
        entry.observed = True
        self.errors.observe(entry.predicted_s, ttft_s)
        if entry.work_tokens < MIN_TOKENS:
            return
        self.samples += 1
        self._log_factor = _toward(self._log_factor, ttft_s / entry.base_s, self.samples)
        self.factor = math.exp(self._log_factor)
        if entry.order_base_s > 0.0:
            self.order_samples += 1
            log = _toward(self._order_log_factor, ttft_s / entry.order_base_s, self.order_samples)
            self._order_log_factor = log
            self.order_factor = math.exp(log)


def _toward(log_factor: float, ratio: float, samples: int) -> float:
    """A correction's log moved toward ``log(ratio)`` (observed / predicted before the
    correction) by at most ``STEP`` (``1 / (samples + 1)`` while there are few), bounded."""
    gap = math.log(ratio) - log_factor
    step = 1.0 / (samples + 1)
    if step < STEP:
        step = STEP
    limit = math.log(BOUND)
    moved = log_factor + (gap if -step <= gap <= step else step if gap > 0 else -step)
    return min(limit, max(-limit, moved))

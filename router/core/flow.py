"""Flow control: priorities, fairness and SLO-aware admission between admission and placement.

One object (:class:`FlowControl`, the router core's ``flow`` with ``--flow-control``) that
``serve``'s forwarder and the endpoint picker both await between reading a request and
picking its worker (:meth:`router.core.routing.RouterCore.flow_wait`); the order and the
saturation test are the pure functions of :mod:`router.core.flow_queue`, and the admission
rule below (go on, wait or be shed; the queue's head released) is :class:`FlowAdmission`'s,
free of I/O and of the clock, which the offline simulator decides with too
(:class:`traces.sim.simulator.Simulation`, in virtual time).

A request arrives (already admitted: in flight, ``max_inflight``):

- the fleet is not saturated for it (the best worker's predicted TTFT for it is within
  ``--flow-target-ttft-s``, :func:`~router.core.flow_queue.saturated`: queued prefill, the
  decode its steps carry, ``--flow-decode-step-s`` and ``--flow-decode-token-s``, and the
  wait for KV room) and nothing of its
  priority or higher waits: it goes on at once (dispatched, wait 0);
- saturated and sheddable (negative priority): 429 ``flow_shed`` with Retry-After;
- else it waits in the queue (429 ``flow_queue_full`` / ``flow_queue_bytes`` past its band's
  limits). One dispatcher task (alive while something waits) releases the queue's head each
  time the fleet is not saturated for it: at once when a booking is released, else every
  ``TICK_S`` (the workers' prefill queues drain with time and first tokens). A request past
  its band's TTL: 429 ``flow_ttl``. A client that leaves while queued: taken out (counted
  ``client_disconnect``), its front end releases the rest as on any disconnect.
- no healthy worker, or no worker for its model: it goes on at once, whatever waits (the
  pick answers 503 or 404 now: no wait can change that answer).

After a request is released it is placed (picked and booked) before the dispatcher looks at
the next one: the released task runs before the dispatcher resumes (the event loop's ready
queue is first in, first out), and picks and books without suspending, so the next
prediction sees its booking.

Every request that enters ends exactly once in ``dispatched`` or ``rejected`` (by reason);
``queued`` is read from the queue itself, so it cannot drift. The labels of all of them
(band, flow) come from clients and are capped (:mod:`router.core.flow_labels`); the gauges
have a sample (0) for every label pair counted so far, so an empty queue reads 0, not absent.

When the router drains (SIGTERM) the queue is closed (:meth:`FlowControl.close`): what waits
is answered 503 with Retry-After at once (``rejected`` reason ``shutdown``), as is what comes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.base import NoHealthyWorker
from router.core.errors import ServiceUnavailable, TooManyRequests, shutting_down
from router.core.flow_labels import FlowLabels, bounded_snapshot
from router.core.flow_queue import (
    DEFAULT_FLOW,
    DISCONNECT,
    KV_RESERVE,
    SHED,
    STEP_COST,
    TTL,
    Classified,
    FlowQueue,
    Limits,
    Prediction,
    QueueFull,
    StepCost,
    Waiting,
    classify,
    predicted_ttft,
    saturated,
)
from router.core.metrics import PREFIX, HistogramFamily
from router.fleet.pool import ModelNotServed, WorkerPool

log = logging.getLogger("cache_router.flow")

SHUTDOWN = "shutdown"  # rejected at the drain's start (close): the router is stopping
TICK_S = 0.01  # how often a saturated queue's head is looked at again, at most
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
MESSAGES = {
    SHED: "the fleet is saturated and this request is sheddable (negative priority)",
    TTL: "the request waited in the flow-control queue past its band's TTL",
    "queue_full": "the flow-control queue of this priority is full",
    "queue_bytes": "the flow-control queue of this priority holds its most bytes",
}


PLACE = "place"  # FlowAdmission.decide: the request goes on now
QUEUE = "queue"  # it waits in the queue (SHED: it is refused)


class FlowAdmission:
    """The admission rule, free of I/O and of the clock: whether a request goes on, waits or
    is shed, and when the queue's head goes. :class:`FlowControl` (``serve``, the EPP) decides
    with it at the wall clock's ``now``; the offline simulator
    (:class:`traces.sim.simulator.Simulation`) with one of its own, in virtual time.

    ``views_for(model)``: the picker's views of the workers for a request naming ``model``
    (raising :class:`~router.fleet.pool.ModelNotServed` or
    :class:`~policies.base.NoHealthyWorker` when none can take it)."""

    def __init__(
        self,
        queue: FlowQueue,
        views_for: Callable[[str | None], Any],
        rate: float,
        target_s: float,
        kv_limit: float = 0.0,
        cost: StepCost = STEP_COST,
        kv_reserve: float = KV_RESERVE,
    ) -> None:
        self.queue = queue
        self.views_for = views_for
        self.rate = rate
        self.target_s = target_s
        self.kv_limit = kv_limit
        self.cost = cost
        self.kv_reserve = kv_reserve
        self.top_band: int | None = None  # the highest priority seen within the TTL ...
        self.top_seen = 0.0  # ... last seen then
        self.last: Prediction | None = None  # the latest prediction, for the gauges

    def predict(
        self, features: Any, now: float, kv_limit: float | None = None
    ) -> Prediction | None:
        """The best worker's predicted TTFT for ``features`` (``kv_limit``: the fraction of
        a worker's KV past which it is full, default the configured one); None: no worker
        can take it (the pick answers why)."""
        limit = self.kv_limit if kv_limit is None else kv_limit
        try:
            views = self.views_for(features.model)
            prediction = predicted_ttft(features, views, self.rate, now, limit, self.cost)
        except (NoHealthyWorker, ModelNotServed):
            return None
        self.last = prediction
        return prediction

    def is_saturated(self, features: Any, now: float, band: int | None = None) -> bool:
        limit = None if band is None else self.kv_limit_for(band, now)
        prediction = self.predict(features, now, limit)
        return prediction is not None and saturated(prediction, self.target_s)

    def _top(self, now: float) -> int | None:
        """The highest priority seen within the queue's TTL (None: none)."""
        if self.top_band is not None and now - self.top_seen > self.queue.limits.ttl_s:
            self.top_band = None
        return self.top_band

    def kv_limit_for(self, band: int, now: float) -> float:
        """The KV limit a request of priority ``band`` is admitted under: below the highest
        priority seen within the TTL, its workers keep ``kv_reserve`` of their KV free for
        it (:data:`~router.core.flow_queue.KV_RESERVE`), within ``kv_limit`` when that is
        set; else ``kv_limit``."""
        top = self._top(now)
        if top is None or band >= top or not self.kv_reserve > 0.0:
            return self.kv_limit
        room = 1.0 - self.kv_reserve
        return min(self.kv_limit, room) if self.kv_limit > 0.0 else room

    def decide(self, features: Any, band: int, now: float) -> str:
        """A request of priority ``band`` arrives: :data:`PLACE` (the fleet is not saturated
        for it and nothing of its band or higher waits; or no worker can take it, which the
        pick answers now), :data:`SHED` (saturated and sheddable, a negative band) or
        :data:`QUEUE` (it waits its turn; the queue's limits may still refuse it)."""
        top = self._top(now)
        if top is None or band >= top:
            self.top_band, self.top_seen = band, now
        prediction = self.predict(features, now, self.kv_limit_for(band, now))
        if prediction is None:
            return PLACE
        full = saturated(prediction, self.target_s)
        if not full and not self.queue.ahead_of(band):
            return PLACE
        if full and band < 0:
            return SHED
        return QUEUE

    def release(self, now: float, features: Callable[[Waiting], Any]) -> Waiting | None:
        """The queue's head, taken out, when the fleet is not saturated for it (``features``:
        a queued request's features); None when the queue is empty or its head must wait."""
        head = self.queue.head()
        if head is None or self.is_saturated(features(head), now, head.band):
            return None
        return self.queue.pop()


class FlowControl(FlowAdmission):
    """The queue, its dispatcher and its counters (see the module docstring)."""

    def __init__(
        self,
        settings: Any,
        pool: WorkerPool,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        limits = Limits(
            settings.flow_queue_max, settings.flow_queue_max_bytes, settings.flow_queue_ttl_s
        )
        super().__init__(
            FlowQueue(limits, settings.flow_weights),
            pool.views_for,
            settings.prefill_tokens_per_s,
            settings.flow_target_ttft_s,
            settings.flow_kv_limit,
            StepCost(settings.flow_decode_step_s, settings.flow_decode_token_s),
            settings.flow_kv_reserve,
        )
        self.pool = pool
        self.clock = clock
        self.objectives = dict(settings.flow_objectives)
        self.fairness_header = settings.flow_fairness_header.lower()
        self.dispatched: dict[tuple[str, str], int] = {}
        self.rejected: dict[tuple[str, str, str], int] = {}
        self.wait = HistogramFamily(
            PREFIX + "flow_wait_seconds",
            "Flow control: time a request waited before it was dispatched (band)",
            ["band"],
            WAIT_BUCKETS,
        )
        self.labels = FlowLabels(self.objectives.values())
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self.closed = False  # the router drains: nothing more waits (close)
        if registry is not None:
            registry.register(FlowCollector(self))

    # ---- a request -----------------------------------------------------------------------

    def classify(
        self, header: Callable[[str], str | None], body: Any, api_key: str | None
    ) -> Classified:
        return classify(
            header,
            body if isinstance(body, dict) else None,
            self.objectives,
            self.fairness_header,
            api_key,
        )

    async def enter(self, features: Any, c: Classified, size: int) -> None:
        """Return when the request may be placed; raise :class:`TooManyRequests` when it is
        refused (503 after :meth:`close`). Cancelled while waiting (its client left):
        taken out of the queue."""
        if self.closed:
            raise self._shut(c.band, c.flow)
        now = self.clock()
        decision = self.decide(features, c.band, now)
        if decision == PLACE:  # (no worker can take it: the pick's 404 / 503 now, not later)
            self._count_dispatched(c.band, c.flow, 0.0)
            return
        if decision == SHED:
            raise self._refuse(c.band, c.flow, SHED)
        deadline = now + c.slo_s if c.slo_s is not None else None
        item = Waiting(c.band, c.flow, features.input_length, size, now, deadline)
        try:
            self.queue.push(item)
        except QueueFull as full_queue:
            raise self._refuse(c.band, c.flow, full_queue.reason) from None
        future = asyncio.get_running_loop().create_future()
        item.payload = (future, features)
        self._start()
        try:
            await future
        except asyncio.CancelledError:
            self._gone(item)
            raise

    def _gone(self, item: Waiting) -> None:
        """``item``'s client left while it was queued: out of the queue, counted once
        (whichever of its task and the dispatcher sees it first)."""
        if self.queue.remove(item):
            self._count(self.rejected, (*self.labels.pair(item.band, item.flow), DISCONNECT))

    def close(self) -> None:
        """The router drains (SIGTERM): every request waiting here is answered 503 with
        Retry-After now, rather than waiting through the drain for a dispatch that its
        cut at the drain's end would undo; later ones are refused the same way. Each is
        counted once, ``shutdown`` (one whose client had already left: ``client_disconnect``)."""
        self.closed = True
        while (item := self.queue.pop()) is not None:
            future, _ = item.payload
            if future.done():  # its client left (its task not resumed yet)
                self._count(self.rejected, (*self.labels.pair(item.band, item.flow), DISCONNECT))
            else:
                future.set_exception(self._shut(item.band, item.flow))
        self.wake()

    def wake(self) -> None:
        """A booking was released: look at the queue's head now."""
        if self._wake is not None:
            self._wake.set()

    # ---- the dispatcher ------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        queue = self.queue
        wake = self._wake
        assert wake is not None
        try:
            while len(queue):
                now = self.clock()
                for item in queue.expired(now):
                    future, _ = item.payload
                    if not future.done():
                        future.set_exception(self._refuse(item.band, item.flow, TTL))
                head = queue.head()
                if head is None:
                    break
                future, _ = head.payload
                if future.done():  # cancelled: its client left (its task not resumed yet)
                    self._gone(head)
                    continue
                if self.release(now, _features) is not None:  # (head: no await in between)
                    self._count_dispatched(head.band, head.flow, now - head.arrival)
                    future.set_result(None)
                    await asyncio.sleep(0)  # it picks and books before the next look
                    continue
                wake.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), TICK_S)
        except Exception:  # a bug: never leave requests waiting for nobody
            log.exception("flow-control dispatcher failed; releasing the queue")
            while (item := queue.pop()) is not None:
                future, _ = item.payload
                if not future.done():
                    self._count_dispatched(item.band, item.flow, self.clock() - item.arrival)
                    future.set_result(None)

    # ---- counters ------------------------------------------------------------------------

    @staticmethod
    def _count(table: dict, key: tuple) -> None:
        table[key] = table.get(key, 0) + 1

    def _count_dispatched(self, band: int, flow: str, waited: float) -> None:
        key = self.labels.pair(band, flow)
        self._count(self.dispatched, key)
        self.wait.labels(key[0]).observe(waited)

    def _refuse(self, band: int, flow: str, reason: str) -> TooManyRequests:
        self._count(self.rejected, (*self.labels.pair(band, flow), reason))
        return TooManyRequests(MESSAGES[reason], code="flow_" + reason)

    def _shut(self, band: int, flow: str) -> ServiceUnavailable:
        self._count(self.rejected, (*self.labels.pair(band, flow), SHUTDOWN))
        return shutting_down("the router is shutting down: the request was not sent to a worker")

    def describe(self) -> dict[str, Any]:
        """The queue for ``/workers/flow`` and the dashboard, under the metrics' labels
        (bounded however many priorities and flows clients send)."""
        last = self.last
        return {
            "target_ttft_s": self.target_s,
            **bounded_snapshot(self.queue, self.labels),
            "predicted_ttft_s": round(last.ttft_s, 3) if last is not None else None,
            "dispatched": _nested(self.dispatched),
            "rejected": _nested(self.rejected),
        }


def _features(item: Waiting) -> Any:
    """A queued request's features (its payload: its future, its features)."""
    return item.payload[1]


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer`` header (its tenant is a flow)."""
    if authorization is None:
        return None
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def _nested(table: dict[tuple, int]) -> dict:
    out: dict = {}
    for key, n in sorted(table.items()):
        level = out
        for part in key[:-1]:
            level = level.setdefault(part, {})
        level[key[-1]] = n
    return out


class FlowCollector(Collector):
    """Exports the flow-control queue and counters (prefix ``cache_router_flow_``)."""

    def __init__(self, flow: FlowControl) -> None:
        self.flow = flow

    def describe(self) -> list:
        return []

    def collect(self):
        flow = self.flow
        queued = GaugeMetricFamily(
            PREFIX + "flow_queued", "Flow control: requests queued", labels=["band", "flow"]
        )
        queued_bytes = GaugeMetricFamily(
            PREFIX + "flow_queued_bytes", "Flow control: bytes queued", labels=["band"]
        )
        # every label pair counted so far has a sample, 0 while none of it waits
        counts = dict.fromkeys(flow.labels.pairs, 0)
        counts[("0", DEFAULT_FLOW)] = 0
        sizes = dict.fromkeys((band for band, _ in counts), 0)
        for band, b in bounded_snapshot(flow.queue, flow.labels)["bands"].items():
            sizes[band] = b["bytes"]
            for name, f in b["flows"].items():
                counts[(band, name)] = f["queued"]
        for (band, name), n in sorted(counts.items()):
            queued.add_metric([band, name], n)
        for band, n in sorted(sizes.items()):
            queued_bytes.add_metric([band], n)
        dispatched = CounterMetricFamily(
            PREFIX + "flow_dispatched",
            "Flow control: requests released to placement",
            labels=["band", "flow"],
        )
        for (band, label), n in flow.dispatched.items():
            dispatched.add_metric([band, label], n)
        rejected = CounterMetricFamily(
            PREFIX + "flow_rejected",
            "Flow control: requests refused (429) or whose client left while queued",
            labels=["band", "flow", "reason"],
        )
        for (band, label, reason), n in flow.rejected.items():
            rejected.add_metric([band, label, reason], n)
        predicted = GaugeMetricFamily(
            PREFIX + "flow_predicted_ttft_seconds",
            "Flow control: the latest prediction of the best worker's TTFT",
        )
        predicted.add_metric([], flow.last.ttft_s if flow.last is not None else 0.0)
        yield queued
        yield queued_bytes
        yield dispatched
        yield rejected
        yield predicted
        yield from flow.wait.collect()

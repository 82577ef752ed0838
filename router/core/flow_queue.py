"""Flow control's pure part: who a request is, the queue's order, and when the fleet is full.

No clock, no event loop, no I/O: every time is passed in, so ``serve``, the endpoint picker
(:mod:`router.core.flow`, which adds the waiting) and the offline simulator
(:mod:`traces.sim.simulator`) order and admit requests with the same code.

- :func:`classify`: a request's priority band, flow and deadline from its headers and body:
  ``x-priority`` (an integer, higher first; negative = sheddable), else GIE's
  ``x-llm-d-inference-objective`` mapped through the configured objectives, else the body's
  ``priority`` (vLLM's field, lower first: band ``-priority``), else 0; the flow from the
  fairness header (GIE's ``x-llm-d-inference-fairness-id`` by default), else the API key's
  tenant, else ``default``; the deadline from ``x-llm-d-slo-ttft-ms``. A priority is
  clamped to [:data:`PRIORITY_MIN`, :data:`PRIORITY_MAX`]: any client may send one, and
  past that range a number orders nothing a deployment uses, while every distinct band
  costs the queue its own structures.
- :class:`FlowQueue`: strict priority across bands; within a band, fair share across flows
  (least attained service in prompt tokens, divided by the flow's weight; a flow that was
  idle starts at the least attained service of the active ones, so it banks no credit);
  within a flow, earliest deadline first (a request without an SLO header: its arrival plus
  the band's TTL, which is first come first served among them). Limits per band: queued
  requests, bytes, TTL.
- :func:`predicted_ttft`: the router's own model of the fleet: the best worker's predicted
  time to first token for the request (with a GPU cost profile, the worker's cost model,
  the one the ttft picker prices with; else its prefill queue and the request's own
  uncached prefill at the worker's learned rate, plus the decode every engine step of that
  prefill carries, :class:`StepCost`), and how much of the request's own prefill alone that
  is; :func:`saturated` compares it with the target.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.base import RequestFeatures
from policies.hits import UNHEALTHY, estimate_tier_hits
from router.cache.cost_model import CostTerms
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S

PRIORITY_HEADER = "x-priority"
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
DEFAULT_FLOW = "default"
FLOW_ID_MAX = 128  # characters of a client's flow id kept (longer ones are cut)
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # a band outside them counts as the nearest one

# why a request left the queue without a worker (the ``reason`` label)
QUEUE_FULL = "queue_full"
QUEUE_BYTES = "queue_bytes"
TTL = "ttl"
SHED = "shed"
DISCONNECT = "client_disconnect"


@dataclass(frozen=True, slots=True)
class Classified:
    """A request's place in flow control."""

    band: int  # priority: higher first; negative = sheddable
    flow: str  # the fairness id (tenant)
    slo_s: float | None  # its TTFT objective, when it states one


def classify(
    header: Callable[[str], str | None],
    body: Mapping[str, Any] | None,
    objectives: Mapping[str, int],
    fairness_header: str = FAIRNESS_HEADER,
    api_key: str | None = None,
) -> Classified:
    """The band, flow and SLO of a request; ``header(name)``: a request header's value (a
    lower-case name) or None; ``api_key``: the client's key, whose tenant (a digest, never
    the key) is the flow when no fairness header names one. Unreadable values are ignored."""
    band = None
    raw = header(PRIORITY_HEADER)
    if raw is not None:
        band = _int(raw)
    if band is None:
        objective = header(OBJECTIVE_HEADER)
        if objective is not None and objective in objectives:
            band = int(objectives[objective])
    if band is None and body is not None:
        value = body_priority(body)
        if value is not None:
            band = -value  # vLLM: lower first
    flow = header(fairness_header)
    if flow:
        flow = flow[:FLOW_ID_MAX]
    elif api_key:
        flow = "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:12]
    else:
        flow = DEFAULT_FLOW
    slo_s = None
    raw = header(SLO_TTFT_HEADER)
    if raw is not None:
        ms = _float(raw)
        if ms is not None and ms > 0:
            slo_s = ms / 1000.0
    band = 0 if band is None else min(max(band, PRIORITY_MIN), PRIORITY_MAX)
    return Classified(band, flow, slo_s)


def body_priority(body: Mapping[str, Any]) -> int | None:
    """The body's ``priority`` (vLLM's field, lower first) when it is an integer."""
    value = body.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# ---- the queue ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What one band may hold: requests, bytes (0: no limit), and the longest wait."""

    max_requests: int = 1000
    max_bytes: int = 256 << 20
    ttl_s: float = 30.0


class QueueFull(Exception):
    """A band is at its limit; ``reason``: :data:`QUEUE_FULL` or :data:`QUEUE_BYTES`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True, eq=False)
class Waiting:
    """One queued request; ``payload``: whatever the caller waits on."""

    band: int
    flow: str
    cost: int  # prompt tokens: the service it receives when dispatched
    size: int  # body bytes
    arrival: float
    deadline: float | None = None  # arrival + its SLO, when it states one
    payload: Any = None
    expires: float = 0.0  # set by the queue: arrival + the band's TTL
    key: tuple[float, int] = (0.0, 0)  # its order within its flow


@dataclass(slots=True)
class _Flow:
    items: list = field(default_factory=list)  # heap of (key, Waiting)
    attained: float = 0.0


@dataclass(slots=True)
class _Band:
    flows: dict[str, _Flow] = field(default_factory=dict)  # the flows with queued requests
    served: dict[str, float] = field(default_factory=dict)  # attained service of idle ones
    floor: float = 0.0  # the least attained service a flow starts from
    count: int = 0
    bytes: int = 0


class FlowQueue:
    """The queued requests in their dispatch order (see the module docstring)."""

    SERVED_MAX = 4096  # idle flows whose attained service is remembered, per band
    BANDS_KEPT = 64  # empty bands kept (their flows' service); past it an emptied one goes

    def __init__(
        self,
        limits: Limits | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.weights = dict(weights or {})
        self.bands: dict[int, _Band] = {}
        self._seq = 0
        self._count = 0
        self._next_expiry = math.inf

    def __len__(self) -> int:
        return self._count

    def weight(self, flow: str) -> float:
        w = self.weights.get(flow, 1.0)
        return w if w > 0 else 1.0

    def push(self, item: Waiting) -> None:
        """Queue ``item``; :class:`QueueFull` when its band is at a limit."""
        limits = self.limits
        band = self.bands.get(item.band)
        if band is None:
            band = self.bands[item.band] = _Band()
        if limits.max_requests and band.count >= limits.max_requests:
            raise QueueFull(QUEUE_FULL)
        if limits.max_bytes and band.bytes + item.size > limits.max_bytes:
            raise QueueFull(QUEUE_BYTES)
        flow = band.flows.get(item.flow)
        if flow is None:
            active = [f.attained for f in band.flows.values()]
            start = min(active) if active else band.floor
            flow = band.flows[item.flow] = _Flow(
                attained=max(band.served.pop(item.flow, 0.0), start)
            )
        self._seq += 1
        item.expires = item.arrival + limits.ttl_s
        order = item.deadline if item.deadline is not None else item.expires
        item.key = (order, self._seq)
        heapq.heappush(flow.items, (item.key, item))
        band.count += 1
        band.bytes += item.size
        self._count += 1
        self._next_expiry = min(self._next_expiry, item.expires)

    def head(self) -> Waiting | None:
        """The next request to dispatch (None: the queue is empty)."""
        for number in sorted(self.bands, reverse=True):
            band = self.bands[number]
            if not band.flows:
                continue
            flow = min(
                band.flows.values(),
                key=lambda f: (f.attained, f.items[0][0]),
            )
            return flow.items[0][1]
        return None

    def pop(self) -> Waiting | None:
        """Take the head out and charge its flow the service it gets."""
        item = self.head()
        if item is None:
            return None
        band = self.bands[item.band]
        flow = band.flows[item.flow]
        band.floor = max(band.floor, flow.attained)
        flow.attained += item.cost / self.weight(item.flow)
        heapq.heappop(flow.items)
        self._take(item, band, flow)
        return item

    def remove(self, item: Waiting) -> bool:
        """Take ``item`` out wherever it is (its client left); False if it is not queued."""
        band = self.bands.get(item.band)
        flow = band.flows.get(item.flow) if band is not None else None
        if flow is None:
            return False
        for i, (_, queued) in enumerate(flow.items):
            if queued is item:
                flow.items[i] = flow.items[-1]
                flow.items.pop()
                heapq.heapify(flow.items)
                self._take(item, band, flow)
                return True
        return False

    def _take(self, item: Waiting, band: _Band, flow: _Flow) -> None:
        band.count -= 1
        band.bytes -= item.size
        self._count -= 1
        if not flow.items:  # idle: remember what it had, bounded
            del band.flows[item.flow]
            served = band.served
            if len(served) >= self.SERVED_MAX:
                served.clear()  # (they restart at the floor: no credit, no debt past it)
            served[item.flow] = flow.attained
        if not band.count and not band.flows:
            band.bytes = 0
            if len(self.bands) > self.BANDS_KEPT:  # many priorities seen: forget this one
                del self.bands[item.band]

    def expired(self, now: float) -> list[Waiting]:
        """Take out and return the requests whose TTL has passed at ``now``."""
        if now < self._next_expiry:
            return []
        out = [item for item in self.items() if item.expires <= now]
        for item in out:
            self.remove(item)
        self._next_expiry = min((item.expires for item in self.items()), default=math.inf)
        return out

    def items(self) -> Iterator[Waiting]:
        for band in self.bands.values():
            for flow in band.flows.values():
                for _, item in flow.items:
                    yield item

    def ahead_of(self, band: int) -> int:
        """Requests queued in ``band`` or a higher one (a new request waits behind them)."""
        return sum(b.count for n, b in self.bands.items() if n >= band)

    def snapshot(self) -> dict[str, Any]:
        """Queued requests and bytes per band and flow, and each flow's attained service."""
        bands = {}
        for number in sorted(self.bands, reverse=True):
            band = self.bands[number]
            if not band.count:
                continue
            bands[str(number)] = {
                "queued": band.count,
                "bytes": band.bytes,
                "flows": {
                    name: {"queued": len(f.items), "attained_tokens": round(f.attained)}
                    for name, f in sorted(band.flows.items())
                },
            }
        return {"queued": self._count, "bands": bands}


# ---- saturation -----------------------------------------------------------------------------


KV_RESERVE = 0.4
"""The share of each worker's KV that requests below the highest priority seen recently
leave free for it (:meth:`router.core.flow.FlowAdmission.kv_limit_for`): a lower band is
saturated once every worker's booked KV plus its prompt passes ``1 - KV_RESERVE`` of the
capacity. Without it the lower band's long decodes filled the KV and a higher band's
request waited for room at the worker, whatever its priority in the router (issue 52: on
the conversation sample at 3x over 4 H100 workers, interactive TTFT p90 6.1 s, 2.5 s with
it; ``--flow-kv-reserve``)."""

CHUNK_TOKENS = 8192  # prefill tokens an engine step carries (vLLM's long-prefill chunk)
DECODE_STEP_S = 0.008  # a decode step's fixed cost (measured: H100, 8B, 7.9 ms)
DECODE_TOKEN_S = 4.3e-8  # ... and per context token in the batch (measured: 42.6 ns)


@dataclass(frozen=True, slots=True)
class StepCost:
    """What an engine step of a worker costs beside its prefill when the router has no GPU
    profile (``--cost-profile flat``): the decode of every running sequence rides along with
    each chunk, ``step_s + token_s * context`` (``context``: the tokens the batch attends
    to), so a worker holding long contexts prefills its queue slower than its rate alone
    says. Defaults: the H100 8B profile's decode fit (router/cache/profiles/h100-llama8b.json);
    ``serve --flow-decode-step-s`` and ``--flow-decode-token-s`` set them. Priced through
    the cost model's arithmetic (:meth:`terms`), not a copy of it."""

    step_s: float = DECODE_STEP_S
    token_s: float = DECODE_TOKEN_S
    chunk_tokens: int = CHUNK_TOKENS

    def terms(self, rate: float) -> CostTerms:
        """These costs as the cost model's terms, with prefill at ``rate`` tokens/s: each
        step ``step_s`` plus ``token_s`` per context token passed as ``context`` (no
        attention term, no per-sequence term)."""
        step, token = self.step_s, self.token_s
        return CostTerms(1.0 / rate, 0.0, step, step, token, 0.0, self.chunk_tokens)


STEP_COST = StepCost()
FLAT_TERMS = STEP_COST.terms(DEFAULT_PREFILL_TOKENS_PER_S)


@dataclass(frozen=True, slots=True)
class Prediction:
    """The best worker's predicted TTFT for a request, its own prefill alone (the least over
    the workers), and ``wait_s``: the least wait any worker's queue and KV room add to the
    request's own prefill there (0: some worker would start it at once; None: read as
    ``ttft_s - own_s``)."""

    ttft_s: float
    own_s: float
    kv_full: bool = False
    wait_s: float | None = None


def predicted_ttft(
    features: RequestFeatures,
    views: Sequence[Any],
    default_rate: float,
    now: float | None = None,
    kv_limit: float = 0.0,
    cost: StepCost = STEP_COST,
) -> Prediction:
    """The least predicted TTFT over the healthy workers in ``views``, plus the load of what
    the request finds in a worker's CPU KV tier (as the ttft picker prices it) and the wait
    for KV room where the worker's is full (:func:`memory_wait`). Each worker's TTFT:

    - its cost model's, when its terms come from a GPU profile (``--cost-profile``): the
      same prediction the ttft picker prices with, ``view.cost.ttft_s(uncached, cached,
      now)`` with its learned correction: the queue as booked, each booking's attention over
      its cached prefix, the request's own (``cached``: its GPU and CPU-tier hit), the decode
      batch by context;
    - otherwise :func:`worker_ttft`: the prefill queued there (what is left of it at
      ``now``, when the view can tell) plus the request's own uncached prefill at the
      worker's learned rate (``default_rate`` for views without one), plus the decode of the
      tokens it holds, which every engine step of that prefill carries (``cost``). Without
      the decode, a fleet of long running sequences read as idle while each step took
      several times its prefill (issue 52: every request dispatched, the workers' TTFT p90
      at 43 s).

    A pure function of the workers' state, the one place flow control (``serve``, the
    endpoint picker and the simulator) predicts a TTFT. ``own_s``: the least of the
    request's own prefill alone, with the decode it would carry, over the workers (a
    worker whose prefill queue is empty predicts exactly that; waiting for one with no
    running sequence could last as long as they run). ``wait_s``: the least, over the
    workers, of what its queue and the wait for KV room add to the request's own prefill
    alone on that worker (0: some worker starts it at once). Per worker: the worker that
    prefills it fastest (a cached prefix) may have a queue while another is free, and a
    request too long for the target compared with the first one's alone waited for that
    queue to empty, its band behind it (issue 52: interactive TTFT p90 11.9 s at 2x the
    conversation sample on 4 H100 workers, 4.2 s read per worker). ``kv_limit`` > 0: a
    worker whose booked KV plus the prompt passes that fraction of its capacity is full;
    ``kv_full`` when every one is. A worker with nothing booked is never full: a prompt
    above the limit's share of every worker's KV goes once some worker can take it alone
    (the worker answers it, as it would without the router), instead of waiting out its
    TTL and its band behind it.
    Raises :class:`~policies.base.NoHealthyWorker` when none is healthy."""
    hits, loads, _ = estimate_tier_hits(features, views)
    length = features.input_length
    best = own = wait = math.inf
    full = True
    for i, (view, hit) in enumerate(zip(views, hits, strict=True)):
        if hit == UNHEALTHY:
            continue
        uncached = length - hit if length > hit else 0
        model = view.cost
        if model is not None and model.profiled:  # the router's cost model: one predictor
            terms = model.terms
            alone = model.alone_s(uncached, length - uncached)
            ttft = model.ttft_s(uncached, length - uncached, now)
        else:
            rate_of = getattr(view, "rate", None)
            rate = rate_of.tokens_per_s if rate_of is not None else default_rate
            terms = cost.terms(rate if rate > 0 else default_rate)
            left = getattr(view, "prefill_left", None)
            pending = left(now) if left is not None and now is not None else None
            if pending is None:
                pending = view.pending_prefill_tokens
            alone = worker_ttft(0, uncached, terms, view)
            ttft = worker_ttft(pending, uncached, terms, view)
        ttft += memory_wait(uncached, view, terms)
        if ttft - alone < wait:
            wait = ttft - alone
        ttft += loads[i] if loads else 0.0
        if ttft < best:
            best = ttft
        if alone < own:
            own = alone
        if kv_limit > 0 and full:
            capacity = view.kv_capacity_tokens
            held = view.held_tokens
            if not capacity or held <= 0 or held + uncached <= kv_limit * capacity:
                full = False
    return Prediction(best, own, kv_limit > 0 and full, max(wait, 0.0))


def worker_ttft(pending: float, uncached: float, terms: CostTerms, view: Any = None) -> float:
    """One worker's predicted TTFT without a profiled cost model: ``uncached`` new prompt
    tokens behind ``pending`` queued ones, priced by ``terms`` (:meth:`StepCost.terms`: their
    prefill at the worker's rate, and in each engine step it takes the decode of the tokens
    ``view`` holds: its booked requests' prompts and expected output; no ``view``: an idle
    worker)."""
    context = view.held_tokens if view is not None else 0
    return terms.ttft_s(max(pending, 0) + uncached, 0.0, 0, max(context, 0))


def memory_wait(uncached: float, view: Any, terms: CostTerms = FLAT_TERMS) -> float:
    """How long the request waits at the worker for KV room: 0 while its booked KV plus the
    prompt fits; past it, until enough running sequences finish to free the excess. Each
    finished sequence frees its share of the booked KV (``held / n``); the running ones have
    on average half their expected output ahead (``decode / n``), spread evenly, so the
    ``k``-th to finish does so after about ``k / (n + 1)`` of that many decode steps (an
    engine admits in order, so the prompts queued ahead need room first: they are booked,
    in ``held``). Decode steps while it waits cost as ``terms`` price a step of the batch
    with its context (:meth:`CostTerms.decode_step_s`)."""
    n = view.num_requests
    held = view.held_tokens
    capacity = view.kv_capacity_tokens
    if n <= 0 or held <= 0 or not capacity:
        return 0.0
    excess = held + uncached - capacity
    if excess <= 0:
        return 0.0
    finishing = min(math.ceil(excess * n / held), n)
    decode = max(view.ongoing_decode_tokens, 0)
    return decode / n * finishing / (n + 1) * terms.decode_step_s(n, held)


def saturated(prediction: Prediction, target_s: float) -> bool:
    """Whether placing the request now would miss ``target_s`` because of the queues: its
    predicted TTFT is past the target and every worker would make it wait before its own
    prefill (``wait_s`` > 0: a prompt too long for the target still goes once some worker
    can start it at once), or every worker's KV is full."""
    ttft = prediction.ttft_s
    wait = prediction.wait_s
    if wait is None:
        wait = ttft - prediction.own_s
    return prediction.kv_full or (ttft > target_s and wait > 0.0)

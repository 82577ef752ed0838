"""Every Prometheus metric the proxy exports (prefix ``cache_router_``), in one place.

Each app owns a :class:`~prometheus_client.CollectorRegistry`, so tests can build several.
Nothing on the hot path is a prometheus_client object: counters and gauges are plain ints on
the worker and the pool (:mod:`router.fleet.stats`), and histograms are :class:`Buckets`
(a list of counts, one ``bisect`` an observation: prometheus_client's ``Histogram.observe``
takes a lock and was ~5% of the proxy's CPU). Collectors read them at scrape time, which
keeps one source of truth for ``/workers`` and ``/metrics``.

Metrics (labels):

- ``requests_total`` (worker, policy, status): one per attempt on a worker, ``status`` its
  outcome: the HTTP status relayed, or ``connect_error`` / ``reset`` (then retried elsewhere),
  ``504``, ``client_disconnect``, ``upstream_lost`` (a stream the worker cut);
  ``worker="none"`` for requests answered before any worker was tried (400, 401, 413, 503);
- ``request_duration_seconds``, ``time_to_first_byte_seconds`` (policy, endpoint);
  ``pick_duration_seconds`` (policy);
- ``endpoint_requests_total`` (endpoint, status): ``requests_total`` by endpoint
  (``chat``, ``completion``, ``generate``, ``responses``, ``response_call``, ``embeddings``,
  ``rerank``, ``score``, ``pooling``, ``classify``, ``tokenize``, ``detokenize``, ``audio``);
  ``response_owners`` (stored responses whose worker the router knows) and
  ``response_owner_lookups_total`` (result: ``local``, ``shared``, ``unknown``);
- ``decisions_total`` (policy, branch): the picker's branch (``response_owner``: a call on a
  stored response, sent to the worker that stored it);
- ``prompt_tokens_total``, ``estimated_hit_tokens_total``, ``best_hit_tokens_total`` (worker):
  the chosen worker's estimated hit and the best estimate among healthy workers;
- ``reported_requests_total``, ``reported_cached_tokens_total`` (worker),
  ``estimated_cached_tokens_total`` and ``shadow_abs_error_tokens_total`` (worker, shadow):
  both shadows' estimates against what the worker reported, over requests with a report;
- ``worker_in_flight``, ``worker_pending_prefill_tokens``, ``worker_healthy``,
  ``worker_shadow_blocks``, ``worker_pinned_blocks``, ``worker_shadow_capacity_blocks``,
  ``worker_radix_tokens``, ``worker_radix_capacity_tokens`` (worker) gauges;
- ``retries_total`` (reason), ``upstream_errors_total`` (worker, kind),
  ``shadow_corrections_total`` (worker, shadow, direction), ``tokenize_total`` (result);
- the circuit of each worker (:mod:`router.fleet.pool`): ``circuit_transitions_total`` (worker,
  state ``open`` / ``closed``), ``worker_consecutive_failures`` (worker);
- admission and client limits (:mod:`router.service.server`, :mod:`router.proxy.forward`):
  ``in_flight`` (generation requests being handled), ``client_connections``,
  ``rejected_total`` (reason: ``inflight`` 429, ``connections`` / ``draining`` 503,
  ``header_too_large`` 431, ``read_timeout`` 408, ``malformed_http`` 400),
  ``suspect_requests_total`` (failed alike on several workers: counted against none);
- with ``--flow-control`` (:mod:`router.core.flow`'s collector): ``flow_queued`` (band,
  flow), ``flow_queued_bytes`` (band), ``flow_dispatched_total`` (band, flow),
  ``flow_rejected_total`` (band, flow, reason), ``flow_wait_seconds`` (band),
  ``flow_predicted_ttft_seconds``; band and flow come from clients and are capped with
  ``other`` (:mod:`router.core.flow_labels`);
- by model (:func:`model_metrics`): ``model_requests_total`` (model, status),
  ``model_prompt_tokens_total``, ``model_estimated_hit_tokens_total``,
  ``model_reported_requests_total``, ``model_reported_prompt_tokens_total``,
  ``model_reported_cached_tokens_total`` (model): a model label is one some worker serves,
  ``none`` or ``other``; ``worker_model`` (worker, model, kind) 1 per served model;
  ``worker_lora_swaps_total``, ``worker_lora_running`` (worker); with ``--discover``:
  ``discovery_workers`` (source), ``discovery_errors_total`` (source, kind),
  ``discovery_changes_total`` (change);
- what the workers say and how the shadows score against it: :func:`truth_metrics`
  (``worker_prefix_cache_*``, ``worker_requests_*``, ``worker_kv_*``, ``shadow_error_ratio``,
  ``kv_events_total``); ``estimated_cached_tokens_total`` and ``shadow_abs_error_tokens_total``
  also have ``shadow="kv_events"`` in precise mode;
- per KV tier, where the workers have a CPU tier (``--cpu-kv-capacity-tokens``):
  ``estimated_cached_tokens_total`` and ``shadow_abs_error_tokens_total`` with
  ``shadow="cpu_tier"`` (the CPU tier's shadow against the tokens the worker says it loaded)
  and ``shadow="gpu_tier"`` (the active GPU estimate against the rest), ``shadow_error_ratio``
  for both, over the reports that split their cached tokens by tier (the sim worker's);
  ``worker_cpu_shadow_blocks``, ``worker_cpu_shadow_capacity_blocks`` (worker) gauges;
- the TTFT cost model (:mod:`router.cache.cost_model`, ``--cost-profile``), over streamed
  answers: ``ttft_prediction_error_ratio`` (worker), a histogram of |predicted - observed| /
  observed TTFT (the prediction made at booking, the queue ahead in it);
  ``ttft_predicted_seconds_total`` and ``ttft_observed_seconds_total`` (worker), their sums;
  ``worker_cost_correction`` (worker), the factor learned from them;
  ``worker_engine_order_correction`` (worker), the one of the prediction in the engines'
  priority order (``--engine-priority``: :mod:`router.cache.engine_queue`), which the
  histogram scores instead there (and with ``--dispatch-hold-tokens``);
- ``--dispatch-hold-tokens`` (:mod:`router.core.dispatch_hold`): ``dispatch_held`` and
  ``dispatch_sent_prefill_tokens`` (worker) gauges, ``dispatch_held_requests_total``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from router.cache.cost_model import ERROR_BOUNDS
from router.fleet.pool import WorkerPool
from router.fleet.stats import SyncStats

PREFIX = "cache_router_"

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
PICK_BUCKETS = (2e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class Buckets:
    """One histogram series: plain counts, observed without a lock (only the event loop
    observes, and scrapes run on it too)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bucket with le >= value
        self.sum += value


class HistogramFamily(Collector):
    """A labelled histogram of :class:`Buckets`, exported as Prometheus histograms."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]):
        self.name = name
        self.doc = doc
        self.labelnames = list(labels)
        self.bounds = tuple(bounds)
        self.children: dict[tuple[str, ...], Buckets] = {}

    def labels(self, *values: str) -> Buckets:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = Buckets(self.bounds)
        return child

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for values, child in list(self.children.items()):
            cumulative, total = [], 0
            for le, n in zip(les, child.counts, strict=True):
                total += n
                cumulative.append((le, total))
            family.add_metric(list(values), cumulative, child.sum)
        yield family


class RouterMetrics:
    """The histograms, and the collector that exports the counters of ``pool``."""

    def __init__(self, policy: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.policy = policy
        self.request_duration = HistogramFamily(
            PREFIX + "request_duration_seconds",
            "Time from request arrival to the last byte sent (or the error)",
            ["policy", "endpoint"],
            LATENCY_BUCKETS,
        )
        self.time_to_first_byte = HistogramFamily(
            PREFIX + "time_to_first_byte_seconds",
            "Time from request arrival to the worker's first body byte",
            ["policy", "endpoint"],
            LATENCY_BUCKETS,
        )
        self.pick_duration = HistogramFamily(
            PREFIX + "pick_duration_seconds",
            "Time the picker took to choose a worker",
            ["policy"],
            PICK_BUCKETS,
        )
        self.prefill_duration = HistogramFamily(
            PREFIX + "prefill_leg_seconds",
            "Disaggregated requests: time from arrival to the prefill worker's answer",
            ["policy", "protocol"],
            LATENCY_BUCKETS,
        )
        for family in (
            self.request_duration,
            self.time_to_first_byte,
            self.pick_duration,
            self.prefill_duration,
        ):
            self.registry.register(family)
        self._duration: dict[str, Buckets] = {}
        self._ttfb: dict[str, Buckets] = {}
        self.pick = self.pick_duration.labels(policy)

    def duration(self, endpoint: str) -> Buckets:
        child = self._duration.get(endpoint)
        if child is None:
            child = self._duration[endpoint] = self.request_duration.labels(self.policy, endpoint)
        return child

    def ttfb(self, endpoint: str) -> Buckets:
        child = self._ttfb.get(endpoint)
        if child is None:
            child = self._ttfb[endpoint] = self.time_to_first_byte.labels(self.policy, endpoint)
        return child

    def prefill_leg(self, protocol: str) -> Buckets:
        return self.prefill_duration.labels(self.policy, protocol)

    def watch(self, pool: WorkerPool) -> None:
        """Export ``pool``'s counters and gauges from now on."""
        self.registry.register(PoolCollector(pool, self.policy))

    def watch_owners(self, owners) -> None:
        """Export the Responses API's owner map (:mod:`router.fleet.response_owners`)."""
        self.registry.register(OwnersCollector(owners))

    def watch_hold(self, hold, pool: WorkerPool) -> None:
        """Export ``--dispatch-hold-tokens``'s counts (:mod:`router.core.dispatch_hold`)."""
        self.registry.register(HoldCollector(hold, pool))

    def watch_discovery(self, discovery) -> None:
        """Export the ``--discover`` sources' counters (:mod:`router.fleet.discovery`)."""
        self.registry.register(DiscoveryCollector(discovery))


class HoldCollector(Collector):
    """``--dispatch-hold-tokens`` (:mod:`router.core.dispatch_hold`), per worker."""

    def __init__(self, hold, pool: WorkerPool) -> None:
        self.hold = hold
        self.pool = pool

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        hold = self.hold
        held = _gauge("dispatch_held", "Requests held at the router for room on their worker")
        sent = _gauge(
            "dispatch_sent_prefill_tokens",
            "Uncached prompt tokens sent to the worker whose first token has not come",
        )
        for w in self.pool.workers:
            held.add_metric([w.url], hold.held(w.url))
            sent.add_metric([w.url], hold.sent_tokens(w.url))
        waited = CounterMetricFamily(
            PREFIX + "dispatch_held_requests", "Requests that waited at the router for room"
        )
        waited.add_metric([], hold.waited)
        yield held
        yield sent
        yield waited


class PoolCollector(Collector):
    """Reads the pool's plain counters when Prometheus scrapes."""

    def __init__(self, pool: WorkerPool, policy: str) -> None:
        self.pool = pool
        self.policy = policy

    def describe(self) -> list[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        pool, policy = self.pool, self.policy
        workers = list(pool.workers)
        yield from request_metrics(pool, policy, workers)
        yield from hit_metrics(workers)
        yield from load_metrics(workers)
        yield from fleet_metrics(pool, workers)
        yield from prediction_metrics(workers)
        yield from truth_metrics(workers)
        yield from model_metrics(pool, workers)
        if pool.stats.sync.enabled:
            yield from sync_metrics(pool.stats.sync, workers)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ("worker",)) -> GaugeMetricFamily:
    """A gauge, by worker unless told."""
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def request_metrics(pool: WorkerPool, policy: str, workers: list) -> list[Metric]:
    """Requests by worker and status, by endpoint; the picker's branches, retries, and the
    worker /tokenize lookups."""
    stats = pool.stats
    requests = _counter(
        "requests", "Requests by worker, policy and status", ["worker", "policy", "status"]
    )
    for status, n in stats.unrouted.items():
        requests.add_metric(["none", policy, status], n)
    for w in workers:
        for status, n in w.stats.requests.items():
            requests.add_metric([w.url, policy, status], n)
    endpoints = _counter(
        "endpoint_requests", "Requests by endpoint and status", ["endpoint", "status"]
    )
    for endpoint, table in stats.endpoints.items():
        for status, n in table.items():
            endpoints.add_metric([endpoint, status], n)
    decisions = _counter("decisions", "Picker decisions by branch", ["policy", "branch"])
    for branch, n in stats.decisions.items():
        decisions.add_metric([policy, branch], n)
    retries = _counter("retries", "Requests retried on another worker", ["reason"])
    for reason, n in stats.retries.items():
        retries.add_metric([reason], n)
    tokenize = _counter("tokenize", "Worker /tokenize lookups by result", ["result"])
    for result, n in stats.tokenize.items():
        tokenize.add_metric([result], n)
    return [requests, endpoints, decisions, retries, tokenize]


def hit_metrics(workers: list) -> list[Metric]:
    """Per worker: the prompt tokens routed, the hits estimated at dispatch, what the worker
    reported and each shadow's error against it; its upstream errors and shadow corrections."""
    prompt = _counter("prompt_tokens", "Prompt tokens routed (router tokens)", ["worker"])
    est_hit = _counter(
        "estimated_hit_tokens", "Chosen worker's estimated cache hit at dispatch", ["worker"]
    )
    best_hit = _counter(
        "best_hit_tokens", "Best estimated hit among healthy workers at dispatch", ["worker"]
    )
    reported_requests = _counter(
        "reported_requests", "Requests whose worker reported cached tokens", ["worker"]
    )
    reported = _counter(
        "reported_cached_tokens",
        "Cached tokens the worker reported (router tokens)",
        ["worker"],
    )
    estimated = _counter(
        "estimated_cached_tokens",
        "Shadow estimates of cached tokens, over requests with a report",
        ["worker", "shadow"],
    )
    abs_error = _counter(
        "shadow_abs_error_tokens",
        "Sum of |estimate - reported| cached tokens per shadow",
        ["worker", "shadow"],
    )
    upstream_errors = _counter(
        "upstream_errors", "Failed exchanges with workers by kind", ["worker", "kind"]
    )
    corrections = _counter(
        "shadow_corrections",
        "Shadow capacity corrections from reports",
        ["worker", "shadow", "direction"],
    )
    for w in workers:
        url, state, stats = w.url, w.state, w.stats
        prompt.add_metric([url], stats.prompt_tokens)
        est_hit.add_metric([url], stats.estimated_hit_tokens)
        best_hit.add_metric([url], stats.best_hit_tokens)
        acc = state.accuracy
        reported_requests.add_metric([url], acc.requests)
        reported.add_metric([url], acc.reported_tokens)
        estimated.add_metric([url, "blocks"], acc.blocks_estimate_tokens)
        abs_error.add_metric([url, "blocks"], acc.blocks_abs_error_tokens)
        if state.radix is not None:
            estimated.add_metric([url, "radix"], acc.radix_estimate_tokens)
            abs_error.add_metric([url, "radix"], acc.radix_abs_error_tokens)
        if state.kv_index is not None:  # precise mode: scored over synced dispatches
            estimated.add_metric([url, "kv_events"], acc.kv_estimate_tokens)
            abs_error.add_metric([url, "kv_events"], acc.kv_abs_error_tokens)
        if state.cpu is not None:  # per tier, over reports that split by tier
            estimated.add_metric([url, "cpu_tier"], acc.cpu_estimate_tokens)
            abs_error.add_metric([url, "cpu_tier"], acc.cpu_abs_error_tokens)
            abs_error.add_metric([url, "gpu_tier"], acc.gpu_abs_error_tokens)
        for kind, n in stats.upstream_errors.items():
            upstream_errors.add_metric([url, kind], n)
        for (shadow, direction), n in stats.corrections.items():
            corrections.add_metric([url, shadow, direction], n)
    return [
        prompt,
        est_hit,
        best_hit,
        reported_requests,
        reported,
        estimated,
        abs_error,
        upstream_errors,
        corrections,
    ]


def load_metrics(workers: list) -> list[Metric]:
    """Per worker: what is booked on it, its health, and the sizes of its shadows."""
    in_flight = _gauge("worker_in_flight", "Requests booked on the worker")
    pending = _gauge("worker_pending_prefill_tokens", "Booked prompt tokens not yet prefilled")
    healthy = _gauge("worker_healthy", "1 if the worker takes requests")
    shadow_blocks = _gauge("worker_shadow_blocks", "Blocks in the block-hash shadow")
    pinned = _gauge("worker_pinned_blocks", "Shadow blocks pinned by in-flight requests")
    capacity = _gauge("worker_shadow_capacity_blocks", "Block shadow capacity (corrected)")
    radix_tokens = _gauge("worker_radix_tokens", "Tokens in the radix shadow")
    radix_capacity = _gauge("worker_radix_capacity_tokens", "Radix shadow capacity (corrected)")
    cpu_blocks = _gauge("worker_cpu_shadow_blocks", "Blocks in the CPU tier's shadow")
    cpu_capacity = _gauge("worker_cpu_shadow_capacity_blocks", "CPU tier shadow capacity")
    for w in workers:
        url, state = w.url, w.state
        in_flight.add_metric([url], state.num_requests)
        pending.add_metric([url], state.pending_prefill_tokens)
        healthy.add_metric([url], 1 if state.healthy else 0)
        shadow_blocks.add_metric([url], len(state.blocks))
        pinned.add_metric([url], state.blocks.pinned_blocks)
        capacity.add_metric([url], state.blocks.capacity_blocks)
        if state.radix is not None:
            radix_tokens.add_metric([url], state.radix.total_tokens)
            radix_capacity.add_metric([url], state.radix.capacity_tokens or 0)
        if state.cpu is not None:
            cpu_blocks.add_metric([url], len(state.cpu))
            cpu_capacity.add_metric([url], state.cpu.capacity_blocks)
    return [
        in_flight,
        pending,
        healthy,
        shadow_blocks,
        pinned,
        capacity,
        radix_tokens,
        radix_capacity,
        cpu_blocks,
        cpu_capacity,
    ]


def fleet_metrics(pool: WorkerPool, workers: list) -> list[Metric]:
    """The router's refusals, requests and connections in flight, suspect and disaggregated
    requests; per worker its circuit, failures in a row, role and KV held."""
    stats = pool.stats
    rejected = _counter(
        "rejected", "Requests refused by admission control or client limits", ["reason"]
    )
    for reason, n in stats.rejected.items():
        rejected.add_metric([reason], n)
    router_in_flight = GaugeMetricFamily(
        PREFIX + "in_flight", "Generation requests being handled by the router"
    )
    router_in_flight.add_metric([], stats.in_flight)
    connections = GaugeMetricFamily(PREFIX + "client_connections", "Open client connections")
    connections.add_metric([], stats.connections)
    suspect = CounterMetricFamily(
        PREFIX + "suspect_requests",
        "Requests that failed alike on several workers (not counted against them)",
    )
    suspect.add_metric([], stats.suspect)
    disaggregated = _counter(
        "disaggregated_requests",
        "Requests served by a prefill and a decode worker, by protocol and outcome",
        ["protocol", "outcome"],
    )
    for (protocol, outcome), n in stats.disaggregated.items():
        disaggregated.add_metric([protocol, outcome], n)
    role = GaugeMetricFamily(
        PREFIX + "worker_role",
        "1 for the worker's role: both (aggregated), prefill or decode",
        labels=["worker", "role"],
    )
    held = _gauge("worker_held_tokens", "KV booked on the worker: prompt plus expected output")
    circuit = _counter(
        "circuit_transitions",
        "Worker circuit transitions (open: taken out, closed: back)",
        ["worker", "state"],
    )
    failures = _gauge("worker_consecutive_failures", "Failures in a row (probes, requests)")
    for w in workers:
        url = w.url
        for state_name, n in w.stats.circuit.items():
            circuit.add_metric([url, state_name], n)
        failures.add_metric([url], w.consecutive_failures)
        role.add_metric([url, w.role], 1)
        held.add_metric([url], w.state.held_tokens)
    return [
        rejected,
        router_in_flight,
        connections,
        suspect,
        circuit,
        failures,
        disaggregated,
        role,
        held,
    ]


def prediction_metrics(workers: list) -> list[Metric]:
    """Per worker: how far the cost model's TTFT predictions were from the TTFTs observed,
    and its learned correction."""
    prediction_error = HistogramMetricFamily(
        PREFIX + "ttft_prediction_error_ratio",
        "|predicted - observed| / observed time to first token of streamed answers "
        "(the cost model's prediction at booking)",
        labels=["worker"],
    )
    predicted_s = _counter(
        "ttft_predicted_seconds", "Predicted TTFT of the scored answers, summed", ["worker"]
    )
    observed_s = _counter(
        "ttft_observed_seconds", "Observed TTFT of the scored answers, summed", ["worker"]
    )
    correction = _gauge(
        "worker_cost_correction", "The cost model's learned factor (observed / predicted)"
    )
    order_correction = _gauge(
        "worker_engine_order_correction",
        "The learned factor of the TTFT predicted in the engine's priority order "
        "(serve --engine-priority)",
    )
    error_les = [floatToGoString(b) for b in ERROR_BOUNDS] + ["+Inf"]
    for w in workers:
        url, cost = w.url, w.state.cost
        errors = cost.errors
        cumulative, total = [], 0
        for le, n in zip(error_les, errors.buckets, strict=True):
            total += n
            cumulative.append((le, total))
        prediction_error.add_metric([url], cumulative, errors.abs_error_sum)
        predicted_s.add_metric([url], errors.predicted_s)
        observed_s.add_metric([url], errors.observed_s)
        correction.add_metric([url], cost.factor)
        order_correction.add_metric([url], cost.order_factor)
    return [prediction_error, predicted_s, observed_s, correction, order_correction]


def model_metrics(pool: WorkerPool, workers: list) -> Iterator[Metric]:
    """By model (labels bounded: :class:`router.fleet.stats.PoolStats`), the models each
    worker serves, and its LoRA adapter slots as the router books them."""

    def family(kind, name: str, doc: str, labels: tuple[str, ...]):
        return kind(PREFIX + name, doc, labels=labels)

    requests = family(
        CounterMetricFamily, "model_requests", "Attempts by model and status", ("model", "status")
    )
    totals = {
        "prompt_tokens": "Prompt tokens routed (router tokens)",
        "estimated_hit_tokens": "Chosen worker's estimated cache hit at dispatch",
        "reported_requests": "Requests whose worker reported cached tokens",
        "reported_prompt_tokens": "Prompt tokens of the requests with a report",
        "reported_cached_tokens": "Cached tokens the workers reported (router tokens)",
    }
    counters = {
        attr: family(CounterMetricFamily, "model_" + attr, doc, ("model",))
        for attr, doc in totals.items()
    }
    for model, stats in pool.stats.models.items():
        for status, n in stats.requests.items():
            requests.add_metric([model, status], n)
        for attr, metric in counters.items():
            metric.add_metric([model], getattr(stats, attr))
    served = family(
        GaugeMetricFamily,
        "worker_model",
        "1 per model a worker serves (kind: base or adapter)",
        ("worker", "model", "kind"),
    )
    swaps = family(
        CounterMetricFamily,
        "worker_lora_swaps",
        "LoRA adapters sent to a worker where they were not resident (router's estimate)",
        ("worker",),
    )
    running = family(
        GaugeMetricFamily, "worker_lora_running", "LoRA adapters with requests booked", ("worker",)
    )
    for w in workers:
        for model in sorted(w.models or ()):
            served.add_metric([w.url, model, "adapter" if model in w.adapters else "base"], 1)
        slots = w.state.adapters
        swaps.add_metric([w.url], slots.swaps)
        running.add_metric([w.url], len(slots.running))
    yield from (requests, *counters.values(), served, swaps, running)


class OwnersCollector(Collector):
    """Which worker stored each Responses API response: size and look-ups."""

    def __init__(self, owners) -> None:
        self.owners = owners

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        known = GaugeMetricFamily(
            PREFIX + "response_owners", "Stored responses whose worker this router knows"
        )
        known.add_metric([], len(self.owners))
        lookups = CounterMetricFamily(
            PREFIX + "response_owner_lookups",
            "Look-ups of a stored response's worker by result (local, shared, unknown)",
            labels=["result"],
        )
        for result, n in self.owners.lookups.items():
            lookups.add_metric([result], n)
        yield from (known, lookups)


class DiscoveryCollector(Collector):
    """The ``--discover`` sources: workers each lists, failures, joins and leaves."""

    def __init__(self, discovery) -> None:
        self.discovery = discovery

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        d = self.discovery
        listed = GaugeMetricFamily(
            PREFIX + "discovery_workers", "Workers a discovery source lists", labels=["source"]
        )
        errors = CounterMetricFamily(
            PREFIX + "discovery_errors",
            "Failed look-ups by source and kind (the last list stands)",
            labels=["source", "kind"],
        )
        changes = CounterMetricFamily(
            PREFIX + "discovery_changes", "Workers that joined or left", labels=["change"]
        )
        for source in d.sources:
            listed.add_metric([source.uri], len(d.found[source.uri]))
            for kind, n in source.stats.errors.items():
                errors.add_metric([source.uri, kind], n)
        changes.add_metric(["joined"], d.joined)
        changes.add_metric(["left"], d.left)
        yield from (listed, errors, changes)


def sync_metrics(sync: SyncStats, workers: list) -> Iterator[Metric]:
    """The state shared with other router replicas (``--state-url``, router/fleet/state_sync.py)."""

    def family(kind, name: str, doc: str, labels: tuple[str, ...] = ()):
        return kind(PREFIX + "state_sync_" + name, doc, labels=list(labels))

    up = family(GaugeMetricFamily, "up", "1 while this replica trades state through Redis")
    up.add_metric([], 1 if sync.up else 0)
    peers = family(GaugeMetricFamily, "peers", "Other live router replicas seen")
    peers.add_metric([], sync.peers)
    lag = family(
        GaugeMetricFamily, "lag_seconds", "Age of the last applied batch of others' bookings"
    )
    lag.add_metric([], sync.lag_s)
    published = family(CounterMetricFamily, "published", "Items shared", ("kind",))
    for kind, n in sync.published.items():
        published.add_metric([kind], n)
    applied = family(CounterMetricFamily, "applied", "Others' items applied here", ("kind",))
    for kind, n in sync.applied.items():
        applied.add_metric([kind], n)
    errors = family(CounterMetricFamily, "errors", "Failed Redis calls", ("operation",))
    for op, n in sync.errors.items():
        errors.add_metric([op], n)
    bad = family(CounterMetricFamily, "bad_entries", "Unreadable data under the prefix, skipped")
    bad.add_metric([], sync.bad_entries)
    dropped = family(CounterMetricFamily, "dropped", "Bookings dropped while Redis was unreachable")
    dropped.add_metric([], sync.dropped)
    outages = family(CounterMetricFamily, "outages", "Times the link to Redis went down")
    outages.add_metric([], sync.outages)
    remote = GaugeMetricFamily(
        PREFIX + "worker_remote_in_flight",
        "Requests other replicas have in flight on the worker (included in worker_in_flight)",
        labels=["worker"],
    )
    for w in workers:
        remote.add_metric([w.url], w.remote_load[0])
    yield from (up, peers, lag, published, applied, errors, bad, dropped, outages, remote)


def truth_metrics(workers: list) -> Iterator[Metric]:
    """What the workers say (their /metrics, their KV events) and how the shadows score.

    - ``worker_prefix_cache_queries_total``, ``worker_prefix_cache_hits_total`` (worker): the
      worker's own prefix-cache counters, in tokens, as last scraped
      (:mod:`router.fleet.worker_metrics`); ``worker_prefix_cache_hit_rate`` their ratio;
    - ``worker_requests_running``, ``worker_requests_waiting``, ``worker_kv_cache_usage_ratio``,
      ``worker_kv_capacity_tokens`` (block_size x num_gpu_blocks), ``worker_metrics_age_seconds``
      gauges, ``worker_metrics_scrape_failures_total``;
    - ``shadow_scored_prompt_tokens_total`` (worker, shadow): prompt tokens of the requests
      each shadow was scored on; ``shadow_error_ratio`` (shadow): sum of |estimate - reported|
      over that, all workers: the shadow's fidelity as a fraction of prompt tokens;
    - precise mode (:mod:`router.fleet.kv_events`): ``worker_kv_events_synced``,
      ``worker_kv_events_blocks`` gauges, ``kv_events_total`` (worker, kind: batches, stored,
      removed, cleared, gaps, replays, restarts, desyncs, unknown_parent, skipped).
    """
    import time

    queries = _counter(
        "worker_prefix_cache_queries", "Worker's prefix cache queries (tokens)", ["worker"]
    )
    hits = _counter("worker_prefix_cache_hits", "Worker's prefix cache hits (tokens)", ["worker"])
    failures = _counter("worker_metrics_scrape_failures", "Failed /metrics scrapes", ["worker"])
    hit_rate = _gauge("worker_prefix_cache_hit_rate", "Worker's own prefix cache hit rate")
    running = _gauge("worker_requests_running", "Requests the worker reports running")
    waiting = _gauge("worker_requests_waiting", "Requests the worker reports waiting")
    usage = _gauge("worker_kv_cache_usage_ratio", "Worker's KV cache usage (0..1)")
    capacity = _gauge("worker_kv_capacity_tokens", "Worker's KV capacity (block_size x blocks)")
    age = _gauge("worker_metrics_age_seconds", "Seconds since the last successful scrape")
    scored = _counter(
        "shadow_scored_prompt_tokens",
        "Prompt tokens of the requests a shadow was scored on",
        ["worker", "shadow"],
    )
    ratio = _gauge(
        "shadow_error_ratio",
        "Sum |estimated - reported cached tokens| / prompt tokens, all workers",
        ("shadow",),
    )
    synced = _gauge("worker_kv_events_synced", "1 while the KV-event index is in sync")
    kv_blocks = _gauge("worker_kv_events_blocks", "Blocks in the KV-event index")
    kv_total = _counter("kv_events", "KV event processing by kind", ["worker", "kind"])
    errors = {"blocks": 0, "radix": 0, "kv_events": 0, "cpu_tier": 0, "gpu_tier": 0}
    prompts = dict.fromkeys(errors, 0)
    now = time.monotonic()
    for w in workers:
        url, truth, state, acc = w.url, w.truth, w.state, w.state.accuracy
        failures.add_metric([url], truth.failures)
        r = truth.reading
        if r is not None:
            for family, value in (
                (queries, r.prefix_cache_queries),
                (hits, r.prefix_cache_hits),
                (running, r.running),
                (waiting, r.waiting),
                (usage, r.kv_cache_usage),
                (capacity, r.capacity_tokens),
                (hit_rate, truth.hit_rate),
            ):
                if value is not None:
                    family.add_metric([url], value)
        if truth.last_scrape_monotonic is not None:
            age.add_metric([url], now - truth.last_scrape_monotonic)
        scored.add_metric([url, "blocks"], acc.prompt_tokens)
        errors["blocks"] += acc.blocks_abs_error_tokens
        prompts["blocks"] += acc.prompt_tokens
        if state.radix is not None:
            scored.add_metric([url, "radix"], acc.prompt_tokens)
            errors["radix"] += acc.radix_abs_error_tokens
            prompts["radix"] += acc.prompt_tokens
        if state.cpu is not None:
            for tier, error in (
                ("cpu_tier", acc.cpu_abs_error_tokens),
                ("gpu_tier", acc.gpu_abs_error_tokens),
            ):
                scored.add_metric([url, tier], acc.tier_prompt_tokens)
                errors[tier] += error
                prompts[tier] += acc.tier_prompt_tokens
        index = state.kv_index
        if index is not None:
            scored.add_metric([url, "kv_events"], acc.kv_prompt_tokens)
            errors["kv_events"] += acc.kv_abs_error_tokens
            prompts["kv_events"] += acc.kv_prompt_tokens
            synced.add_metric([url], 1 if index.synced else 0)
            kv_blocks.add_metric([url], len(index))
            for kind, n in vars(index.stats).items():
                kv_total.add_metric([url, kind], n)
    for shadow, total in prompts.items():
        if total:
            ratio.add_metric([shadow], errors[shadow] / total)
    yield from (queries, hits, failures, hit_rate, running, waiting, usage, capacity, age)
    yield from (scored, ratio, synced, kv_blocks, kv_total)

"""Every Prometheus metric the proxy exports (prefix ``cache_router_``), in one place.

Each app owns a :class:`~prometheus_client.CollectorRegistry`, so tests can build several.
Histograms are observed on the hot path. Counters and gauges are *not* prometheus_client
objects: the hot path adds to plain ints on the worker (:class:`WorkerStats`) and the pool,
and a collector reads them at scrape time, which costs nothing per request and keeps one
source of truth for ``/workers`` and ``/metrics``.

Metrics (labels):

- ``requests_total`` (worker, policy, status): one per attempt on a worker, ``status`` its
  outcome: the HTTP status relayed, or ``connect_error`` / ``reset`` (then retried elsewhere),
  ``504``, ``client_disconnect``, ``upstream_lost`` (a stream the worker cut);
  ``worker="none"`` for requests answered before any worker was tried (400, 401, 413, 503);
- ``request_duration_seconds``, ``time_to_first_byte_seconds`` (policy, endpoint);
  ``pick_duration_seconds`` (policy);
- ``decisions_total`` (policy, branch): the picker's branch;
- ``prompt_tokens_total``, ``estimated_hit_tokens_total``, ``best_hit_tokens_total`` (worker):
  the chosen worker's estimated hit and the best estimate among healthy workers;
- ``reported_requests_total``, ``reported_cached_tokens_total`` (worker),
  ``estimated_cached_tokens_total`` and ``shadow_abs_error_tokens_total`` (worker, shadow):
  both shadows' estimates against what the worker reported, over requests with a report;
- ``worker_in_flight``, ``worker_pending_prefill_tokens``, ``worker_healthy``,
  ``worker_shadow_blocks``, ``worker_pinned_blocks``, ``worker_shadow_capacity_blocks``,
  ``worker_radix_tokens``, ``worker_radix_capacity_tokens`` (worker) gauges;
- ``retries_total`` (reason), ``upstream_errors_total`` (worker, kind),
  ``shadow_corrections_total`` (worker, shadow, direction), ``tokenize_total`` (result).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from router.pool import WorkerPool

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


@dataclass
class WorkerStats:
    """Plain counters of one worker, bumped on the hot path, read at scrape time."""

    requests: dict[str, int] = field(default_factory=dict)  # status -> count
    prompt_tokens: int = 0
    estimated_hit_tokens: int = 0
    best_hit_tokens: int = 0
    reported_cached_raw: int = 0  # as the worker counted them (its tokens)
    upstream_errors: dict[str, int] = field(default_factory=dict)
    corrections: dict[tuple[str, str], int] = field(default_factory=dict)

    def count(self, table: dict, key, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass
class PoolStats:
    """Counters that belong to no worker."""

    decisions: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    unrouted: dict[str, int] = field(default_factory=dict)  # status -> count (worker "none")
    tokenize: dict[str, int] = field(default_factory=dict)


class RouterMetrics:
    """The histograms, and the collector that exports the counters of ``pool``."""

    def __init__(self, policy: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.policy = policy
        self.request_duration = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from request arrival to the last byte sent (or the error)",
            ["policy", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.time_to_first_byte = Histogram(
            PREFIX + "time_to_first_byte_seconds",
            "Time from request arrival to the worker's first body byte",
            ["policy", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pick_duration = Histogram(
            PREFIX + "pick_duration_seconds",
            "Time the picker took to choose a worker",
            ["policy"],
            buckets=PICK_BUCKETS,
            registry=self.registry,
        )
        self._duration = {}
        self._ttfb = {}
        self.pick = self.pick_duration.labels(policy)

    def duration(self, endpoint: str):
        child = self._duration.get(endpoint)
        if child is None:
            child = self._duration[endpoint] = self.request_duration.labels(self.policy, endpoint)
        return child

    def ttfb(self, endpoint: str):
        child = self._ttfb.get(endpoint)
        if child is None:
            child = self._ttfb[endpoint] = self.time_to_first_byte.labels(self.policy, endpoint)
        return child

    def watch(self, pool: WorkerPool) -> None:
        """Export ``pool``'s counters and gauges from now on."""
        self.registry.register(PoolCollector(pool, self.policy))


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

        def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=labels)

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=["worker"])

        requests = counter(
            "requests", "Requests by worker, policy and status", ["worker", "policy", "status"]
        )
        for status, n in pool.stats.unrouted.items():
            requests.add_metric(["none", policy, status], n)
        decisions = counter("decisions", "Picker decisions by branch", ["policy", "branch"])
        for branch, n in pool.stats.decisions.items():
            decisions.add_metric([policy, branch], n)
        retries = counter("retries", "Requests retried on another worker", ["reason"])
        for reason, n in pool.stats.retries.items():
            retries.add_metric([reason], n)
        tokenize = counter("tokenize", "Worker /tokenize lookups by result", ["result"])
        for result, n in pool.stats.tokenize.items():
            tokenize.add_metric([result], n)

        prompt = counter("prompt_tokens", "Prompt tokens routed (router tokens)", ["worker"])
        est_hit = counter(
            "estimated_hit_tokens", "Chosen worker's estimated cache hit at dispatch", ["worker"]
        )
        best_hit = counter(
            "best_hit_tokens", "Best estimated hit among healthy workers at dispatch", ["worker"]
        )
        reported_requests = counter(
            "reported_requests", "Requests whose worker reported cached tokens", ["worker"]
        )
        reported = counter(
            "reported_cached_tokens",
            "Cached tokens the worker reported (router tokens)",
            ["worker"],
        )
        estimated = counter(
            "estimated_cached_tokens",
            "Shadow estimates of cached tokens, over requests with a report",
            ["worker", "shadow"],
        )
        abs_error = counter(
            "shadow_abs_error_tokens",
            "Sum of |estimate - reported| cached tokens per shadow",
            ["worker", "shadow"],
        )
        upstream_errors = counter(
            "upstream_errors", "Failed exchanges with workers by kind", ["worker", "kind"]
        )
        corrections = counter(
            "shadow_corrections",
            "Shadow capacity corrections from reports",
            ["worker", "shadow", "direction"],
        )
        in_flight = gauge("worker_in_flight", "Requests booked on the worker")
        pending = gauge("worker_pending_prefill_tokens", "Booked prompt tokens not yet prefilled")
        healthy = gauge("worker_healthy", "1 if the worker takes requests")
        shadow_blocks = gauge("worker_shadow_blocks", "Blocks in the block-hash shadow")
        pinned = gauge("worker_pinned_blocks", "Shadow blocks pinned by in-flight requests")
        capacity = gauge("worker_shadow_capacity_blocks", "Block shadow capacity (corrected)")
        radix_tokens = gauge("worker_radix_tokens", "Tokens in the radix shadow")
        radix_capacity = gauge("worker_radix_capacity_tokens", "Radix shadow capacity (corrected)")

        for w in workers:
            url, state, stats = w.url, w.state, w.stats
            for status, n in stats.requests.items():
                requests.add_metric([url, policy, status], n)
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
                radix_tokens.add_metric([url], state.radix.total_tokens)
                radix_capacity.add_metric([url], state.radix.capacity_tokens or 0)
            for kind, n in stats.upstream_errors.items():
                upstream_errors.add_metric([url, kind], n)
            for (shadow, direction), n in stats.corrections.items():
                corrections.add_metric([url, shadow, direction], n)
            in_flight.add_metric([url], state.num_requests)
            pending.add_metric([url], state.pending_prefill_tokens)
            healthy.add_metric([url], 1 if state.healthy else 0)
            shadow_blocks.add_metric([url], len(state.blocks))
            pinned.add_metric([url], state.blocks.pinned_blocks)
            capacity.add_metric([url], state.blocks.capacity_blocks)
        yield from (
            requests,
            decisions,
            retries,
            tokenize,
            prompt,
            est_hit,
            best_hit,
            reported_requests,
            reported,
            estimated,
            abs_error,
            upstream_errors,
            corrections,
            in_flight,
            pending,
            healthy,
            shadow_blocks,
            pinned,
            capacity,
            radix_tokens,
            radix_capacity,
        )

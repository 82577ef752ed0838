"""Plain counters of the pool and of each worker, bumped on the hot path.

They are plain ints, not Prometheus objects: adding to one costs nothing per request, and
:mod:`router.core.metrics` reads them at scrape time, so ``/workers`` and ``/metrics`` share
one source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    circuit: dict[str, int] = field(default_factory=dict)  # "open" / "closed" -> transitions

    def count(self, table: dict, key, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass
class ModelStats:
    """Plain counters of one model (or adapter) across workers: per-model hit rates."""

    requests: dict[str, int] = field(default_factory=dict)  # status -> attempts
    prompt_tokens: int = 0
    estimated_hit_tokens: int = 0
    reported_requests: int = 0
    reported_prompt_tokens: int = 0  # prompt tokens of the requests with a report
    reported_cached_tokens: int = 0  # router tokens


MODEL_LABELS_MAX = 256
"""Distinct model labels kept; beyond, a model counts as ``other`` (bounded label sets)."""


@dataclass
class SyncStats:
    """The state sync of router replicas (:mod:`router.fleet.state_sync`); off: ``enabled``
    stays False and nothing is exported."""

    enabled: bool = False
    up: bool = False
    replica: str = ""
    peers: int = 0  # other live replicas seen at the last load read
    lag_s: float = 0.0  # age of the last applied batch of another replica's bookings
    published: dict[str, int] = field(default_factory=dict)  # kind -> count
    applied: dict[str, int] = field(default_factory=dict)  # kind -> count
    errors: dict[str, int] = field(default_factory=dict)  # operation -> failed calls
    bad_entries: int = 0  # unreadable data found under the key prefix (ignored)
    dropped: int = 0  # bookings dropped while Redis was unreachable (outbox full)
    outages: int = 0  # transitions up -> down

    def count(self, table: dict, key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass
class PoolStats:
    """Counters that belong to no worker."""

    decisions: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    unrouted: dict[str, int] = field(default_factory=dict)  # status -> count (worker "none")
    tokenize: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0  # generation requests being handled (admission control)
    connections: int = 0  # open client connections
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count
    suspect: int = 0  # failed alike on several workers, nowhere served: not their fault
    # disaggregated requests by (protocol, outcome): outcome "ok" or the error code
    disaggregated: dict[tuple[str, str], int] = field(default_factory=dict)
    sync: SyncStats = field(default_factory=SyncStats)
    # by the model requests name: a model some worker serves, "none" (no model named) or
    # "other"; at most MODEL_LABELS_MAX of them
    models: dict[str, ModelStats] = field(default_factory=dict)

    # endpoint -> status -> attempts and unrouted requests (as requests_total by worker)
    endpoints: dict[str, dict[str, int]] = field(default_factory=dict)

    def count_rejected(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def endpoint(self, name: str) -> dict[str, int]:
        """The status counts of endpoint ``name`` (made on first use)."""
        table = self.endpoints.get(name)
        if table is None:
            table = self.endpoints[name] = {}
        return table

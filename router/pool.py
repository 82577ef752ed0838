"""The workers behind the proxy: their states, connections, health, and the picker over them.

Each :class:`Worker` owns one :class:`~router.worker_state.WorkerState` (load counters and
both shadows, sized to the worker's KV capacity), one connection pool and its counters.
The picker indexes the list of states the pool hands it, so the order is stable: a new
worker is appended.

Removal. A removed worker leaves the list at once (no new request goes there); requests in
flight on it hold its ``WorkerState`` through their booking and release there as usual. The
sticky and unified pickers bind sessions to list *indices*, which shift on removal, so the
picker is rebuilt (same name, same parameters): every session is routed as new once, then
binds again. Adding a worker keeps the picker (indices do not move).

Health. ``health_failure_threshold`` consecutive failures (health probes, connect errors and
resets of real requests) take a worker out of picking; one success brings it back, and then
its shadow is reset (unpinned entries forgotten, capacities restored): a worker that was down
most likely restarted with an empty cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.base import NoHealthyWorker, Pick, RequestFeatures
from policies.registry import make_picker
from router.block_lru import BlockLRU
from router.config import Settings, normalize_url
from router.feedback import reset_shadow
from router.metrics import PoolStats, WorkerStats
from router.radix_tree import RadixTree
from router.upstream import UpstreamPool
from router.worker_state import WorkerState

log = logging.getLogger("cache_router.pool")


@dataclass(eq=False)
class Worker:
    """One worker: its state for the pickers, its connections, its health and counters."""

    url: str
    state: WorkerState
    upstream: UpstreamPool
    capacity_tokens: int
    capacity_blocks: int
    consecutive_failures: int = 0
    last_error: str | None = None
    removed: bool = False
    stats: WorkerStats = field(default_factory=WorkerStats)

    @property
    def healthy(self) -> bool:
        return self.state.healthy

    def describe(self) -> dict[str, Any]:
        """The ``/workers`` entry."""
        state, acc = self.state, self.state.accuracy
        radix = state.radix
        return {
            "url": self.url,
            "healthy": state.healthy,
            "num_requests": state.num_requests,
            "pending_prefill_tokens": state.pending_prefill_tokens,
            "ongoing_decode_tokens": state.ongoing_decode_tokens,
            "pinned_blocks": state.blocks.pinned_blocks,
            "shadow_blocks": len(state.blocks),
            "shadow_capacity_blocks": state.blocks.capacity_blocks,
            "radix_tokens": radix.total_tokens if radix is not None else 0,
            "radix_locked_tokens": radix.protected_tokens if radix is not None else 0,
            "radix_capacity_tokens": radix.capacity_tokens if radix is not None else 0,
            "kv_capacity_tokens": self.capacity_tokens,
            "requests_total": sum(self.stats.requests.values()),
            "prompt_tokens": self.stats.prompt_tokens,
            "estimated_hit_tokens": self.stats.estimated_hit_tokens,
            "reported_cached_tokens": self.stats.reported_cached_raw,
            "accuracy": {
                "requests": acc.requests,
                "reported_tokens": acc.reported_tokens,
                "blocks_estimate_tokens": acc.blocks_estimate_tokens,
                "radix_estimate_tokens": acc.radix_estimate_tokens,
                "blocks_abs_error_tokens": acc.blocks_abs_error_tokens,
                "radix_abs_error_tokens": acc.radix_abs_error_tokens,
            },
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


class _Excluded:
    """A worker already tried for this request: the picker sees it as unhealthy."""

    __slots__ = ("_state",)
    healthy = False

    def __init__(self, state: WorkerState) -> None:
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class WorkerPool:
    """The workers, in picker order, and the picker that chooses among them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workers: list[Worker] = []
        self.states: list[WorkerState] = []
        self.stats = PoolStats()
        self.picker = self._new_picker()
        for url in settings.workers:
            self.add(url)

    def _new_picker(self):
        return make_picker(self.settings.policy, **self.settings.picker_params)

    # ---- membership ----------------------------------------------------------------------

    def get(self, url: str) -> Worker | None:
        url = normalize_url(url)
        for worker in self.workers:
            if worker.url == url:
                return worker
        return None

    def add(self, url: str, kv_capacity_tokens: int | None = None) -> Worker:
        """Append a worker (ValueError if the URL is already in the pool)."""
        url = normalize_url(url)
        if self.get(url) is not None:
            raise ValueError(f"worker {url} is already in the pool")
        s = self.settings
        tokens = kv_capacity_tokens or s.capacity_for(url)
        blocks = max(1, tokens // s.block_size)
        state = WorkerState(
            name=url,
            blocks=BlockLRU(blocks, s.block_size),
            radix=RadixTree(capacity_tokens=tokens, policy=s.radix_eviction),
            shadow=s.shadow,
        )
        worker = Worker(
            url=url,
            state=state,
            upstream=UpstreamPool(url, s.connect_timeout_s),
            capacity_tokens=tokens,
            capacity_blocks=blocks,
        )
        self.workers.append(worker)
        self.states.append(state)
        log.info("worker added: %s (KV %d tokens, %d blocks)", url, tokens, blocks)
        return worker

    def remove(self, url: str) -> Worker:
        """Take a worker out (KeyError if unknown); its in-flight requests finish there."""
        worker = self.get(url)
        if worker is None:
            raise KeyError(url)
        index = self.workers.index(worker)
        del self.workers[index]
        del self.states[index]
        worker.removed = True
        worker.upstream.close()
        self.picker = self._new_picker()  # session bindings were indices into the old list
        log.info("worker removed: %s (%d in flight)", worker.url, worker.state.num_requests)
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.upstream.close()

    # ---- health --------------------------------------------------------------------------

    def record_failure(self, worker: Worker, reason: str) -> None:
        worker.consecutive_failures += 1
        worker.last_error = reason
        if (
            worker.state.healthy
            and worker.consecutive_failures >= self.settings.health_failure_threshold
        ):
            worker.state.healthy = False
            log.warning("worker %s is out: %s", worker.url, reason)

    def record_success(self, worker: Worker) -> None:
        worker.consecutive_failures = 0
        if not worker.state.healthy and not worker.removed:
            worker.state.healthy = True
            reset_shadow(worker.state, worker.capacity_blocks, worker.capacity_tokens)
            log.warning("worker %s is back (shadow reset)", worker.url)

    # ---- picking -------------------------------------------------------------------------

    def pick(self, request: RequestFeatures, exclude: Sequence[Worker] = ()) -> tuple[Worker, Pick]:
        """The picker's choice among healthy workers not in ``exclude``.

        Raises :class:`~policies.base.NoHealthyWorker` when there is none.
        """
        views: Sequence[Any] = self.states
        if exclude:
            views = [_Excluded(w.state) if w in exclude else w.state for w in self.workers]
        choice = self.picker.pick(request, views)
        return self.workers[choice.worker], choice

    def healthy_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.state.healthy]


__all__ = ["NoHealthyWorker", "Worker", "WorkerPool"]

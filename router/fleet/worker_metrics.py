"""The scraper of worker truth: every ``worker_metrics_interval_s`` seconds (0 turns it off)
:class:`WorkerMetricsScraper` reads each worker's Prometheus ``/metrics`` into its
:class:`~router.fleet.worker_truth.WorkerTruth` (what is read, and why:
:mod:`router.fleet.worker_truth`). With ``shadow_capacity_from_worker`` the pool resizes the
worker's shadows to the KV capacity it reports (:meth:`router.fleet.pool.WorkerPool.resize`)
instead of the configured guess, and its CPU-tier shadow to the offloading size it reports
(:meth:`~router.fleet.pool.WorkerPool.resize_cpu`, at ``kv_bytes_per_token``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from router.fleet import periodic
from router.fleet.pool import Worker, WorkerPool
from router.fleet.upstream import UpstreamError
from router.fleet.worker_truth import parse_worker_metrics

log = logging.getLogger("cache_router.worker_metrics")


class WorkerMetricsScraper:
    """Reads every worker's ``/metrics`` periodically in one background task."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        s = pool.settings
        self.interval = s.worker_metrics_interval_s
        self.timeout = s.health_timeout_s
        self.path = s.worker_metrics_path
        self.size_shadows = s.shadow_capacity_from_worker
        self._task: asyncio.Task | None = None

    async def scrape(self, worker: Worker) -> bool:
        """Read one worker's page into ``worker.truth``; True if it could be read."""
        truth = worker.truth
        try:
            status, body = await asyncio.wait_for(
                worker.upstream.fetch("GET", self.path, timeout=self.timeout), self.timeout
            )
            if status != 200:
                raise UpstreamError(f"HTTP {status}")
            reading = parse_worker_metrics(body.decode("utf-8", "replace"))
        except (UpstreamError, TimeoutError, ValueError) as exc:
            truth.failures += 1
            truth.last_error = f"{type(exc).__name__}: {exc}"
            return False
        truth.reading = reading
        truth.scrapes += 1
        truth.last_scrape_monotonic = time.monotonic()
        truth.last_error = None
        if reading.block_size:  # estimates are then scored in the worker's whole blocks
            worker.state.worker_block_size = reading.block_size
            index = worker.state.kv_index
            if index is not None and index.block_size is None:
                # a synced index that has seen no stored block yet can answer (nothing cached)
                index.block_size = reading.block_size
        if reading.max_lora:  # LoRA slots and the adapters running: the worker's own view
            worker.state.adapters.report(reading.max_lora, reading.lora_running)
        capacity = reading.capacity_tokens
        if (
            self.size_shadows
            and capacity
            and (capacity != worker.capacity_tokens or not worker.capacity_reported)
            and not worker.removed
        ):
            self.pool.resize(worker, capacity)
        cpu_bytes = reading.cpu_kv_bytes
        if self.size_shadows and cpu_bytes and not worker.removed:
            self.pool.resize_cpu(worker, cpu_bytes // self.pool.settings.kv_bytes_per_token)
        return True

    async def scrape_all(self) -> None:
        """One round over every worker, concurrently."""
        workers = list(self.pool.workers)
        if workers:
            await asyncio.gather(*(self.scrape(w) for w in workers))

    async def _run(self) -> None:
        await periodic.every(self.interval, self.scrape_all, log, "worker metrics round")

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await periodic.cancel(task)

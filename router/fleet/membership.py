"""Workers joining and leaving: the one path for ``POST/DELETE /workers``, ``--discover`` and
the membership other replicas share (:mod:`router.fleet.state_sync`).

A worker that joins is probed for health and read for its models at once, not at the next
round, and, with ``--state-url``, written to the shared worker set. A worker that leaves
takes no new request and drains: requests in flight on it finish there
(:meth:`router.fleet.pool.WorkerPool.remove`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from router.fleet.pool import BOTH, Worker, WorkerPool


class SharedMembership(Protocol):
    """What the shared state does with local changes (:mod:`router.fleet.state_sync`)."""

    def worker_added(self, worker: Worker) -> None: ...

    def worker_removed(self, url: str) -> None: ...


class Membership:
    """Adds and removes workers of ``pool``; ``on_join`` callbacks run for every new worker
    (also those another replica added)."""

    def __init__(self, pool: WorkerPool, on_join: list[Callable[[Worker], None]]) -> None:
        self.pool = pool
        self.on_join = on_join
        self.shared: SharedMembership | None = None  # set with --state-url

    def add(
        self,
        url: str,
        kv_capacity_tokens: int | None = None,
        role: str = BOTH,
        bootstrap_port: int | None = None,
    ) -> Worker:
        """Add the worker at ``url`` in ``role`` (ValueError if it is in the pool, or a bad
        URL or role)."""
        worker = self.pool.add(url, kv_capacity_tokens, role, bootstrap_port)
        self.joined(worker)
        if self.shared is not None:
            self.shared.worker_added(worker)
        return worker

    def remove(self, url: str) -> Worker:
        """Take the worker at ``url`` out; it drains (KeyError if unknown)."""
        worker = self.pool.remove(url)
        if self.shared is not None:
            self.shared.worker_removed(worker.url)
        return worker

    def joined(self, worker: Worker) -> None:
        """A worker is new in the pool, however it came."""
        for callback in self.on_join:
            callback(worker)

"""What the admin API, the dashboard and the server need of the running router.

:class:`~router.service.app.RouterApp` is the one implementation; the modules it assembles take
this narrow view of it instead of importing it back.
"""

from __future__ import annotations

from typing import Any, Protocol

from router.config import Settings
from router.core.access import Access
from router.core.metrics import RouterMetrics
from router.core.routing import RouterCore
from router.fleet.discovery import Discovery
from router.fleet.health import HealthChecker
from router.fleet.membership import Membership
from router.fleet.pool import WorkerPool
from router.fleet.state_sync import StateSync


class DirectPath(Protocol):
    """A front end's entry for a generation request, which the server
    (:mod:`router.service.server`) calls without the app's ASGI dispatch: ``serve``'s
    forwarder (:class:`router.proxy.forward.Forwarder`)."""

    async def serve(self, scope: Any, receive: Any, send: Any, kind: str, channel: Any) -> None:
        """One generation request of ``kind``; ``channel``: the server's request cycle
        (:class:`router.service.server.RouterCycle`)."""


class RouterContext(Protocol):
    """The running router: its settings, pool, metrics, access rules, health checks, state
    sync, and whether it drains (set on SIGTERM by :mod:`router.service.server`)."""

    settings: Settings
    pool: WorkerPool
    metrics: RouterMetrics
    core: RouterCore  # reading, picking, booking; with --flow-control its queue (core.flow)
    access: Access
    health_checker: HealthChecker
    membership: Membership  # workers joining and leaving (admin API, discovery, replicas)
    discovery: Discovery | None  # with --discover: the sources that find workers
    state_sync: StateSync | None  # with --state-url: what is shared with other replicas
    draining: bool
    forwarder: DirectPath | None  # the direct path for generation requests; None: ASGI only

    async def __call__(self, scope, receive, send) -> None:
        """The ASGI application."""

    def drain(self) -> None:
        """The drain starts: refuse routed requests, answer flow control's queue 503."""

    def drain_ended(self) -> None:
        """The drain's time is over: what the server cancels now is answered 503."""

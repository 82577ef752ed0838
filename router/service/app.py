"""``RouterApp``: one router as every front end runs it, and its HTTP side as one ASGI app.

The runtime: the settings, the pool, its picker and shadows, the tokenizer, the metrics
registry, the response owners and the router core (:class:`~router.core.routing.RouterCore`,
which every front end routes with), with the background tasks (health checks,
each worker's models and ``/metrics``, KV events, shared state, discovery) started and
stopped by the lifespan. Each app has its own, so several can live in one process (tests do).

The HTTP side: the FastAPI app of :mod:`router.service.admin` (``/v1/models``, ``/health``,
``/metrics``, ``/workers``, the dashboard). Every request passes the access rules of
:mod:`router.core.access` (401 / 403) and has its body read here, bounded by
``max_body_bytes`` (413). A front end that serves the routed endpoints over HTTP (``serve``:
:mod:`router.proxy.app`) takes them first (:meth:`RouterApp.routed`). A request on a
connection over ``max_connections`` (flagged by :mod:`router.service.server`) and a routed
request while the router drains get 503 with ``Retry-After`` and ``Connection: close``.
"""

from __future__ import annotations

import logging

from router.config import Settings
from router.core.access import Access, Need, Verdict
from router.core.errors import (
    Forbidden,
    RouterError,
    ServiceUnavailable,
    Unauthorized,
    send_error,
)
from router.core.metrics import RouterMetrics
from router.core.routing import RouterCore
from router.core.tokenize import make_tokenizer
from router.fleet.discovery import Discovery
from router.fleet.health import HealthChecker
from router.fleet.kv_events import KVEventsManager
from router.fleet.membership import Membership
from router.fleet.models import ModelsWatcher
from router.fleet.pool import WorkerPool
from router.fleet.response_owners import ResponseOwners
from router.fleet.state_sync import StateSync
from router.fleet.upstream import UpstreamError
from router.fleet.worker_metrics import WorkerMetricsScraper
from router.service.admin import build_admin
from router.service.body import ClientGone, read_body
from router.service.context import DirectPath
from router.service.dashboard import mount_dashboard
from router.service.server import OVERLOADED_SCOPE_KEY

log = logging.getLogger("cache_router")


class RouterApp:
    """The router's runtime and its ASGI callable: admin API and lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # a front end's direct path, which the server calls for generation requests (the
        # proxy's forwarder); None: every request goes through the ASGI dispatch
        self.forwarder: DirectPath | None = None
        self.metrics = RouterMetrics(settings.policy)
        self.pool = WorkerPool(settings)
        self.metrics.watch(self.pool)
        self.tokenizer = make_tokenizer(
            settings.tokenizer,
            settings.block_size,
            ask=self._ask_worker,
            path=settings.tokenize_path,
            cache_bytes=settings.tokenize_cache_bytes,
            stats=self.pool.stats.tokenize,
        )
        self.owners = ResponseOwners(settings.response_owners_max)  # Responses API
        self.metrics.watch_owners(self.owners)
        self.core = RouterCore(settings, self.pool, self.tokenizer, self.metrics, self.owners)
        self.access = Access(settings)
        self.draining = False  # set on SIGTERM (router.service.server): new work is refused
        self.health_checker = HealthChecker(self.pool)
        self.models = ModelsWatcher(self.pool)  # each worker's /v1/models
        self.membership = Membership(self.pool, [self.health_checker.kick, self.models.kick])
        # worker truth (/metrics scrapes) and precise mode (KV events): router/fleet/
        # worker_metrics.py, router/fleet/kv_events.py
        self.worker_metrics = WorkerMetricsScraper(self.pool)
        self.kv_events = KVEventsManager(self.pool) if settings.kv_events else None
        # scale-out: bookings, load, sessions and membership shared with other replicas
        self.state_sync: StateSync | None = None
        if settings.state_url is not None:
            self.state_sync = StateSync(self.pool, settings, on_worker_added=self.membership.joined)
            self.pool.on_book = self.state_sync.record
            self.membership.shared = self.state_sync
            self.owners.shared = self.state_sync
        self.discovery = Discovery(self.membership, settings) if settings.discover else None
        if self.discovery is not None:
            self.metrics.watch_discovery(self.discovery)
        self.admin = build_admin(self)
        mount_dashboard(self.admin, self)  # GET /dashboard: the live page

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            if scope.get(OVERLOADED_SCOPE_KEY):
                await self._unavailable(send, "connections", "too many client connections")
                return
            if not await self.routed(scope, receive, send):
                await self._admin(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets: not served (the server closes them)

    async def routed(self, scope, receive, send) -> bool:
        """Serve a routed endpoint (a front end's); False: the admin app's request."""
        return False

    async def _unavailable_while_draining(self, send) -> bool:
        """503 for a routed request while the router drains; False: not draining."""
        if self.draining:
            await self._unavailable(send, "draining", "the router is shutting down")
        return self.draining

    async def _unavailable(self, send, reason: str, message: str) -> None:
        self.pool.stats.count_rejected(reason)
        error = ServiceUnavailable(message, code=reason)
        await send_error(send, error, [(b"connection", b"close")])

    def drain(self) -> None:
        """The drain starts (SIGTERM, :class:`~router.service.server.Server`): routed
        requests are refused from now on, and those waiting in flow control's queue are
        answered 503 at once; those sent to a worker go on for ``shutdown_timeout_s``."""
        self.draining = True
        self.core.drain()

    def drain_ended(self) -> None:
        """The drain's time is over: the server cancels what still runs, and each request
        whose answer has not started is answered 503 ``shutdown`` (Retry-After)."""
        self.core.drain_over = True

    async def _admin(self, scope, receive, send) -> None:
        """Access rules, then the body (bounded), then the admin app."""
        need = self.access.need(scope["method"], scope["path"])
        verdict = self.access.check(need, scope["headers"])
        if verdict is Verdict.UNAUTHORIZED:
            if need is Need.ADMIN:
                error = Unauthorized("admin key required", code="invalid_admin_key")
            else:
                error = Unauthorized("missing or invalid API key")
            await send_error(send, error)
            return
        if verdict is Verdict.FORBIDDEN:
            message = "worker changes are disabled: client keys are set but no --admin-key"
            await send_error(send, Forbidden(message, code="admin_disabled"))
            return
        limit = self.settings.max_body_bytes
        try:
            body = await read_body(receive, limit)
        except ClientGone:
            return
        except RouterError as error:  # 413
            await send_error(send, error)
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.admin(scope, replay, send)

    async def startup(self) -> None:
        self.health_checker.start()
        self.models.start()
        self.worker_metrics.start()
        if self.kv_events is not None:
            await self.kv_events.start()
        if self.state_sync is not None:
            await self.state_sync.start()
        if self.discovery is not None:
            self.discovery.start()
        log.info(
            "cache-router: %d worker(s), policy %s, shadow %s, tokenizer %s",
            len(self.pool.workers),
            self.settings.policy,
            self.settings.shadow,
            self.settings.tokenizer,
        )
        if not self.access.any_keys and self.settings.host not in ("127.0.0.1", "::1"):
            log.warning(
                "no --api-key / --admin-key: anyone who reaches %s:%d can use this router "
                "and change its workers",
                self.settings.host,
                self.settings.port,
            )

    async def shutdown(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.health_checker.stop()
        await self.models.stop()
        await self.worker_metrics.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.state_sync is not None:
            await self.state_sync.stop()
        self.pool.close()

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _ask_worker(self, path: str, body: bytes) -> bytes | None:
        """A healthy worker's answer to POST ``path`` (worker tokenization); None if none."""
        timeout = self.settings.tokenize_timeout_s
        for worker in self.pool.healthy_workers():
            try:
                status, data = await worker.upstream.fetch("POST", path, body, timeout)
            except UpstreamError:
                continue
            if status == 200:
                return data
        return None


def create_app(settings: Settings) -> RouterApp:
    """A fresh router (its core and HTTP side, no routed endpoints) for ``settings``."""
    return RouterApp(settings)

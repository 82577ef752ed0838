"""``create_app(settings)``: the proxy as one ASGI application.

The three generation endpoints go straight to the raw ASGI :class:`~router.forward.Forwarder`
(the hot path: no framework routing or request objects); every other path goes to the
FastAPI app of :mod:`router.admin`. The lifespan starts the health checks and closes the
worker connections. Each app has its own pool, picker, tokenizer and metrics registry, so
several can live in one process (tests do).
"""

from __future__ import annotations

import logging

from router.admin import build_admin
from router.config import Settings
from router.forward import Forwarder
from router.health import HealthChecker
from router.metrics import RouterMetrics
from router.parse import GENERATION_PATHS
from router.pool import WorkerPool
from router.tokenize import make_tokenizer
from router.upstream import UpstreamError

log = logging.getLogger("cache_router")


class RouterApp:
    """The ASGI callable: hot path, admin API and lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
        self.forwarder = Forwarder(settings, self.pool, self.tokenizer, self.metrics)
        self.health_checker = HealthChecker(self.pool)
        self.admin = build_admin(self)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            endpoint = GENERATION_PATHS.get(scope["path"])
            if endpoint is not None and scope["method"] == "POST":
                await self.forwarder(scope, receive, send, endpoint)
            else:
                await self.admin(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets: not served (the server closes them)

    async def startup(self) -> None:
        self.health_checker.start()
        log.info(
            "cache-router: %d worker(s), policy %s, shadow %s, tokenizer %s",
            len(self.pool.workers),
            self.settings.policy,
            self.settings.shadow,
            self.settings.tokenizer,
        )

    async def shutdown(self) -> None:
        await self.health_checker.stop()
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
    """A fresh proxy application for ``settings``."""
    return RouterApp(settings)

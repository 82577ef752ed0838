"""Fixtures for the proxy tests: fake workers and a real router, both on 127.0.0.1.

Each runs its own event loop in a thread (the router under uvicorn + uvloop, as
``cache-router serve`` runs it), so tests talk to them over real HTTP from the test's loop.
Everything a fixture starts it also stops; nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

sys.path.insert(0, str(Path(__file__).parent))

from fake_worker import FakeWorker

from router.config import Settings, load_settings
from router.proxy.app import RouterApp, create_app
from router.service.server import Server, build_config

FAST = {
    "health_interval_s": 0.2,
    "health_timeout_s": 0.5,
    "connect_timeout_s": 1.0,
    "read_timeout_s": 10.0,
    "log_level": "warning",
}


class RouterServer:
    """A router app served by uvicorn on an ephemeral port, in its own thread and loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app: RouterApp = create_app(settings)
        # the same server as `cache-router serve` (router.service.server: limits, drain), test port
        config = build_config(
            self.app, settings, host="127.0.0.1", port=0, log_level="warning", access_log=False
        )
        self.server = Server(config, self.app)
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True, name="router")
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("router did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.port = port

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def call(self, fn: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Run ``fn`` on the router's loop (to read or change its state safely)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if not self.loop.is_closed() and not self.thread.is_alive():
            self.loop.close()


@pytest.fixture
def fake_workers() -> Iterator[Callable[..., list[FakeWorker]]]:
    """``fake_workers(n, **knobs)``: started fake workers, closed after the test."""
    made: list[FakeWorker] = []

    def make(n: int = 2, **knobs: Any) -> list[FakeWorker]:
        out = [FakeWorker(f"w{len(made) + i}", **knobs).start() for i in range(n)]
        made.extend(out)
        return out

    yield make
    for worker in made:
        worker.close()


@pytest.fixture
def router_server() -> Iterator[Callable[..., RouterServer]]:
    """``router_server(workers=[...], **settings)``: a running proxy, stopped after the test."""
    made: list[RouterServer] = []

    def make(**values: Any) -> RouterServer:
        merged = {**FAST, **values}
        server = RouterServer(load_settings(**merged))
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (bounded: tests never spin forever)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()

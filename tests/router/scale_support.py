"""The real ``redis-server`` and ``haproxy`` (Debian's packages) of the scale-out tests.

The tests skip without them, unless ``CACHE_ROUTER_REDIS=1`` (set by ``.ci/run``, which installs
them) says they must be there: then they fail. The processes themselves are started and
stopped, by PID, by :mod:`traces.live.fleet`.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import httpx
import pytest

from router.service.supervisor import PrivateRedis
from traces.live import fleet


def need(program: str) -> str:
    """The path of ``program``; skip (or fail under ``CACHE_ROUTER_REDIS=1``) without it."""
    path = shutil.which(program)
    if path is None:
        message = f"{program} is not installed (apt-get install redis-server haproxy)"
        if os.environ.get("CACHE_ROUTER_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def pids_behind(url: str, want: int, timeout: float = 20.0) -> set[int]:
    """The ``serve --processes`` child PIDs answering at ``url`` (new connections spread over
    them), up to ``want``: waiting for ``want`` of them is waiting until every child serves."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        try:
            with httpx.Client(timeout=2) as client:  # a new connection each time
                seen.add(client.get(url + "/health").json()["state_sync"]["pid"])
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(0.05)
    return seen


class RedisServer(PrivateRedis):
    """The supervisor's private Redis in the test's folder, plus raw commands (garbage)."""

    def __init__(self, folder: Path) -> None:
        need("redis-server")
        super().__init__(folder)

    def start(self) -> RedisServer:  # type: ignore[override]
        super().start()
        return self

    def command(self, *args: str | bytes) -> bytes:
        """One command (RESP), the first line of its reply."""
        parts = [a.encode() if isinstance(a, str) else a for a in args]
        wire = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(self.socket))
            s.sendall(wire)
            return s.recv(65536).split(b"\r\n")[0]


class Haproxy(fleet.Haproxy):
    def __init__(self, folder: Path, port: int, backends: list[str]) -> None:
        need("haproxy")
        super().__init__(folder, port, backends)

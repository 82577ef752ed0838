"""A real ``redis-server`` (Debian's package) for the scale-out tests, on a unix socket.

The tests skip without one, unless ``CACHE_ROUTER_REDIS=1`` (set by ``.ci/run``, which installs
it) says it must be there: then they fail. Only the process started here is ever stopped, by
its PID; its socket and files live in the test's temporary folder.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 10.0


def need(program: str) -> str:
    """The path of ``program``; skip (or fail under ``CACHE_ROUTER_REDIS=1``) without it."""
    path = shutil.which(program)
    if path is None:
        message = f"{program} is not installed (apt-get install redis-server haproxy)"
        if os.environ.get("CACHE_ROUTER_REDIS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


class RedisServer:
    """``redis-server`` on ``<folder>/redis.sock`` (no TCP, no persistence); restartable."""

    def __init__(self, folder: Path) -> None:
        self.binary = need("redis-server")
        self.folder = folder
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.ping():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not answer within 10 s")

    def ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.5)
                s.connect(str(self.socket))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str | bytes) -> bytes:
        """One raw command (RESP), its first reply line: for writing garbage in tests."""
        parts = [a.encode() if isinstance(a, str) else a for a in args]
        wire = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(self.socket))
            s.sendall(wire)
            return s.recv(65536).split(b"\r\n")[0]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class Haproxy:
    """haproxy in TCP mode, round-robin over ``backends`` (host:port), health-checked every
    200 ms; a backend that fails one check is skipped, and a connect that fails goes to the
    next backend (``option redispatch``)."""

    def __init__(self, folder: Path, port: int, backends: list[str]) -> None:
        self.binary = need("haproxy")
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        servers = "\n".join(
            f"  server r{i} {b} check inter 200ms fall 1 rise 2" for i, b in enumerate(backends)
        )
        self.config = folder / "haproxy.cfg"
        self.config.write_text(
            f"""global
  maxconn 4096
defaults
  mode tcp
  timeout connect 1s
  timeout client 120s
  timeout server 120s
  retries 3
  option redispatch
frontend routers_in
  bind 127.0.0.1:{port}
  default_backend routers
backend routers
  balance roundrobin
{servers}
"""
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> Haproxy:
        self.proc = subprocess.Popen(
            [self.binary, "-f", str(self.config), "-db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("haproxy did not listen within 10 s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

"""Graceful shutdown of `cache-router serve` (a real process): SIGTERM stops accepting, lets
in-flight streams finish up to --shutdown-timeout-s, cuts what is left after that, and the
process exits 0. Keys given by flag and environment never appear in its output."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from streams import stream

STREAM = {"model": "fake-model", "stream": True, "prompt": "a long answer please " * 20}
CLIENT_KEY, ADMIN_KEY = "client-secret-7781", "admin-secret-3319"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_router(worker_url: str, shutdown_timeout_s: float) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "CACHE_ROUTER_ADMIN_KEY": ADMIN_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--worker", worker_url,
         "--port", str(port), "--api-key", CLIENT_KEY, "--log-level", "debug",
         "--shutdown-timeout-s", str(shutdown_timeout_s)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("router did not start")


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
        raise AssertionError("the router did not exit in time: " + out.decode()[-2000:]) from None
    return proc.returncode, out.decode(errors="replace")


async def test_sigterm_drains_in_flight_streams_then_exits_0(fake_workers):
    (worker,) = fake_workers(1, chunks=10, chunk_delay=0.2)  # ~2 s streams
    proc, port = start_router(worker.url, shutdown_timeout_s=10)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    streams = [
        asyncio.ensure_future(stream(port, "/v1/completions", STREAM, headers=headers))
        for _ in range(5)
    ]
    await asyncio.sleep(0.5)  # all of them mid-stream
    assert worker.in_flight == 5
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(_eventually_refused, port)  # stops accepting at once
    results = await asyncio.gather(*streams)
    assert all(r.status == 200 and r.complete for r in results)  # drained, not cut
    code, out = await asyncio.to_thread(finish, proc, 15)
    assert code == 0, out[-2000:]
    assert time.monotonic() - start < 6
    assert worker.cancelled == 0 and worker.completed == 5
    assert CLIENT_KEY not in out and ADMIN_KEY not in out
    assert "draining" in out


@pytest.mark.slow
async def test_sigterm_cuts_what_outlives_the_deadline_and_still_exits_0(fake_workers):
    (worker,) = fake_workers(1, chunks=100, chunk_delay=0.2)  # ~20 s streams
    proc, port = start_router(worker.url, shutdown_timeout_s=1)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    streams = [
        asyncio.ensure_future(stream(port, "/v1/completions", STREAM, headers=headers, timeout=30))
        for _ in range(3)
    ]
    await asyncio.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*streams)
    assert all(r.status == 200 and not r.complete for r in results)  # cut at the deadline
    code, out = await asyncio.to_thread(finish, proc, 15)
    assert code == 0, out[-2000:]
    assert time.monotonic() - start < 5
    # the router closed its upstream connections: the worker stopped generating
    assert await asyncio.to_thread(_eventually, lambda: worker.in_flight == 0)
    assert worker.cancelled == 3 and worker.completed == 0


@pytest.mark.slow
async def test_sigint_exits_0_when_idle(fake_workers):
    (worker,) = fake_workers(1)
    proc, port = start_router(worker.url, shutdown_timeout_s=5)
    proc.send_signal(signal.SIGINT)
    code, out = await asyncio.to_thread(finish, proc, 15)
    assert code == 0, out[-2000:]
    assert refused(port)


def _eventually_refused(port: int) -> bool:
    return _eventually(lambda: refused(port))


def _eventually(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()

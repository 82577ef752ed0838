"""Graceful shutdown of `cache-router serve` (a real process): SIGTERM stops accepting, lets
in-flight streams finish up to --shutdown-timeout-s, cuts what is left after that, and the
process exits 0. Every request the router holds is answered: one waiting in flow control's
queue gets the OpenAI-style 503 with Retry-After at once, one sent to a worker that has not
answered when the drain ends gets the same then (a stream under way ends with an error
event), never uvicorn's text/plain 500 and a traceback. Keys given by flag and environment
never appear in its output."""

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
_STARTED: list[subprocess.Popen] = []  # this test's routers, killed if it fails before its end


@pytest.fixture(autouse=True)
def _stop_started_routers():
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_router(
    worker_url: str, shutdown_timeout_s: float, *extra: str
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "CACHE_ROUTER_ADMIN_KEY": ADMIN_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--worker", worker_url,
         "--port", str(port), "--api-key", CLIENT_KEY, "--log-level", "debug",
         "--shutdown-timeout-s", str(shutdown_timeout_s), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _STARTED.append(proc)
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


def assert_shutdown_503(response: httpx.Response) -> None:
    """The router's answer to a request it held when it stopped: OpenAI-style JSON 503."""
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "shutdown"


def assert_clean_exit(code: int, out: str) -> None:
    """Exit 0, nothing held at the end, and no traceback (the drain's end is no error)."""
    assert code == 0, out[-2000:]
    assert "Traceback" not in out and "Exception in ASGI application" not in out, out[-3000:]
    assert "drained: 0 request(s) in flight, 0 booked on workers" in out, out[-2000:]


async def test_sigterm_answers_the_flow_queue_at_once_and_the_unanswered_at_the_end(
    fake_workers,
):
    # one worker prefilling a 2,000-token prompt at 100 tokens/s (20 s): the fleet is
    # saturated for anything else, which waits in flow control's queue
    (worker,) = fake_workers(1, hang=1)  # never answers: held until the drain's end
    flow = ["--flow-control", "--cost-profile", "flat", "--prefill-tokens-per-s", "100",
            "--flow-target-ttft-s", "0.5",
            "--flow-queue-ttl-s", "60"]  # fmt: skip
    proc, port = start_router(worker.url, 1.5, *flow)
    url = f"http://127.0.0.1:{port}"
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=20) as client:

        async def ask(words: int) -> httpx.Response:
            body = {"model": "fake-model", "prompt": "word " * words, "max_tokens": 2}
            return await client.post("/v1/completions", json=body)

        sent = asyncio.ensure_future(ask(2000))
        assert await asyncio.to_thread(_eventually, lambda: worker.in_flight == 1)
        queued = [asyncio.ensure_future(ask(10)) for _ in range(3)]

        def all_queued() -> bool:
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            return httpx.get(f"{url}/workers/flow", headers=admin).json()["queued"] == 3

        assert await asyncio.to_thread(_eventually, all_queued)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for response in await asyncio.gather(*queued):
            assert_shutdown_503(response)
        # at once, not at the drain's end: the request sent to the worker goes on meanwhile
        assert not sent.done()
        assert_shutdown_503(await sent)  # the worker had not answered when it ended
        assert time.monotonic() - start >= 1.5
    code, out = await asyncio.to_thread(finish, proc, 15)
    assert_clean_exit(code, out)
    assert await asyncio.to_thread(_eventually, lambda: worker.in_flight == 0)


async def test_sigterm_answers_requests_sent_but_unanswered_at_the_drain_end(fake_workers):
    # no flow control: a plain request and a stream the worker has not answered, and a
    # stream under way, all still running when the drain ends
    (worker,) = fake_workers(1, chunks=100, chunk_delay=0.2)  # ~20 s streams
    proc, port = start_router(worker.url, 1.0)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    hang = {**headers, "x-fake-hang": "1"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=20
    ) as client:
        plain = asyncio.ensure_future(
            client.post("/v1/completions", json={**STREAM, "stream": False}, headers=hang)
        )
        unstarted = asyncio.ensure_future(stream(port, "/v1/completions", STREAM, headers=hang))
        started = asyncio.ensure_future(stream(port, "/v1/completions", STREAM, headers=headers))
        assert await asyncio.to_thread(_eventually, lambda: worker.in_flight == 3)
        await asyncio.sleep(0.3)  # the stream's first events have gone to the client
        proc.send_signal(signal.SIGTERM)
        assert_shutdown_503(await plain)
        not_begun, under_way = await unstarted, await started
    head, _, body = not_begun.received.partition(b"\r\n\r\n")
    assert not_begun.status == 503 and b"retry-after: 1" in head.lower(), not_begun.received
    assert b"application/json" in head and b'"code":"shutdown"' in body
    # the stream under way ends with an error event and [DONE], its chunked body whole
    assert under_way.status == 200 and not under_way.complete
    assert under_way.received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), under_way.received[-300:]
    assert b'"code":"shutdown"' in under_way.received
    code, out = await asyncio.to_thread(finish, proc, 15)
    assert_clean_exit(code, out)
    assert await asyncio.to_thread(_eventually, lambda: worker.in_flight == 0)


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

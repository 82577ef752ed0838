"""Faults around the router: a worker killed mid-stream, a worker that accepts and hangs, a
worker answering 500s in bursts, a worker removed and re-added with requests in flight, and a
client that sends slowly or disconnects at every point of an exchange.

After each: every booking released (in flight, pending prefill, decode tokens, pinned blocks,
locked radix tokens all 0, also on the state of a removed worker), nothing in flight in the
router, and the router still serves.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx
import pytest
from reliability_support import (
    all_zero,
    booked,
    complete_response,
    raw_exchange,
    wait_until,
)
from streams import request_bytes, stream

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "a story " * 300}]}
STREAM = {**CHAT, "stream": True}


def settled(router, extra_states=None, timeout: float = 10.0) -> bool:
    """Every booking released and nothing in flight, within ``timeout``."""

    def check() -> bool:
        def read():
            states = [w.state for w in router.app.pool.workers] + list(extra_states or [])
            return all_zero(booked(router.app, states)) and router.app.pool.stats.in_flight == 0

        return router.call(read)

    return wait_until(check, timeout)


async def still_serves(router) -> None:
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text


def describe(router) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router.url + "/workers").json()}


async def test_worker_killed_mid_stream(fake_workers, router_server):
    """Streams it had started end with an error event; the rest go elsewhere; it is out."""
    w0, w1 = fake_workers(2, delay=0.2, chunks=20, chunk_delay=0.05)
    router = router_server(workers=[w0.url, w1.url], policy="round_robin")
    running = [
        asyncio.ensure_future(stream(router.port, "/v1/chat/completions", STREAM, timeout=15))
        for _ in range(20)
    ]
    await asyncio.sleep(0.5)  # both workers mid-stream
    w0.kill()
    results = await asyncio.gather(*running)
    cut = [r for r in results if not r.complete]
    assert cut and all(r.worker == w0.url for r in cut)
    for r in cut:  # a clean end: status 200, an error event, [DONE], the chunked body closed
        assert r.status == 200 and r.received.endswith(b"0\r\n\r\n")
        event = r.received.split(b'data: {"error"', 1)[1].split(b"\n\n", 1)[0]
        assert json.loads(b'{"error"' + event)["error"]["code"] == "worker_stream_cut"
    assert all(r.worker == w1.url for r in results if r.complete)
    assert await asyncio.to_thread(settled, router)
    assert await asyncio.to_thread(wait_until, lambda: not describe(router)[w0.url]["healthy"])
    await still_serves(router)
    metrics = httpx.get(router.url + "/metrics").text
    assert f'cache_router_circuit_transitions_total{{state="open",worker="{w0.url}"}}' in metrics


class HangingWorker:
    """Accepts connections (the kernel's backlog) and never reads or answers a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


async def test_worker_that_accepts_and_hangs(fake_workers, router_server):
    """Timeouts fire (504, clean JSON), the worker is taken out, the other one serves."""
    (good,) = fake_workers(1)
    hung = HangingWorker()
    try:
        router = router_server(
            workers=[hung.url, good.url],
            policy="round_robin",
            read_timeout_s=0.5,
            health_timeout_s=0.3,
            health_interval_s=0.2,
            health_failure_threshold=2,
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=CHAT) for _ in range(6))
            )
        assert loop.time() - start < 3  # the timeouts fired, nothing waited for ever
        timed_out = [r for r in answers if r.status_code == 504]
        assert all(r.status_code in (200, 504) for r in answers)
        for r in timed_out:
            assert r.json()["error"]["code"] == "upstream_timeout"
        out = await asyncio.to_thread(wait_until, lambda: not describe(router)[hung.url]["healthy"])
        assert out
        async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
            after = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=CHAT) for _ in range(6))
            )
        assert all(r.status_code == 200 for r in after)
        assert {r.headers["x-cache-router-worker"] for r in after} == {good.url}
        assert await asyncio.to_thread(settled, router)
    finally:
        hung.close()


async def test_worker_that_goes_silent_mid_stream(fake_workers, router_server):
    """A read timeout after the first bytes: the stream ends with an error event."""
    (slow,) = fake_workers(1, chunks=3, chunk_delay=1.5)
    router = router_server(workers=[slow.url], read_timeout_s=0.4)
    r = await stream(router.port, "/v1/chat/completions", STREAM, timeout=10)
    assert r.status == 200 and not r.complete and b"worker_stream_cut" in r.received
    assert r.received.endswith(b"0\r\n\r\n")
    assert await asyncio.to_thread(settled, router)


async def test_500_bursts_retries_are_bounded_and_the_circuit_opens_and_closes(
    fake_workers, router_server
):
    w0, w1 = fake_workers(2)
    router = router_server(
        workers=[w0.url, w1.url],
        policy="round_robin",
        max_attempts=3,
        health_failure_threshold=3,
        health_interval_s=0.1,
        circuit_open_s=1.0,
    )
    w0.status = 500  # a burst: every generation request fails, /health still answers 200

    def opened() -> int:
        return router.call(lambda: router.app.pool.workers[0].stats.circuit.get("open", 0))

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 8
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        burst = []
        # traffic until the circuit opened, closed after 1 s (a probe), and opened again
        while opened() < 2 and loop.time() < deadline:
            burst += await asyncio.gather(
                *(client.post("/v1/chat/completions", json=CHAT) for _ in range(4))
            )
            await asyncio.sleep(0.05)
        assert opened() == 2
        # every client request succeeded on w1 after at most one failed try on w0
        assert all(r.status_code == 200 for r in burst)
        assert {r.headers["x-cache-router-worker"] for r in burst} == {w1.url}
        failed_on_w0 = len(w0.requests)
        assert len(w1.requests) == len(burst)
        assert failed_on_w0 <= len(burst)  # bounded: one attempt per request at most
        # per opening, at most the threshold (3) plus what was already on its way (batches
        # of 4 at once; a failure counts once its retry answered)
        assert failed_on_w0 <= 2 * (3 + 4)
        # while the circuit is open (1 s), w0 gets nothing at all
        while_open = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=CHAT) for _ in range(8))
        )
        assert all(r.status_code == 200 for r in while_open)
        assert len(w0.requests) == failed_on_w0 and opened() == 2
        state = describe(router)[w0.url]
        w0.status = 0  # the burst ends
        assert await asyncio.to_thread(wait_until, lambda: describe(router)[w0.url]["healthy"], 5)
        after = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=CHAT) for _ in range(10))
        )
        assert all(r.status_code == 200 for r in after)
        assert {r.headers["x-cache-router-worker"] for r in after} == {w0.url, w1.url}
    assert state["consecutive_failures"] >= 1
    metrics = httpx.get(router.url + "/metrics").text
    assert f'cache_router_circuit_transitions_total{{state="closed",worker="{w0.url}"}}' in metrics
    assert 'cache_router_retries_total{reason="worker_5xx"}' in metrics
    assert await asyncio.to_thread(settled, router)


async def test_every_worker_failing_is_bounded_and_relayed(fake_workers, router_server):
    """All workers 500: each request tries each worker once (<= max_attempts), and the last
    worker's own 500 is relayed. Failing alike everywhere, the requests are suspect, not the
    workers: both stay in (a fleet-wide fault is the probes' business)."""
    workers = fake_workers(2, status=500)
    router = router_server(
        workers=[w.url for w in workers], max_attempts=5, health_failure_threshold=2
    )
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        answers = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(8)]
    assert all(r.status_code == 500 and "x-cache-router-worker" in r.headers for r in answers)
    assert sum(len(w.requests) for w in workers) <= 8 * 2
    assert all(w["healthy"] for w in describe(router).values())
    assert router.call(lambda: router.app.pool.stats.suspect) == 8
    assert await asyncio.to_thread(settled, router)


async def test_worker_removed_and_re_added_with_requests_in_flight(fake_workers, router_server):
    w0, w1 = fake_workers(2, delay=0.3, chunks=10, chunk_delay=0.05)
    router = router_server(workers=[w0.url, w1.url], policy="round_robin")
    old_state = router.call(lambda: router.app.pool.workers[0].state)
    running = [
        asyncio.ensure_future(stream(router.port, "/v1/chat/completions", STREAM, timeout=15))
        for _ in range(30)
    ]
    await asyncio.sleep(0.25)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        assert (await client.request("DELETE", "/workers", json={"url": w0.url})).status_code == 200
        more = [
            asyncio.ensure_future(stream(router.port, "/v1/chat/completions", STREAM, timeout=15))
            for _ in range(10)
        ]
        await asyncio.sleep(0.2)
        assert (await client.post("/workers", json={"url": w0.url})).status_code == 201
        results = await asyncio.gather(*running, *more)
    # the removal cut nothing: requests in flight on w0 finished there
    assert all(r.status == 200 and r.complete for r in results)
    assert sum(1 for r in results[:30] if r.worker == w0.url) >= 10
    assert all(r.worker == w1.url for r in results[30:])  # while w0 was out
    new_state = router.call(lambda: router.app.pool.workers[-1].state)
    assert new_state is not old_state
    assert await asyncio.to_thread(settled, router, [old_state])
    after = await asyncio.gather(
        *(stream(router.port, "/v1/chat/completions", STREAM) for _ in range(6))
    )
    assert {r.worker for r in after} == {w0.url, w1.url}
    assert await asyncio.to_thread(settled, router, [old_state])


HANG_UP_POINTS = [
    "connect_only",  # open the connection, send nothing
    "partial_head",  # half the request line / headers
    "head_only",  # headers, none of the body
    "partial_body",  # part of the body
    "after_request",  # the whole request, gone during the worker's "prefill"
    "after_status",  # after the response status line arrived
    "mid_stream",  # after some events
    "after_response",  # after the whole response (a normal close)
]


async def _hang_up_at(port: int, point: str, body: dict, rng: random.Random) -> None:
    data = request_bytes("/v1/chat/completions", body)
    head_end = data.index(b"\r\n\r\n") + 4
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if point == "connect_only":
            await asyncio.sleep(rng.uniform(0, 0.05))
            return
        if point == "partial_head":
            writer.write(data[: rng.randint(1, head_end - 1)])
            return
        if point == "head_only":
            writer.write(data[:head_end])
            await asyncio.sleep(rng.uniform(0, 0.05))
            return
        if point == "partial_body":
            writer.write(data[: rng.randint(head_end + 1, len(data) - 1)])
            await asyncio.sleep(rng.uniform(0, 0.05))
            return
        writer.write(data)
        if point == "after_request":
            await asyncio.sleep(rng.uniform(0.01, 0.15))
            return
        received = b""
        async with asyncio.timeout(10):
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                received += chunk
                if point == "after_status" and b"\r\n\r\n" in received:
                    return
                if point == "mid_stream" and received.count(b"data:") >= rng.randint(1, 4):
                    return
                if complete_response(received):
                    return
    finally:
        writer.transport.abort()


@pytest.mark.parametrize("stream_mode", [True, False])
async def test_client_disconnects_at_every_point(fake_workers, router_server, stream_mode):
    workers = fake_workers(2, delay=0.1, chunks=8, chunk_delay=0.03)
    router = router_server(workers=[w.url for w in workers], request_read_timeout_s=2)
    rng = random.Random(7)
    body = {**CHAT, "stream": stream_mode}
    plans = [point for point in HANG_UP_POINTS for _ in range(15)]
    rng.shuffle(plans)
    await asyncio.gather(*(_hang_up_at(router.port, p, body, rng) for p in plans))
    assert await asyncio.to_thread(settled, router)
    assert await asyncio.to_thread(wait_until, lambda: sum(w.in_flight for w in workers) == 0)
    stats = router.call(lambda: dict(router.app.pool.stats.unrouted))
    assert stats.get("client_disconnect", 0) >= 15  # at least the partial bodies
    await still_serves(router)
    assert await asyncio.to_thread(settled, router)


async def test_slow_body_in_time_succeeds_and_too_slow_is_408(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], request_read_timeout_s=1.0)
    data = request_bytes("/v1/chat/completions", CHAT)
    pieces = [data[i : i + 300] for i in range(0, len(data), 300)]
    ok = await raw_exchange(router.port, pieces, pause_s=0.05)
    assert ok.status == 200
    too_slow = await raw_exchange(router.port, pieces, pause_s=0.4, timeout=10)
    assert too_slow.status == 408
    assert await asyncio.to_thread(settled, router)
    await still_serves(router)


async def test_poison_requests_take_no_worker_out(fake_workers, router_server):
    """A request that makes every worker it reaches drop the connection (or answer 5xx) is
    the request's fault: the client gets 502, no circuit counts it, the fleet stays in."""
    workers = fake_workers(3)
    router = router_server(
        workers=[w.url for w in workers], max_attempts=3, health_failure_threshold=2
    )
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        for knob in ({"x-fake-reset": "1"}, {"x-fake-status": "500"}):
            for _ in range(10):
                r = await client.post("/v1/chat/completions", json=CHAT, headers=knob)
                assert r.status_code in (500, 502), r.text
        ok = await client.post("/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200
    states = describe(router)
    assert all(s["healthy"] and s["consecutive_failures"] == 0 for s in states.values()), states
    assert router.call(lambda: router.app.pool.stats.suspect) == 20
    metrics = httpx.get(router.url + "/metrics").text
    assert "cache_router_suspect_requests_total 20.0" in metrics
    assert "cache_router_circuit_transitions_total{" not in metrics
    assert await asyncio.to_thread(settled, router)

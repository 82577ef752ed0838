"""Client limits of router.service.server and admission control, over real sockets: header
size (431), slow clients (408), connection count (503), in-flight requests (429), malformed
HTTP (400), body size (413). Each answer is JSON; nothing stays booked; the router keeps serving."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
from reliability_support import all_zero, booked, header, raw_exchange, wait_until

from router.proxy.app import RouterApp

BODY = b'{"model": "fake-model", "prompt": "hello there"}'


def post(path: str = "/v1/completions", body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)
    )


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


def nothing_booked(router) -> bool:
    return wait_until(lambda: all_zero(router.call(lambda: booked(router.app))), 5)


def rejected(router) -> dict[str, int]:
    return router.call(lambda: dict(router.app.pool.stats.rejected))


async def test_headers_over_the_limit_get_431_and_the_connection_closes(
    fake_workers, router_server
):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], max_header_bytes=16384)
    ok = await raw_exchange(router.port, post(extra=b"x-pad: " + b"a" * 12000 + b"\r\n"))
    assert ok.status == 200
    # one header, many headers, a long request line: each over the limit
    for extra in (
        b"x-pad: " + b"a" * 100_000 + b"\r\n",
        b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 100) for i in range(400)),
    ):
        big = await raw_exchange(router.port, post(extra=extra), read_until_close=True)
        assert big.status == 431 and big.closed
        assert error_code(big.body) == "header_too_large"
    line = await raw_exchange(
        router.port, b"GET /health?" + b"q" * 50_000 + b" HTTP/1.1\r\n\r\n", read_until_close=True
    )
    assert line.status == 431
    assert rejected(router)["header_too_large"] == 3
    assert len(worker.requests) == 1
    assert (await raw_exchange(router.port, post())).status == 200


async def test_a_client_sending_headers_or_body_too_slowly_gets_408(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], request_read_timeout_s=0.5)
    request = post()
    loop = asyncio.get_running_loop()
    # slowloris: the head a few bytes at a time, never finished in time
    start = loop.time()
    slow_head = await raw_exchange(
        router.port, [request[i : i + 4] for i in range(0, 60, 4)], pause_s=0.1, timeout=5
    )
    assert slow_head.status == 408 and error_code(slow_head.body) == "read_timeout"
    assert loop.time() - start < 2
    # the head in time, the body never completes: the handler waiting on it lets go
    head, _, body = request.partition(b"\r\n\r\n")
    slow_body = await raw_exchange(router.port, [head + b"\r\n\r\n" + body[:5]], timeout=5)
    assert slow_body.status == 408
    # a connection that sends nothing is closed too
    idle = await raw_exchange(router.port, [b""], timeout=5, read_until_close=True)
    assert idle.closed and not idle.timed_out
    assert len(worker.requests) == 0
    assert await asyncio.to_thread(nothing_booked, router)
    # slow but in time is fine: pieces 0.1 s apart, 0.3 s in all
    pieces = [request[:30], request[30:60], request[60:]]
    fine = await raw_exchange(router.port, pieces, pause_s=0.1)
    assert fine.status == 200
    assert rejected(router)["read_timeout"] == 3


async def test_connections_over_the_limit_get_503_with_retry_after(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], max_connections=3)
    held = [await asyncio.open_connection("127.0.0.1", router.port) for _ in range(3)]
    try:
        assert await asyncio.to_thread(
            wait_until, lambda: router.call(lambda: router.app.pool.stats.connections) == 3, 5
        )
        over = await raw_exchange(router.port, post(), read_until_close=True)
        assert over.status == 503 and over.closed
        assert header(over.head, b"retry-after") == b"1"
        assert error_code(over.body) == "connections"
    finally:
        for _, writer in held:
            writer.close()
    assert await asyncio.to_thread(
        wait_until, lambda: router.call(lambda: router.app.pool.stats.connections) == 0, 5
    )
    assert (await raw_exchange(router.port, post())).status == 200
    metrics = httpx.get(router.url + "/metrics").text
    assert 'cache_router_rejected_total{reason="connections"} 1.0' in metrics
    # this scrape's own connection at least
    assert re.search(r"^cache_router_client_connections [1-9]", metrics, re.M)


async def test_in_flight_over_the_limit_gets_429_with_retry_after(fake_workers, router_server):
    (worker,) = fake_workers(1, delay=0.6)
    router = router_server(workers=[worker.url], max_inflight=2)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        first = [
            asyncio.ensure_future(client.post("/v1/completions", content=BODY)) for _ in range(2)
        ]
        await asyncio.sleep(0.3)
        assert router.call(lambda: router.app.pool.stats.in_flight) == 2
        third = await client.post("/v1/completions", content=BODY)
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["code"] == "router_overloaded"
        assert [r.status_code for r in await asyncio.gather(*first)] == [200, 200]
        assert (await client.post("/v1/completions", content=BODY)).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'cache_router_rejected_total{reason="inflight"} 1.0' in metrics
    assert 'cache_router_requests_total{policy="ttft",status="429",worker="none"} 1.0' in metrics
    assert "cache_router_in_flight 0.0" in metrics
    assert len(worker.requests) == 3


async def test_malformed_http_gets_a_json_400(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])
    for data in (
        b"GARBAGE\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET /\xff\xfe HTTP/1.1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nx: a\x01b\r\n\r\n",
    ):
        answer = await raw_exchange(router.port, data, read_until_close=True)
        assert answer.status == 400, data
        assert error_code(answer.body) == "malformed_http"
    assert rejected(router)["malformed_http"] == 5
    assert (await raw_exchange(router.port, post())).status == 200


async def test_admin_bodies_are_bounded_too(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], max_body_bytes=1000)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        r = await client.post("/workers", content=b'{"url": "' + b"a" * 2000 + b'"}')
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        async def chunks():
            for _ in range(5):
                yield b"a" * 400

        r = await client.post("/workers", content=chunks())  # chunked, no content-length
        assert r.status_code == 413
        assert (await client.get("/workers")).status_code == 200


async def test_draining_refuses_new_generation_requests(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])

    def drain() -> None:
        router.app.draining = True  # what router.service.server.Server.handle_exit does on SIGTERM

    router.call(drain)
    refused = await raw_exchange(router.port, post(), read_until_close=True)
    assert refused.status == 503 and refused.closed
    assert header(refused.head, b"retry-after") == b"1"
    assert error_code(refused.body) == "draining"
    health = await raw_exchange(router.port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert health.status == 503 and json.loads(health.body)["status"] == "draining"
    assert rejected(router)["draining"] == 1
    assert len(worker.requests) == 0


async def test_one_timer_keeps_the_read_and_keep_alive_timeouts(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], request_read_timeout_s=0.5)
    router.server.config.timeout_keep_alive = 0.4  # read by each new connection
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        # requests 0.25 s apart for 1.5 s: each within both timeouts, the connection lives
        # well past either (the deadlines move with each request)
        for _ in range(6):
            writer.write(post())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
            await asyncio.wait_for(reader.readexactly(length), 5)
            answered = loop.time()
            await asyncio.sleep(0.25)
        assert loop.time() - start > 1.4
        # then idle: closed after the keep-alive timeout (not before), with no 408
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.35 < loop.time() - answered < 2
    finally:
        writer.close()
    assert rejected(router).get("read_timeout", 0) == 0
    assert len(worker.requests) == 6


async def test_the_request_line_reaches_the_worker_as_sent(fake_workers, router_server):
    # RouterProtocol starts plain requests itself (uvicorn's request start, inlined): the
    # path, its query and the HTTP version must come out as uvicorn gives them
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])
    query = await raw_exchange(router.port, post("/v1/completions?api-version=2%202&x=1"))
    assert query.status == 200
    assert worker.requests[-1]["path"] == "/v1/completions"
    assert worker.requests[-1]["query"] == "api-version=2%202&x=1"
    # an escaped path is routed by its unescaped form and forwarded as sent
    escaped = await raw_exchange(router.port, post("/v1/%63ompletions"))
    assert header(escaped.head, b"x-cache-router-worker") == worker.url.encode()
    assert worker.requests[-1]["path"] == "/v1/%63ompletions" and len(worker.requests) == 2
    # HTTP/1.0: answered, then the connection closes (no keep-alive asked)
    old = post().replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    answer = await raw_exchange(router.port, old, read_until_close=True)
    assert answer.status == 200 and answer.closed and len(worker.requests) == 3
    unknown = await raw_exchange(router.port, b"GET /nothing-here HTTP/1.1\r\nhost: x\r\n\r\n")
    assert unknown.status == 404


async def test_generation_requests_skip_the_app_dispatch(fake_workers, router_server, monkeypatch):
    # the server hands generation requests to the forwarder itself (RouterCycle.run_direct);
    # every other request, and pipelined ones, still work
    dispatched: list[str] = []
    original = RouterApp.__call__

    async def counting(self, scope, receive, send):
        if scope["type"] == "http":
            dispatched.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(RouterApp, "__call__", counting)
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])
    assert (await raw_exchange(router.port, post())).status == 200
    chat = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    assert (await raw_exchange(router.port, post("/v1/chat/completions", chat))).status == 200
    health = await raw_exchange(router.port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert health.status == 200
    assert dispatched == ["/health"]
    # two generation requests pipelined on one connection: both answered, in order
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(post(body=b'{"model": "fake-model", "prompt": "one"}') + post())
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
            await asyncio.wait_for(reader.readexactly(length), 5)
    finally:
        writer.close()
    assert len(worker.requests) == 4 and dispatched == ["/health"]
    assert nothing_booked(router)

"""The worker client: keep-alive reuse, streaming pieces, timeouts, aborts, stale
connections, flow control."""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial

import pytest
import uvloop
from conftest import wait_until

from router.fleet.upstream import ConnectFailed, ConnectionLost, ReadTimeout, UpstreamPool

JSON = b"content-type: application/json\r\n"


def body(**kw) -> bytes:
    return json.dumps({"model": "fake-model", "prompt": "hello", **kw}).encode()


async def read_all(conn, timeout=5.0) -> bytes:
    parts, more = [], True
    while more:
        data, more = await conn.read(timeout)
        parts.append(data)
    return b"".join(parts)


async def test_keep_alive_connections_are_reused(fake_workers):
    (worker,) = fake_workers(1)
    pool = UpstreamPool(worker.url)
    for _ in range(20):
        conn = await pool.request(b"POST", b"/v1/completions", JSON, body(), 5)
        assert conn.status == 200
        assert json.loads(await read_all(conn))["usage"]["prompt_tokens"] == 2
        conn.release()
    assert worker.accepted == 1
    status, data = await pool.fetch("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"][0]["id"] == "fake-model"
    pool.close()


async def test_stream_pieces_arrive_before_the_end(fake_workers):
    (worker,) = fake_workers(1, chunks=4, chunk_delay=0.1)
    pool = UpstreamPool(worker.url)
    conn = await pool.request(b"POST", b"/v1/completions", JSON, body(stream=True), 5)
    assert dict(conn.headers)[b"content-type"] == b"text/event-stream"
    first, more = await conn.read(5)
    assert more and first.startswith(b"data: ") and first.count(b"data:") == 1
    rest = await read_all(conn)
    assert rest.endswith(b"data: [DONE]\n\n") and first.count(b"data:") + rest.count(b"data:") == 5
    conn.release()
    pool.close()


async def test_connect_failure_timeout_and_abort(fake_workers):
    dead, slow = fake_workers(2)
    dead.kill()
    with pytest.raises(ConnectFailed):
        await UpstreamPool(dead.url).request(b"POST", b"/v1/completions", JSON, body(), 1)
    pool = UpstreamPool(slow.url)
    with pytest.raises(ReadTimeout):
        await pool.request(b"POST", b"/v1/completions", JSON + b"x-fake-hang: 1\r\n", body(), 0.2)
    assert await asyncio.to_thread(wait_until, lambda: slow.cancelled == 1, 5)
    slow.chunk_delay = 0.2
    conn = await pool.request(b"POST", b"/v1/completions", JSON, body(stream=True), 5)
    await conn.read(5)
    conn.abort()  # the router leaves mid-stream: the worker notices and stops
    with pytest.raises(ConnectionLost):
        await conn.read(5)
    assert await asyncio.to_thread(wait_until, lambda: slow.cancelled == 2, 5)
    pool.close()


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_stale_keep_alive_connection_is_resent_on_a_fresh_one():
    answered = []

    async def handler(reader, writer):
        # answers one request per connection, then closes without telling (no
        # "connection: close"), like a worker whose keep-alive timer fired
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(len(body()))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        answered.append(1)
        await writer.drain()
        await reader.read(1)  # the next request arrives: drop it unanswered
        writer.transport.abort()

    server, url = await _serve(handler)
    pool = UpstreamPool(url)
    for _ in range(3):
        conn = await pool.request(b"POST", b"/x", JSON, body(), 5)
        assert await read_all(conn) == b"ok"
        conn.release()
        await asyncio.sleep(0.01)
    assert len(answered) == 3
    pool.close()
    server.close()


async def test_large_body_with_flow_control_arrives_intact():
    payload = bytes(range(256)) * (12 << 10)  # 3 MiB, over the high-water mark

    async def handler(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(len(body()))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload))
        writer.write(payload)
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    pool = UpstreamPool(url)
    conn = await pool.request(b"POST", b"/x", JSON, body(), 5)
    await asyncio.sleep(0.2)  # let the socket fill up while nobody reads
    assert await read_all(conn) == payload
    conn.release()
    pool.close()
    server.close()


async def test_body_until_close_and_bad_responses():
    async def until_close(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    server, url = await _serve(until_close)
    conn = await UpstreamPool(url).request(b"POST", b"/x", b"", b"", 5)
    assert await read_all(conn) == b"all of it"
    server.close()

    async def garbage(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()

    server, url = await _serve(garbage)
    with pytest.raises(ConnectionLost):
        await UpstreamPool(url).request(b"POST", b"/x", b"", b"", 5)
    server.close()


async def test_then_runs_once_before_the_first_await(fake_workers):
    (worker,) = fake_workers(1)
    pool = UpstreamPool(worker.url)
    for fresh in (True, False):
        calls: list[int] = []
        task = asyncio.ensure_future(
            pool.request(b"POST", b"/v1/completions", JSON, body(), 5, partial(calls.append, 1))
        )
        await asyncio.sleep(0)  # the task's first step: it ran up to its first await
        assert calls == [1], fresh
        conn = await task
        assert calls == [1] and conn.status == 200
        await read_all(conn)
        conn.release()
    assert worker.accepted == 1  # the second request went on the kept-alive connection
    pool.close()


async def test_the_read_timeout_counts_from_each_wait(fake_workers):
    (worker,) = fake_workers(1)
    worker.chunk_delay, worker.chunks = 0.15, 6
    pool = UpstreamPool(worker.url)
    # pieces 0.15 s apart under a 0.4 s timeout: the stream lasts far longer than the
    # timeout, and no single wait reaches it
    loop = asyncio.get_running_loop()
    start = loop.time()
    conn = await pool.request(b"POST", b"/v1/completions", JSON, body(stream=True), 0.4)
    data = await read_all(conn, timeout=0.4)
    assert data.endswith(b"data: [DONE]\n\n") and loop.time() - start > 0.6
    conn.release()
    # then a wait that does reach it, on the same connection (its timer re-arms)
    worker.chunk_delay = 0.0
    with pytest.raises(ReadTimeout):
        await pool.request(b"POST", b"/v1/completions", JSON + b"x-fake-hang: 1\r\n", body(), 0.3)
    pool.close()


class _AnswerThenStall(asyncio.Protocol):
    """A worker on the client's own loop: it answers the request, then blocks that loop
    past the client's read timeout (as a GC pause or a starved CPU would)."""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if data.endswith(b"\r\n\r\n"):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            time.sleep(0.3)


@pytest.mark.parametrize("new_loop", [uvloop.new_event_loop, asyncio.new_event_loop])
def test_an_answer_waiting_in_the_socket_is_no_read_timeout(new_loop):
    """The loop stalls past the read timeout just after the worker answered: uvloop runs
    the due timer before it reads the socket where the answer waits. Only the loop was
    late, not the worker: no ReadTimeout."""

    async def exchange() -> None:
        server = await asyncio.get_running_loop().create_server(_AnswerThenStall, "127.0.0.1", 0)
        pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            conn = await pool.request(b"GET", b"/health", b"", b"", 0.2)
            assert conn.status == 200 and await read_all(conn, 0.2) == b"ok"
            conn.release()
        finally:
            pool.close()
            server.close()

    loop = new_loop()
    try:
        loop.run_until_complete(exchange())
    finally:
        loop.close()


@pytest.mark.parametrize(
    "header",
    [b"x-a: one\r\n two", b"x-b: a\rb", b"x b: a", b"x-c: a\x00b"],
    ids=["folded", "bare-cr", "space-in-name", "nul"],
)
async def test_a_header_that_could_split_the_client_response_is_refused(header):
    # the forwarder copies a worker's headers into its own response unchecked
    # (RouterCycle.respond): that is safe because the parser refuses these
    async def injecting(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n" + header + b"\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    server, url = await _serve(injecting)
    with pytest.raises(ConnectionLost):
        await UpstreamPool(url).request(b"POST", b"/x", b"", b"", 5)
    server.close()

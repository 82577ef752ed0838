"""Helpers for the reliability suites (tests/reliability) and the limit tests: an echo worker,
direct ASGI calls, raw-socket exchanges, and the router's booking counters.

Everything listens on / talks to 127.0.0.1 only, and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
import orjson

ECHO_BODY = orjson.dumps(
    {
        "id": "cmpl-echo",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


MODELS_BODY = orjson.dumps({"object": "list", "data": [{"id": "echo", "object": "model"}]})


class _EchoConn(asyncio.Protocol):
    def __init__(self, worker: EchoWorker) -> None:
        self.worker = worker
        self.url = b""
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # the router forwarded bytes a worker cannot parse: a finding, kept for asserts
            self.worker.parse_errors.append((str(exc), data[:500]))
            self.transport.abort()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        self.worker.requests += 1
        body = MODELS_BODY if self.url.startswith(b"/v1/models") else ECHO_BODY
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )


class EchoWorker:
    """A worker that answers every request at once with 200 and a small completion (a model
    list on ``/v1/models``).

    For fuzzing the router: whatever the router forwards, the worker never fails, so any
    5xx the client sees is the router's own.
    """

    def __init__(self) -> None:
        self.requests = 0
        self.parse_errors: list[tuple[str, bytes]] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> EchoWorker:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _EchoConn(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class AsgiResponse:
    status: int
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


async def asgi_call(
    app: Any,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    chunks: list[bytes] | None = None,
    query: bytes = b"",
    timeout: float = 10.0,
) -> AsgiResponse:
    """Call an ASGI app as uvicorn would (body in ``chunks``; then wait for disconnect)."""
    chunks = chunks if chunks is not None else [b""]
    raw_path = path.encode("utf-8", "surrogateescape")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": headers or [],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    done = asyncio.Event()
    response = AsgiResponse(0)
    parts: list[bytes] = []

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            response.status = message["status"]
            response.headers = dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    async with asyncio.timeout(timeout):
        await app(scope, receive, send)
    done.set()
    response.body = b"".join(parts)
    return response


@dataclass
class RawResult:
    status: int  # 0: no status line came back
    head: bytes
    body: bytes
    closed: bool  # the server closed the connection
    timed_out: bool  # nothing ended the exchange within the timeout


async def raw_exchange(
    port: int,
    data: bytes | list[bytes],
    *,
    pause_s: float = 0.0,
    timeout: float = 10.0,
    read_until_close: bool = False,
) -> RawResult:
    """Write ``data`` (pieces ``pause_s`` apart), read one response (or until close).

    Reading runs from the start, concurrently with the writes, and writing stops once the
    server answered or closed: a server that rejects early is seen as it answered.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pieces = data if isinstance(data, list) else [data]
    received = bytearray()
    state = {"closed": False}

    async def read() -> None:
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionError:
                state["closed"] = True
                return
            if not chunk:
                state["closed"] = True
                return
            received.extend(chunk)
            if not read_until_close and complete_response(bytes(received)):
                return

    reading = asyncio.ensure_future(read())
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            for i, piece in enumerate(pieces):
                if i and pause_s:
                    await asyncio.wait({reading}, timeout=pause_s)
                if reading.done() or received or writer.is_closing():
                    break
                writer.write(piece)
                try:
                    await writer.drain()
                except ConnectionError:
                    break
            await reading
    except TimeoutError:
        timed_out = True
    finally:
        reading.cancel()
        writer.transport.abort()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status = int(head[9:12]) if head.startswith(b"HTTP/1.") and head[9:12].isdigit() else 0
    return RawResult(status, head, body, state["closed"], timed_out)


def complete_response(received: bytes) -> bool:
    """Whether ``received`` holds one whole response framed by content-length."""
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip() or 0)
    return received.endswith(b"0\r\n\r\n")


def header(head: bytes, name: bytes) -> bytes | None:
    """A response header's value from a raw head (case-insensitive), or None."""
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def booked(app: Any, states: list | None = None) -> list[tuple[int, int, int, int, int]]:
    """Per worker state: in flight, pending prefill, decode tokens, pinned blocks, locked
    radix tokens: all 0 when nothing is booked (call on the router's loop)."""
    states = states if states is not None else [w.state for w in app.pool.workers]
    return [
        (
            s.num_requests,
            s.pending_prefill_tokens,
            s.ongoing_decode_tokens,
            s.blocks.pinned_blocks,
            s.radix.protected_tokens if s.radix is not None else 0,
        )
        for s in states
    ]


def all_zero(rows: list[tuple[int, ...]]) -> bool:
    return all(not any(row) for row in rows)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (the same as tests/router/conftest.py's,
    importable under a name no other conftest shadows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()

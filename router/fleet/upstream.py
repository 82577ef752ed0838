"""A small HTTP/1.1 keep-alive client for the workers, on asyncio protocols and httptools.

Why not httpx or aiohttp: the proxy forwards every request, and at concurrency a general
client's per-request machinery costs more CPU than the whole rest of the router (see
``bench/RESULTS.md``). A worker speaks plain HTTP/1.1, so the client needs only: a pool of
idle keep-alive connections per worker, one write per request, the llhttp parser (httptools,
the one uvicorn uses) for the response, and body pieces handed over as they arrive.

- :meth:`UpstreamPool.request` returns once the response *headers* are in; body pieces are
  read with :meth:`Connection.read`, which returns everything received so far (nothing is
  held back) and whether more may follow.
- Flow control: when the reader falls behind by :data:`HIGH_WATER` bytes the socket stops
  being read (the worker's TCP window then slows it), and resumes below :data:`LOW_WATER`.
- :meth:`Connection.abort` closes the socket at once: the worker sees the client go away
  and cancels the generation (vLLM and SGLang both abort on disconnect).
- A request body may also be *streamed* (:meth:`UpstreamPool.request` with ``more``: an
  audio upload goes on as the client sends it, never held whole): on a fresh connection,
  with the socket's write flow control (a slow worker slows the client).
- A request on a *reused* connection that dies before any response byte (the worker closed
  an idle keep-alive connection as we wrote) is resent once on a fresh connection: the
  worker never saw it. A fresh connection that fails is :class:`ConnectFailed`.

Errors are exception types so the forwarder can decide retries: :class:`ConnectFailed`
(nothing sent), :class:`ConnectionLost` (connection ended before the response completed),
:class:`ReadTimeout` (nothing arrived for ``read_timeout`` seconds).
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20
LOW_WATER = 256 << 10
MAX_IDLE = 512
# how soon a read timeout that found bytes unread in the socket looks again (they are read
# by the loop's next poll of the sockets)
RECHECK_S = 0.005


class UpstreamError(Exception):
    """The exchange with a worker failed."""


class ConnectFailed(UpstreamError):
    """Could not connect (refused, unreachable, connect timeout): the worker saw nothing."""


class ConnectionLost(UpstreamError):
    """The connection ended before the response was complete."""

    def __init__(self, message: str, got_bytes: bool = False) -> None:
        super().__init__(message)
        self.got_bytes = got_bytes


class ReadTimeout(UpstreamError):
    """Nothing arrived from the worker within the read timeout."""


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one exchange at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # made at connection_made, dropped at connection_lost: the parser holds this protocol,
        # so the cycle must not outlive the connection (a connect that fails or is cancelled
        # never calls either)
        self.parser: httptools.HttpResponseParser | None = None
        self.closed = False
        self.reused = False
        self._waiter: asyncio.Future | None = None
        # the read timeout: one timer per connection, re-armed when it fires before the
        # current wait's deadline (no timer made and cancelled per wait)
        self._deadline = 0.0
        self._rechecked = False  # this wait's deadline passed with bytes unread: looked again
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._paused = False
        self._drained: asyncio.Future | None = None  # set while the socket's writes pause
        self._begin()

    def _begin(self) -> None:
        """Reset the per-exchange state (a connection is reused for many requests)."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.got_bytes = False
        self.error: UpstreamError | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._framed = False  # content-length or chunked: the end is known without EOF
        self._keep_alive = False
        self.body_cut = False  # a streamed request body was not sent whole: never reused

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = ConnectionLost(f"invalid response from worker: {exc}", True)
            self.transport.abort()
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.resume_writing()  # a streamed body's writer must not wait on a closed socket
        if self.headers_done and not self.complete and not self._framed and self.error is None:
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete and self.error is None:
            reason = f": {exc}" if exc else ""
            self.error = ConnectionLost(f"worker closed the connection{reason}", self.got_bytes)
        self.pool._forget(self)
        self._wake()
        self._stop_timer()
        # break the parser <-> protocol cycle now: a closed connection is typically old
        # enough to sit in the oldest GC generation, which the tuned GC of router/service/command.py
        # rarely collects, and would keep its buffers (tests/router/proxy/test_leaks.py)
        self.parser = None

    def pause_writing(self) -> None:  # only a streamed request body waits on this
        if self._drained is None:
            self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        """Wait until the socket takes writes again (or closes)."""
        drained = self._drained
        if drained is not None and not self.closed:
            await drained

    # ---- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self._framed = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # 1xx interim response: the real one follows
            self.headers = []
            self._framed = False
            return
        self.headers_done = True
        self._keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.complete = True
            self._wake()

    # ---- exchange ------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self, timeout: float) -> None:
        """Until ``_wake``; ReadTimeout when that takes ``timeout`` seconds."""
        waiter = self.loop.create_future()
        self._waiter = waiter
        deadline = self._deadline = self.loop.time() + timeout
        self._rechecked = False
        timer = self._timer
        if timer is None or self._timer_at > deadline:
            if timer is not None:
                timer.cancel()
            self._arm(deadline)
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def _tick(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nothing waits: the next wait sets a timer again
        now = self.loop.time()
        if now < self._deadline:  # a later wait moved the deadline
            self._arm(self._deadline)
            return
        if not self._rechecked and self._unread():  # the loop was late, not the worker
            self._rechecked = True  # (its next poll reads them: once is enough)
            self._arm(now + RECHECK_S)
            return
        self._waiter = None
        waiter.set_exception(ReadTimeout("worker sent nothing within the read timeout"))

    def _arm(self, at: float) -> None:
        """The read timeout's timer, due at ``at`` (loop time)."""
        self._timer = self.loop.call_at(at, self._tick)
        self._timer_at = at

    def _unread(self) -> bool:
        """Whether the socket holds bytes (or its end) the loop has not read yet. A loop
        that stalled past a deadline (a GC pause, a starved CPU) runs the due timer before
        it reads the sockets under uvloop (libuv runs timers, then polls): the worker that
        answered meanwhile would be counted as silent, its circuit opened, for nothing."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(select, "poll"):
            return False
        poller = select.poll()
        try:
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):  # closed meanwhile: its end wakes the waiter
            return False

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def read(self, timeout: float) -> tuple[bytes, bool]:
        """All body bytes received so far (waiting for some) and whether more may follow."""
        chunks = self._chunks
        while not chunks:
            if self.complete:
                return b"", False
            if self.error is not None:
                raise self.error
            await self._wait(timeout)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return data, not self.complete or self.error is not None

    def abort(self) -> None:
        """Close the socket now (the worker cancels the request); wakes a pending read."""
        if self.error is None and not self.complete:
            self.error = ConnectionLost("aborted by the router", self.got_bytes)
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self._wake()
        self._stop_timer()

    def release(self) -> None:
        """Return the connection to its pool if the exchange ended cleanly, else close it."""
        if (
            self.complete
            and not self.closed
            and self.error is None
            and not self._chunks
            and self._keep_alive
            and not self.body_cut
        ):
            self.pool._idle_push(self)
        else:
            self.abort()


class UpstreamPool:
    """Keep-alive connections to one worker (``base_url`` may carry a path prefix)."""

    def __init__(self, base_url: str, connect_timeout: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/").encode()
        default_port = self.port == (443 if self.ssl else 80)
        self.host_header = (parts.netloc if not default_port else self.host).encode()
        self.connect_timeout = connect_timeout
        self._idle: list[Connection] = []
        self.closed = False

    async def _connect(self) -> Connection:
        # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a cancellation that
        # races with the connect completing, and a cancelled request must never go out
        made: list[Connection] = []

        def factory() -> Connection:
            made.append(Connection(self))
            return made[-1]

        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    factory, self.host, self.port, ssl=self.ssl
                )
        except BaseException as exc:
            # cancelled (the client left) or failed, possibly after connection_made: uvloop
            # then never calls connection_lost, so close the socket and drop the parser here
            for orphan in made:
                orphan.abort()
                orphan.parser = orphan.transport = None  # no cycle left to the collector
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(f"connect to {self.base_url} timed out") from None
            if isinstance(exc, OSError):
                raise ConnectFailed(f"connect to {self.base_url} failed: {exc}") from None
            raise
        return conn

    def _idle_pop(self) -> Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    def _idle_push(self, conn: Connection) -> None:
        if self.closed or len(self._idle) >= MAX_IDLE:
            conn.abort()
            return
        conn._begin()
        conn.reused = True
        self._idle.append(conn)

    def _forget(self, conn: Connection) -> None:
        if conn.reused and conn in self._idle:
            self._idle.remove(conn)

    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: bytes,
        body: bytes,
        read_timeout: float,
        then: Callable[[], None] | None = None,
    ) -> Connection:
        """Send a request and wait for the response headers; read the body from the result.

        ``headers`` are ready-made ``name: value\\r\\n`` lines (no host, no content-length).
        ``then`` is called once before the first await: right after the write on a kept-alive
        connection, before connecting otherwise (work that can wait for the write, not for
        another task).
        """
        head = b"%s %s%s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            method,
            self.prefix,
            path,
            self.host_header,
            len(body),
            headers,
        )
        message = head + body if len(body) < 65536 else None
        for _ in range(2):
            conn = self._idle_pop()
            fresh = conn is None
            if fresh:
                if then is not None:
                    then()
                    then = None
                conn = await self._connect()
            if message is not None:
                conn.transport.write(message)
            else:
                conn.transport.writelines((head, body))
            if then is not None:
                then()
                then = None
            try:
                while not conn.headers_done:  # the response headers
                    if conn.error is not None:
                        raise conn.error
                    if conn.closed:
                        raise ConnectionLost("worker closed the connection", conn.got_bytes)
                    await conn._wait(read_timeout)
                return conn
            except ConnectionLost as exc:
                conn.abort()
                if fresh or exc.got_bytes:
                    raise
                # a stale keep-alive connection: the worker never saw this request
            except BaseException:
                conn.abort()
                raise
        raise ConnectionLost("worker closed the connection")  # pragma: no cover

    async def request_streamed(
        self,
        method: bytes,
        path: bytes,
        headers: bytes,
        first: bytes,
        more: AsyncIterator[bytes],
        length: int | None,
        read_timeout: float,
    ) -> Connection:
        """:meth:`request` with a body sent as it comes: ``first``, then each piece of
        ``more`` (``length`` bytes in all if known, else chunked). On a fresh connection (a
        stale kept-alive one could not be resent to), so a :class:`ConnectFailed` means the
        worker saw nothing and ``more`` is untouched."""
        chunked = length is None
        framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % length
        head = b"%s %s%s HTTP/1.1\r\nhost: %s\r\n%s\r\n%s\r\n" % (
            method, self.prefix, path, self.host_header, framing, headers,
        )  # fmt: skip
        conn = await self._connect()
        try:
            conn.transport.writelines((head, _chunk(first) if chunked else first))
            async for piece in more:
                if conn.closed or conn.headers_done:
                    conn.body_cut = True  # the worker answered (or left) before the body ended
                    break
                if piece:
                    conn.transport.write(_chunk(piece) if chunked else piece)
                    await conn.drain()
            else:
                if chunked and not conn.closed:
                    conn.transport.write(b"0\r\n\r\n")
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                if conn.closed:
                    raise ConnectionLost("worker closed the connection", conn.got_bytes)
                await conn._wait(read_timeout)
            return conn
        except BaseException:
            conn.abort()
            raise

    async def fetch(
        self, method: str, path: str, body: bytes = b"", timeout: float = 5.0
    ) -> tuple[int, bytes]:
        """A small whole-body exchange (health, models, tokenize): status and body."""
        headers = b"content-type: application/json\r\n" if body else b""
        conn = await self.request(method.encode(), path.encode(), headers, body, timeout)
        try:
            parts = []
            more = True
            while more:
                data, more = await conn.read(timeout)
                parts.append(data)
            return conn.status, b"".join(parts)
        finally:
            conn.release()

    def close(self) -> None:
        """Close idle connections; connections in use close when their exchange ends."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()


def _chunk(data: bytes) -> bytes:
    """One piece of a chunked body (an empty one would end it: nothing)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""

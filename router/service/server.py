"""The HTTP server around the router app: uvicorn + httptools, with the router's client limits.

uvicorn's httptools protocol does the HTTP; :class:`RouterProtocol` subclasses it to add what a
proxy in front of a GPU fleet needs and uvicorn does not do (with httptools) on its own:

- **header size** (``max_header_bytes``): bytes received while a request's line and headers
  are incomplete are counted before the parser buffers more; over the limit the client gets
  431 and the connection closes. (uvicorn's h11 backend has ``h11_max_incomplete_event_size``;
  llhttp, the httptools parser, has no limit of its own.)
- **read timeout** (``request_read_timeout_s``): from the moment a connection opens or a
  request begins until its body is complete; a client that sends its headers or body too
  slowly (slowloris) gets 408 and the connection closes. Handlers waiting on that body see
  ``http.disconnect``, so nothing stays booked. Idle keep-alive connections are closed
  after uvicorn's ``timeout_keep_alive`` (5 s). Both timeouts share one timer per connection
  that only moves a deadline per request (no timer made and cancelled per request).
- **connection count** (``max_connections``): a request that arrives on a connection beyond
  the limit is answered 503 with ``Retry-After`` and its connection closed (uvicorn's
  ``limit_concurrency`` answers a text/plain 503 without Retry-After, so it is not used).
- **malformed HTTP** gets a JSON 400 (the OpenAI error envelope) instead of uvicorn's text.

Each request runs in a :class:`RouterCycle`, uvicorn's request cycle with savings on the hot
path: the response head is held until the first body piece and both go out in one ``write``
(one syscall a response fewer; a head with no body following in the same loop iteration goes
out on the next one), the forwarder can start its response with one call
(:meth:`RouterCycle.respond`), and a handler can ask to be called back when the client
disconnects instead of keeping a task blocked on ``receive()`` (:func:`client_channel`).
A POST to a generation path goes from the protocol to the forwarder directly
(:meth:`RouterCycle.run_direct`: uvicorn's ``run_asgi`` safety net, no app dispatch, the body
taken whole with :meth:`RouterCycle.whole_body`); the app still answers it while draining or
over the connection limit.

:class:`Server` marks the app as draining when SIGTERM / SIGINT arrives (new requests on
kept-alive connections get 503 + ``Connection: close``; ``/health`` answers 503), then stops
accepting and drains (:meth:`Server.shutdown`): requests waiting in flow control's queue are
answered 503 (Retry-After) at once; those sent to a worker go on up to ``shutdown_timeout_s``;
what is left then is cancelled, and each such request whose answer had not started gets the
OpenAI-style 503 ``shutdown`` with Retry-After (an event stream under way ends with an error
event; any other started answer is cut), never uvicorn's text/plain 500 and traceback. Every
booking is released in ``finally`` blocks, and the lifespan shutdown runs. :func:`serve` then
returns normally, so the process exits 0 (uvicorn re-raises the signal after a graceful
shutdown, which would make the exit status 143 / -15).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import unquote

import httptools
import uvicorn

from router.config import Settings
from router.core.errors import RETRY_STATUSES, error_body, send_error, shutting_down
from router.core.parse import GENERATION_PATHS
from router.service.accept import Acceptor
from router.service.context import RouterContext
from router.service.uvicorn_support import require_supported

# before uvicorn's internals below: a release outside the tested range fails here, naming it
require_supported()
from uvicorn.main import STARTUP_FAILURE  # noqa: E402
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT  # noqa: E402
from uvicorn.protocols.http.httptools_impl import (  # noqa: E402
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

log = logging.getLogger("cache_router.server")

RETRY_AFTER_S = 1
CUT_GRACE_S = 1.0  # at the drain's end: how long the requests cancelled get to answer
OVERLOADED_SCOPE_KEY = "cache_router.over_connection_limit"


def _response(status: int, reason: bytes, message: str, type_: str, code: str) -> bytes:
    body = error_body(message, type_, code)
    extra = b"retry-after: %d\r\n" % RETRY_AFTER_S if status in RETRY_STATUSES else b""
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n%s" % (status, reason, len(body), extra, body)
    )


# the forwarder's entry (scope, receive, send, endpoint kind, cycle), called by the server
# for a generation request without the app's ASGI dispatch (RouterCycle.run_direct)
DirectHandler = Callable[[Any, Any, Any, str, "RouterCycle"], Awaitable[None]]

HEADERS_TOO_LARGE = 431, b"Request Header Fields Too Large", "header_too_large"
READ_TIMEOUT = 408, b"Request Timeout", "read_timeout"
MALFORMED = 400, b"Bad Request", "malformed_http"


class RouterCycle(RequestResponseCycle):
    """uvicorn's request cycle: head and first body piece in one write; a disconnect callback;
    the task that runs it.

    :class:`RouterProtocol` makes each one directly (uvicorn's request start inlined for the
    plain case, in place of uvicorn's cycle re-classed: see bench/RESULTS.md for what it
    saves); the ones uvicorn still makes are adopted. The head is built as uvicorn builds
    it (same checks, same framing); anything unusual (HEAD, access log, paused writes, default
    headers) takes uvicorn's own path. The forwarder finds the cycle behind its ASGI ``send``
    (:func:`client_channel`) and uses :meth:`on_disconnect`, :meth:`respond` and ``task``
    directly.
    """

    _head: bytes | None = None  # the response head, held until the first body piece
    _on_disconnect: Callable[[], None] | None = None
    task: asyncio.Task | None = None  # the task running the app for this request
    endpoint: str | None = None  # a generation endpoint's kind: the forwarder's, directly

    def __init__(self, protocol: HttpToolsProtocol, scope: Any, keep_alive: bool) -> None:
        """uvicorn's cycle for ``protocol``'s current request, made directly (the same
        state as uvicorn's constructor gives)."""
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.logger = protocol.logger
        self.access_logger = protocol.access_logger
        self.access_log = protocol.access_log
        self.default_headers = protocol.server_state.default_headers
        self.message_event = asyncio.Event()
        self.on_response = protocol.on_response_complete
        self._disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding = None
        self.expected_content_length = 0

    @classmethod
    def adopt(cls, cycle: RequestResponseCycle) -> RouterCycle:
        """A cycle uvicorn made (its path for upgrades and a concurrency limit), turned
        into this class in place."""
        cycle.__class__ = cls
        cycle._disconnected = cycle.__dict__.pop("disconnected", False)  # type: ignore[attr-defined]
        return cycle  # type: ignore[return-value]

    @property  # type: ignore[override]
    def disconnected(self) -> bool:
        return self._disconnected

    @disconnected.setter
    def disconnected(self, value: bool) -> None:
        self._disconnected = value
        callback = self._on_disconnect
        if value and callback is not None:
            self._on_disconnect = None
            callback()

    def on_disconnect(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once when the client goes away (at once if it has); None: forget it.

        Every way a request learns of a lost client sets ``disconnected``: uvicorn's
        ``connection_lost`` and the limits of :class:`RouterProtocol`.
        """
        if callback is not None and self.disconnected:
            callback()
        else:
            self._on_disconnect = callback

    async def run_direct(self, handler: DirectHandler, endpoint: str) -> None:
        """uvicorn's ``run_asgi`` for a handler the server calls directly (the forwarder,
        for a generation request): the same safety net, without the app's dispatch."""
        try:
            await handler(self.scope, self.receive, self.send, endpoint, self)
        except asyncio.CancelledError:
            await self.cut()
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def run_asgi(self, app: Any) -> None:
        """uvicorn's ``run_asgi``, with a request the server cancels answered by :meth:`cut`."""

        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            except asyncio.CancelledError:
                await self.cut()

        await super().run_asgi(guarded)

    async def cut(self) -> None:
        """The server cancelled this request (only its shutdown cancels a request's task: a
        client that leaves is seen by the handler, which returns): the OpenAI-style 503
        with Retry-After if nothing was answered yet, else the connection closed (a body
        under way cannot say more). No traceback: the drain's end is no error."""
        if self.disconnected or self.response_complete:
            return
        if not self.response_started:
            self.keep_alive = False
            message = "the router is shutting down: the request was not answered in time"
            await send_error(self.send, shutting_down(message))
        else:
            self.transport.close()
            self.disconnected = True  # nothing more goes out (uvicorn's checks after the app)

    def whole_body(self) -> bytes | None:
        """The request body if it is already whole (nearly every request body: it came with
        the headers), handed over as :meth:`receive` would; None: read it with receive."""
        if (
            self.more_body
            or not self.message_event.is_set()
            or self.waiting_for_100_continue
            or self.disconnected
            or self.response_complete
        ):
            return None
        self.flow.resume_reading()  # as uvicorn's receive: a client that leaves is seen
        self.message_event.clear()
        body, self.body = self.body, bytearray()
        return bytes(body)

    async def receive(self) -> Any:
        body = self.whole_body()  # without uvicorn's wait on the message event
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        return await super().receive()

    def _unusual(self) -> bool:
        """A response start that takes uvicorn's own path (no held head, no single write):
        started already, client gone, paused writes, access log, default headers, HEAD."""
        return bool(
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or self.access_log
            or self.default_headers
            or self.scope["method"] == "HEAD"
        )

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._unusual():
                await super().send(message)
            else:
                self._hold_head(message["status"], message.get("headers", ()))
            return
        head = self._head
        if head is None or kind != "http.response.body":
            await super().send(message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
            if self._head is None:  # written meanwhile (_flush_head)
                await super().send(message)
                return
        self._head = None
        if not self.disconnected:
            self._write_first(head, message.get("body", b""), message.get("more_body", False))

    async def respond(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more_body: bool
    ) -> None:
        """Start the response and send its first body piece: one write, no ASGI messages.

        For the forwarder, whose headers come from a worker's response that llhttp parsed
        (no CR, LF or invalid name bytes can be in them) with names in lower case and the
        hop-by-hop ones (``connection``, ``transfer-encoding``) dropped, plus its own: they
        are not checked again, and the framing is the content-length's (else chunked), as
        uvicorn frames such headers. The unusual cases take :meth:`send`'s path.
        """
        if self._unusual():
            await self.send({"type": "http.response.start", "status": status, "headers": headers})
            await self.send({"type": "http.response.body", "body": body, "more_body": more_body})
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        length = None
        for name, value in headers:
            if length is None and name == b"content-length":
                length = value
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        if length is not None:
            self.expected_content_length = int(length)
            self.chunked_encoding = False
        elif status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self._write_first(b"".join(content), body, more_body)

    def _write_first(self, head: bytes, body: bytes, more_body: bool) -> None:
        """The head and the first body piece in one write; the response ends without more."""
        if self.chunked_encoding:
            data = head + b"%x\r\n%s\r\n" % (len(body), body) if body else head
            if not more_body:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            data = head + body
        self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _hold_head(self, status: int, headers: Any) -> None:
        """uvicorn's head for this response, kept until the first body piece (or the next
        loop iteration)."""
        self._head = self._build_head(status, headers)
        asyncio.get_running_loop().call_soon(self._flush_head)

    def _build_head(self, status: int, headers: Any) -> bytes:
        """uvicorn's response head (same checks, same framing); the response has started."""
        self.response_started = True
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        has_connection_close = False
        for name, value in headers:
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _flush_head(self) -> None:
        """A head whose body did not follow at once goes out alone."""
        head = self._head
        if head is not None:
            self._head = None
            if not self.disconnected and not self.transport.is_closing():
                self.transport.write(head)


def _nothing() -> None:
    pass


def client_channel(send: Any) -> RouterCycle | None:
    """The cycle behind an ASGI ``send``; None under another server."""
    cycle = getattr(send, "__self__", None)
    return cycle if isinstance(cycle, RouterCycle) else None


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The limits every client connection is held to (the module doc), from the settings."""

    max_header_bytes: int  # request line and headers
    read_timeout_s: float  # from a connection's opening or a request's start to its body's end
    max_connections: int  # 0: no limit

    @classmethod
    def of(cls, settings: Settings) -> ClientLimits:
        return cls(
            settings.max_header_bytes, settings.request_read_timeout_s, settings.max_connections
        )

    def message(self, code: str) -> str:
        """The error message of a connection rejected with ``code``."""
        if code == "header_too_large":
            return f"request line and headers exceed {self.max_header_bytes} bytes"
        if code == "read_timeout":
            return f"request not received within {self.read_timeout_s:g} s"
        return "invalid HTTP request"


def protocol_for(app: RouterContext) -> Callable[..., RouterProtocol]:
    """The protocol factory uvicorn's ``http`` setting takes: a :class:`RouterProtocol` per
    connection, serving ``app`` with its settings' client limits."""
    return partial(RouterProtocol, context=app, limits=ClientLimits.of(app.settings))


class RouterProtocol(HttpToolsProtocol):
    """One client connection: uvicorn's httptools protocol plus ``limits`` (the module doc),
    serving ``context``; made per connection by :func:`protocol_for`'s factory."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        context: RouterContext,
        limits: ClientLimits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._context = context
        self._limits = limits
        self._max_head = limits.max_header_bytes  # read per chunk and per head
        self._stats = context.pool.stats
        # generation requests go to the forwarder directly (RouterCycle.run_direct) when the
        # context has one (a stand-in app in tests has none: ASGI for everything)
        forwarder = context.forwarder
        self._direct: DirectHandler | None = forwarder.serve if forwarder is not None else None
        self._awaiting_head = True  # a request line / headers are (or may be) on the way
        self._head_bytes = 0  # bytes received while awaiting a head
        self._boundaries = 0  # heads / messages completed in the current data_received
        self._head_size = 0  # request line and headers of the current request, parsed
        # one timer per connection for both the read timeout and the keep-alive idle
        # timeout: a deadline moves without touching the timer, which fires at or before
        # it and re-arms for the rest (no timer made and cancelled per request)
        self._deadline: float | None = None
        self._reading = False  # the deadline is the read timeout's (else keep-alive's)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._rejected = False
        self._uvicorns_path = False  # the current request is uvicorn's (upgrade, limit)
        self._over_limit = False
        self._counted = False
        # uvicorn points self.cycle at the newest request; with pipelining the one whose
        # handler runs may be older, and it must learn of a lost connection too (else
        # its next write hits a closed transport: uvloop raises)
        self._running: Any = None

    # ---- connection --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._stats.connections += 1
        self._counted = True
        max_connections = self._limits.max_connections
        self._over_limit = bool(max_connections) and len(self.connections) > max_connections
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._counted:
            self._counted = False
            self._stats.connections -= 1
        self._disconnect_running()
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if cycle.__class__ is not RouterCycle:  # one uvicorn made (its unusual path)
            RouterCycle.adopt(cycle)
        self._running = cycle
        if self.config.reset_contextvars:  # uvicorn's opt-in context workaround
            super()._start_asgi_task(cycle, app)
            return
        # uvicorn's, keeping the task on the cycle (no current_task() per request); a
        # generation request goes to the forwarder without the app's dispatch, unless
        # the app would refuse it (draining, over the connection limit)
        endpoint = cycle.endpoint
        if endpoint is not None and not self._context.draining and not self._over_limit:
            task = cycle.task = self.loop.create_task(cycle.run_direct(self._direct, endpoint))
        else:
            task = cycle.task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _disconnect_running(self) -> None:
        running = self._running
        if running is not None and not running.response_complete:
            running.disconnected = True
            running.message_event.set()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        self._boundaries = 0
        super().data_received(data)
        if self._awaiting_head and not self._boundaries and not self._rejected:
            # no head or message ended in this chunk: it is all (part of) a head the
            # parser holds
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head:
                self._reject(*HEADERS_TOO_LARGE)

    def send_400_response(self, msg: str) -> None:
        self._reject(*MALFORMED)

    # ---- parser callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's, inlined (called per request)
        self.url = b""
        self.expect_100_continue = False
        self.headers = headers = []
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        self._uvicorns_path = False
        self._awaiting_head = True
        self._head_size = 0
        if not self._reading:
            self._arm()

    def on_url(self, url: bytes) -> None:
        if not self._rejected:
            self._head_size += len(url)
            self.url += url  # uvicorn's on_url, inlined (called per request)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._rejected:
            self._head_size += len(name) + len(value) + 4
            # uvicorn's on_header, inlined (called per header)
            name = name.lower()
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        if self._head_size > self._max_head:  # a head that arrived whole in one chunk
            self._reject(*HEADERS_TOO_LARGE)
            return
        self._awaiting_head = False
        self._head_bytes = 0
        self._boundaries += 1
        if self._over_limit:
            self.scope[OVERLOADED_SCOPE_KEY] = True  # type: ignore[literal-required]
        if self.parser.should_upgrade() or self.limit_concurrency is not None:
            self._uvicorns_path = True  # uvicorn's own path, to the end of this message
            super().on_headers_complete()
        else:
            self._start_cycle()
        if self.pipeline:  # queued behind a running request: read later, not timed
            self._disarm()

    def _start_cycle(self) -> None:
        """uvicorn's on_headers_complete for a plain request (no upgrade, no concurrency
        limit): the same scope (tests/router/service/test_server_cycle.py compares it with
        uvicorn's), and a RouterCycle made directly."""
        parser = self.parser
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        if version != "1.1":
            scope["http_version"] = version
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = url.query or b""
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = RouterCycle(self, scope, keep_alive)
        if self._direct is not None and scope["method"] == "POST" and self.app is self._context:
            cycle.endpoint = GENERATION_PATHS.get(scope["path"])
        existing = self.cycle
        self.cycle = cycle
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:  # pipelined: queued behind the running one
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        if self._uvicorns_path:
            super().on_body(body)
            return
        cycle = self.cycle  # uvicorn's on_body for a plain request, inlined
        if not cycle.response_complete:
            cycle.body += body
            if len(cycle.body) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()
            cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._boundaries += 1
        self._disarm()
        self._awaiting_head = True
        self._head_bytes = 0
        if self._rejected:
            return
        if self._uvicorns_path:
            super().on_message_complete()
            return
        cycle = self.cycle  # uvicorn's on_message_complete for a plain request, inlined
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timeout on the connection's one timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif not self._reading:
            self._until(self.loop.time() + self.timeout_keep_alive, reading=False)

    # ---- limits ------------------------------------------------------------------

    def _arm(self) -> None:
        """The read timeout starts: the request must be complete within it."""
        self._until(self.loop.time() + self._limits.read_timeout_s, reading=True)

    def _disarm(self) -> None:
        """The request is complete (or not timed): no read deadline any more."""
        if self._reading:
            self._reading = False
            self._deadline = None

    def _until(self, deadline: float, reading: bool) -> None:
        self._deadline = deadline
        self._reading = reading
        timer = self._timer
        if timer is None or self._timer_at > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(deadline, self._tick)
            self._timer_at = deadline

    def _stop_timer(self) -> None:
        self._deadline = None
        self._reading = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:  # moved since the timer was set
            self._timer = self.loop.call_at(deadline, self._tick)
            self._timer_at = deadline
            return
        reading = self._reading
        self._deadline = None
        self._reading = False
        if reading:
            self._reject(*READ_TIMEOUT)
        else:
            self.timeout_keep_alive_handler()  # idle: close

    def _reject(self, status: int, reason: bytes, code: str) -> None:
        """Answer ``status`` (JSON) and close; nothing more is read on this connection.

        A request of this connection still being handled sees ``http.disconnect`` (its
        handler releases what it holds); if its response had started, the connection
        is only closed (an error body cannot follow a started response).
        """
        if self._rejected:
            return
        self._rejected = True
        self._stop_timer()
        self._stats.count_rejected(code)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            # an older (pipelined) request is still being answered: no error response
            # can go ahead of it, so both learn of the end and the connection closes
            self._disconnect_running()
            if self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            transport.close()
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                transport.close()
                return
        type_ = "invalid_request_error"
        transport.write(_response(status, reason, self._limits.message(code), type_, code))
        transport.close()


class Server(uvicorn.Server):
    """uvicorn's server that accepts every pending connection at once
    (:mod:`router.service.accept`) and tells the app it is draining as soon as a signal
    arrives."""

    def __init__(self, config: uvicorn.Config, app: RouterContext) -> None:
        super().__init__(config)
        self.router_app = app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup for a TCP listener (or the given ``sockets``), with an
        :class:`Acceptor` on each socket in place of the loop's server."""
        config = self.config
        if config.uds is not None or config.fd is not None:
            raise ValueError("the router listens on a host and port, or on given sockets")
        if sockets is None:
            # binds and logs "Uvicorn running on ...", as uvicorn's startup would (a port
            # in use: logged, exit status 1), now before the lifespan starts anything
            sockets = [config.bind_socket()]
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        loop = asyncio.get_running_loop()
        self.servers = [  # type: ignore[assignment]
            Acceptor(loop, sock, create_protocol, config.backlog) for sock in sockets
        ]
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's graceful shutdown with the router's drain (see the module doc): stop
        accepting, close idle connections, answer flow control's queue now, wait up to
        ``shutdown_timeout_s`` for the requests under way, then cut what is left (each
        answered 503 where its answer has not started), then the lifespan shutdown."""
        logging.getLogger("uvicorn.error").info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        self.router_app.drain()
        await asyncio.sleep(0.1)
        try:
            await asyncio.wait_for(
                self._wait_tasks_to_complete(), timeout=self.config.timeout_graceful_shutdown
            )
        except TimeoutError:
            await self._cut()
        pool = self.router_app.pool
        log.info(
            "drained: %d request(s) in flight, %d booked on workers",
            pool.stats.in_flight,
            sum(w.state.num_requests for w in pool.workers),
        )
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _cut(self) -> None:
        """The drain's time is over: cancel every request still running; each answers
        (503 ``shutdown``, or its stream ended) and releases what it holds."""
        tasks = list(self.server_state.tasks)
        log.warning("drain over: %d request(s) still running, cut", len(tasks))
        self.router_app.drain_ended()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_GRACE_S)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.router_app.draining:
            self.router_app.draining = True
            log.warning(
                "signal %d: draining (%d in flight, up to %g s)",
                sig,
                self.router_app.pool.stats.in_flight,
                self.config.timeout_graceful_shutdown or 0,
            )
        super().handle_exit(sig, frame)


def build_config(app: RouterContext, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration for ``app`` (``overrides``: host, port, log_level, ...)."""
    values: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": protocol_for(app),
        "lifespan": "on",
        "log_level": settings.log_level.lower(),
        "access_log": settings.access_log,
        "server_header": False,  # the worker's own Server / Date headers pass through
        "proxy_headers": False,  # no X-Forwarded-* rewriting: the proxy reads none of it
        "date_header": False,
        "backlog": 4096,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
    }
    values.update(overrides)
    return uvicorn.Config(app, **values)


def serve(
    app: RouterContext, config: uvicorn.Config, sockets: list[socket.socket] | None = None
) -> None:
    """Run until SIGTERM / SIGINT, drain, and return (so the process exits 0).

    uvicorn restores the signal handlers it found and then re-raises the signal it caught;
    with Python-level no-op handlers installed first, that re-raise lands here instead of
    killing the process with the signal's default action.
    """
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Server(config, app).run(sockets=sockets)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore(sig: int, frame: Any) -> None:
    """A signal that arrives after the drain finished: the process is exiting anyway."""

"""One client request as the proxy carries it: its routing (:class:`Routed`) and the bytes
moved for it, across attempts and the legs of a disaggregated pair; how its response starts
and which of the worker's headers it keeps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.core.errors import RouterError
from router.core.routing import Routed
from router.fleet.pool import DECODE, Worker
from router.service.body import BodyStream

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
WORKER_HEADER = b"x-cache-router-worker"

# (status, headers, first body piece, more_body): starts the client's response
Respond = Callable[[int, list[tuple[bytes, bytes]], bytes, bool], Awaitable[None]]


@dataclass(slots=True, kw_only=True)
class Exchange(Routed):
    """One client request's state across attempts: its routing (:class:`Routed`) and the
    bytes this proxy moves for it."""

    path: bytes
    method: bytes
    start: float
    headers: bytes  # forwarded header lines
    body: bytes = b""  # what the worker receives
    drop_usage_chunk: bool = False
    task: asyncio.Task | None = None
    started: bool = False  # the response status and headers went to the client
    responded: bool = False  # the last byte went to the client
    client_gone: bool = False
    finished: bool = False  # the handler is past its last await
    body_rest: BodyStream | None = None  # a streamed upload: what follows ``body``
    body_length: int | None = None  # its declared length (None: chunked)
    leg_error: RouterError | None = None  # an SGLang prefill leg's failure, for its decode leg
    # an SGLang decode leg's prefill worker and leg (while it runs): the KV it waits for
    kv_from: tuple[Worker, asyncio.Task] | None = None

    def client_left(self) -> None:
        """The client disconnected: cancel the handler unless its response is complete."""
        if not self.responded and not self.finished:
            self.client_gone = True
            self.task.cancel()  # type: ignore[union-attr]

    def leg_failed(self, error: RouterError) -> None:
        """An SGLang prefill leg failed: its decode leg waits for KV that will not come, so
        cancel it (unless it answers the client already: then it ends on its own; or no
        decode leg waits on it any more: ``kv_from`` is None)."""
        if self.kv_from is not None and not (self.started or self.finished or self.client_gone):
            self.leg_error = error
            self.task.cancel()  # type: ignore[union-attr]

    def kv_pending(self, worker: Worker) -> Worker | None:
        """The prefill worker whose KV ``worker`` waits for: an SGLang decode leg's, while
        that prefill leg has not answered (a decode that sent nothing in time, or failed,
        may have failed for want of it); None otherwise."""
        pending = self.kv_from
        if worker.role == DECODE and pending is not None and not pending[1].done():
            return pending[0]
        return None


def response_headers(
    upstream: list[tuple[bytes, bytes]], worker: Worker, transformed: bool, name_worker: bool
) -> list[tuple[bytes, bytes]]:
    """The worker's headers for the client: hop-by-hop ones dropped, the length too when the
    body is changed on the way (``transformed``), the worker named (``name_worker``)."""
    headers = [
        (name, value)
        for name, value in upstream
        if name not in HOP_BY_HOP and not (transformed and name == b"content-length")
    ]
    if name_worker:
        headers.append((WORKER_HEADER, worker.url.encode()))
    return headers


def is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-type":
            return value.startswith(b"text/event-stream")
    return False


async def asgi_respond(
    send, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more_body: bool
) -> None:
    """Start the response and send its first body piece, as two ASGI messages (what
    :meth:`router.service.server.RouterCycle.respond` does in one write under our server)."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": more_body})

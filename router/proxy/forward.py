"""The hot path: one generation request, from the client's bytes to the worker and back.

A raw ASGI handler (no framework routing, one JSON parse, one tokenization, one hash pass).
What it decides is the router core's (:mod:`router.core.routing`, shared with every front
end); what it adds is moving the bytes. For each request:

1. read the body (``max_body_bytes`` → 413), parse it (→ 400), turn it into features;
2. pick a worker among the healthy ones not tried yet and **book** it
   (:meth:`WorkerState.book`: counters up, blocks pinned, radix path locked; unless the radix
   tree answers the estimates, its insert runs right after the write to the worker, before
   any other task can pick or book: off the latency path, same outcome);
3. send the original body bytes (only a stream gets ``stream_options.include_usage`` added)
   and wait for the response headers and the first body bytes (a body that is not an event
   stream: all of it, up to 4 MiB). Until a byte has gone to the client, a connect error, a
   reset or a 5xx is retried on another worker (``max_attempts``); a timeout is a 504, a
   worker's 4xx passes through as it is;
4. at the first body byte the booking's pending prefill is released
   (:meth:`Booking.first_token`); the worker's status and headers (hop-by-hop ones dropped)
   and then each body piece go to the client as they arrive;
5. the cached tokens the worker reports are recorded against both shadows' estimates and
   correct the shadow (:mod:`router.cache.feedback`);
6. ``Booking.finish`` runs in a ``finally`` around the whole exchange: success, worker error,
   timeout, client disconnect, cancellation, each releases exactly once.

Client disconnects: after the body is read, a disconnect before the response is complete
cancels the handler, whose ``finally`` blocks close the upstream socket (the worker aborts the
generation) and release the booking. Under the router's own server the connection calls back
(:func:`router.service.server.client_channel`: no task per request); under any other ASGI
server a watcher task waits on ``receive()`` for ``http.disconnect``.

The Responses API (``/v1/responses``) is a generation endpoint like the others, with one
rule more: the engines keep stored responses in each server's memory, so a continuation
(``previous_response_id``) and every call on a response id (``/v1/responses/{id}``:
retrieve, delete, cancel, input items) go to the worker that stored it, learned from the
``id`` of the responses forwarded here (:mod:`router.fleet.response_owners`), with no retry
elsewhere; an id nobody stored is the router's 404 ``response_not_found``, an owner that
left the fleet its 404 ``response_owner_gone``, an owner out of service its 503. The
engines' other endpoints (embeddings, rerank, score, pooling, tokenize, audio:
:data:`~router.core.parse.OTHER_PATHS`) take the same path without a prompt: no blocks,
their body's length as the load they bring, the model they name. An audio upload
(multipart) is not held whole: its first 64 KiB give the form's ``model``, the rest goes to
the worker as the client sends it (retried elsewhere only while none of the rest was read).

Admission: at most ``max_inflight`` requests are handled at once (counted from arrival to
the last byte); one more gets 429 with ``Retry-After`` before its body is read. Client keys
are checked in constant time (:mod:`router.core.access`). Each attempt's outcome feeds the
worker's circuit (:mod:`router.fleet.pool`): connect errors, resets, timeouts and 5xx answers are
failures (so is a vLLM prefill worker's 200 that is no prefill answer:
:mod:`router.proxy.disagg`), a worker's other answers a success. Resets, 5xx answers and
those 200s are held until the request's outcome is known: a request that fails alike on two
or more workers and nowhere succeeds is more likely the request's fault than theirs (a
"poison" request), so it counts against no circuit (``suspect_requests_total``) and a client
cannot take workers out with it. An unexpected exception (a bug) answers a JSON 500 if
nothing was sent yet, and still releases everything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

import orjson

from router.core.access import Access
from router.core.errors import (
    PayloadTooLarge,
    RouterError,
    TooManyRequests,
    Unauthorized,
    send_error,
    shutting_down,
)
from router.core.flow import bearer_key
from router.core.parse import CHAT, COMPLETION, STREAMED_BODIES
from router.core.routing import PROMPT_KINDS, RouterCore
from router.core.usage import asking_usage
from router.fleet.pool import PREFILL
from router.proxy.attempt import Attempts
from router.proxy.disagg import Disaggregation
from router.proxy.exchange import HOP_BY_HOP, Exchange, Respond, asgi_respond
from router.service.body import ClientGone, open_body, read_body
from router.service.server import RouterCycle, client_channel

log = logging.getLogger("cache_router.forward")

_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
BODY_PEEK = 64 << 10  # a streamed upload's first bytes, read before a worker is picked


class Forwarder:
    """The ASGI handler for the routed endpoints: generation (chat, completions, /generate,
    responses), calls on a stored response, and the engines' other endpoints; the routing
    itself is the core's (:class:`~router.core.routing.RouterCore`), one exchange a request:
    prepare, pick, attempt (:mod:`router.proxy.attempt`, or a disaggregated pair:
    :mod:`router.proxy.disagg`), respond, release."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.settings = settings = core.settings
        self.metrics = core.metrics
        self.attempts = Attempts(core)
        self.disaggregation = Disaggregation(self.attempts)
        self.session_header = settings.session_header.lower().encode()
        self.access = Access(settings)
        worker_key = settings.worker_api_key
        self.worker_auth = (
            b"authorization: Bearer " + worker_key.get_secret_value().encode() + b"\r\n"
            if worker_key is not None
            else None
        )

    # ---- entry ---------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive, send, kind: str) -> None:
        """The ASGI entry (the app's dispatch; under any ASGI server)."""
        await self.serve(scope, receive, send, kind, client_channel(send))

    async def serve(
        self, scope: dict, receive, send, kind: str, channel: RouterCycle | None
    ) -> None:
        """One generation request; ``channel``: the router server's cycle behind ``send``
        (which calls this directly, without the ASGI dispatch), None under another server."""
        core = self.core
        try:
            core.admit()
        except TooManyRequests as error:
            core.unrouted(kind, "429")
            await send_error(send, error)
            return
        try:
            await self._handle(scope, receive, send, kind, channel)
        finally:
            core.leave()

    async def _handle(
        self, scope: dict, receive, send, kind: str, channel: RouterCycle | None
    ) -> None:
        start = time.perf_counter()
        endpoint = kind
        try:
            ex = await self._prepare(scope, receive, kind, start, channel)
        except ClientGone:
            self.core.unrouted(endpoint, "client_disconnect")
            return
        except RouterError as error:
            self.core.unrouted(endpoint, str(error.status))
            await send_error(send, error)
            self.metrics.duration(endpoint).observe(time.perf_counter() - start)
            return
        except Exception:  # a bug: answer JSON, never a bare 500 from the server
            log.exception("unexpected error preparing %s", scope.get("path"))
            self.core.unrouted(endpoint, "500")
            await send_error(send, RouterError("internal error in the router"))
            return
        except asyncio.CancelledError:
            if not self.core.drain_over:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            await self._shut(send, endpoint, None)
            return
        watcher = None
        if channel is not None:
            ex.task = channel.task or asyncio.current_task()
            channel.on_disconnect(ex.client_left)
            respond = channel.respond
        else:
            ex.task = asyncio.current_task()
            if ex.body_rest is None:  # (a streamed upload's own reads see a disconnect)
                watcher = asyncio.get_running_loop().create_task(self._watch(receive, ex))
            respond = partial(asgi_respond, send)
        try:
            try:
                if self.core.flow is not None:
                    await self._flow_wait(scope, ex)
                await self._attempts(ex, send, respond)
            except RouterError as error:
                if not ex.tried:
                    self.core.unrouted(endpoint, str(error.status))
                await send_error(send, error)
            except Exception:  # a bug: bookings are released by then (finally blocks)
                log.exception("unexpected error proxying %s", scope.get("path"))
                if not ex.started:
                    await send_error(send, RouterError("internal error in the router"))
                else:
                    raise  # the response started: the server closes the connection
        except ClientGone:  # during a streamed upload (the attempt released its booking)
            ex.client_gone = True
        except asyncio.CancelledError:
            if ex.client_gone:  # our own cancellation (client gone): the request is over
                ex.task.uncancel()
            elif self.core.drain_over and (ex.responded or not ex.started):
                # the server's, at the drain's end: answered here (a stream under way was
                # ended by its attempt); a body under way is cut by the server
                ex.task.uncancel()
                if not ex.started:
                    await self._shut(send, endpoint, ex)
            else:
                raise
        finally:
            ex.finished = True  # from here on a disconnect must not cancel this task
            if channel is not None:
                channel.on_disconnect(None)
            elif watcher is not None and not watcher.done():
                watcher.cancel()
            self.metrics.duration(endpoint).observe(time.perf_counter() - start)

    async def _shut(self, send, endpoint: str, ex: Exchange | None) -> None:
        """The drain ended before this request's answer started: 503 ``shutdown`` with
        Retry-After (a worker's attempt counted it already, as ``shutdown``)."""
        if ex is None or not ex.tried:
            self.core.unrouted(endpoint, "503")
        if ex is not None:
            ex.responded = True
        message = "the router is shutting down: the worker had not answered in time"
        await send_error(send, shutting_down(message), [(b"connection", b"close")])

    async def _prepare(
        self, scope: dict, receive, kind: str, start: float, channel: RouterCycle | None
    ) -> Exchange:
        """Headers, body, parse, features: everything before a worker is chosen."""
        session_value = None
        declared = None
        auth = None
        lines: list[bytes] = []
        not_forwarded = _NOT_FORWARDED
        for name, value in scope["headers"]:
            if name == self.session_header:
                session_value = value.decode("latin-1")
            if name == b"authorization":
                auth = value
                if self.worker_auth is not None:
                    continue
            elif name == b"content-length":
                declared = value
            if name not in not_forwarded:
                lines += (name, b": ", value, b"\r\n")
        if not self.access.client_ok(auth):
            raise Unauthorized("missing or invalid API key")
        if self.worker_auth is not None:
            lines.append(self.worker_auth)
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        raw = channel.whole_body() if channel is not None else None
        rest = None
        if raw is None:
            if kind in STREAMED_BODIES:
                raw, rest = await open_body(receive, limit, BODY_PEEK)
            else:
                raw = await read_body(receive, limit)
        elif len(raw) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        content_type = None
        if kind not in PROMPT_KINDS:
            content_type = next((v for n, v in scope["headers"] if n == b"content-type"), None)
        ex = await self.core.understand(
            kind, raw, session_value, scope["method"], scope["path"], content_type,
            into=Exchange, path=path, method=scope["method"].encode(), start=start,
            headers=b"".join(lines), body_rest=rest,
            body_length=int(declared) if rest is not None and declared is not None else None,
        )  # fmt: skip
        request = ex.request
        ex.body = raw
        if (
            request.stream
            and kind in (CHAT, COMPLETION)
            and self.settings.stream_usage
            and not request.wants_usage
        ):
            ex.body = orjson.dumps(asking_usage(request.body))
            ex.drop_usage_chunk = True
        return ex

    async def _flow_wait(self, scope: dict, ex: Exchange) -> None:
        """Flow control (:mod:`router.core.flow`): wait for this request's turn. A client
        that leaves meanwhile cancels the wait like any other (the queue lets it go)."""
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        key = bearer_key(headers.get("authorization"))
        await self.core.flow_wait(ex, headers.get, len(ex.body), key)

    async def _watch(self, receive, ex: Exchange) -> None:
        """Cancel the exchange when the client disconnects before the response ends."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                ex.client_left()
                return

    # ---- attempts ------------------------------------------------------------------------

    async def _attempts(self, ex: Exchange, send, respond: Respond) -> None:
        """Pick, book and try workers until one answers (``max_attempts``); the held
        failures are settled however it ends."""
        core = self.core
        attempts = self.settings.max_attempts if ex.owner is None else 1
        last_error: RouterError | None = None
        try:
            for attempt in range(attempts):
                if ex.body_rest is not None and ex.body_rest.started:
                    raise last_error  # type: ignore[misc]  # a part of the upload is gone
                worker, pick = core.choose(ex, last_error)
                ex.tried.append(worker)
                final = attempt == attempts - 1
                if worker.role == PREFILL:
                    fields = ex.request.body
                    if ex.drop_usage_chunk:  # the usage the router asked for, as in ex.body
                        fields = asking_usage(fields)
                    error = await self.disaggregation.run(
                        ex, worker, pick, fields, send, respond, final
                    )
                else:
                    error = await self.attempts.run(ex, worker, pick, send, respond, final)
                if error is None:
                    return
                last_error = error
            raise last_error  # type: ignore[misc]
        finally:
            core.settle(ex)

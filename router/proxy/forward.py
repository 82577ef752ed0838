"""The hot path: one generation request, from the client's bytes to the worker and back.

A raw ASGI handler (no framework routing, one JSON parse, one tokenization, one hash pass).
What it decides is the router core's (:mod:`router.proxy.routing`, shared with every front
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
(:func:`router.proxy.server.client_channel`: no task per request); under any other ASGI
server a watcher task waits on ``receive()`` for ``http.disconnect``.

The Responses API (``/v1/responses``) is a generation endpoint like the others, with one
rule more: the engines keep stored responses in each server's memory, so a continuation
(``previous_response_id``) and every call on a response id (``/v1/responses/{id}``:
retrieve, delete, cancel, input items) go to the worker that stored it, learned from the
``id`` of the responses forwarded here (:mod:`router.fleet.response_owners`), with no retry
elsewhere; an id nobody stored is the router's 404 ``response_not_found``, an owner that
left the fleet its 404 ``response_owner_gone``, an owner out of service its 503. The
engines' other endpoints (embeddings, rerank, score, pooling, tokenize, audio:
:data:`~router.proxy.parse.OTHER_PATHS`) take the same path without a prompt: no blocks,
their body's length as the load they bring, the model they name. An audio upload
(multipart) is not held whole: its first 64 KiB give the form's ``model``, the rest goes to
the worker as the client sends it (retried elsewhere only while none of the rest was read).

Admission: at most ``max_inflight`` requests are handled at once (counted from arrival to
the last byte); one more gets 429 with ``Retry-After`` before its body is read. Client keys
are checked in constant time (:mod:`router.proxy.access`). Each attempt's outcome feeds the
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import orjson

from router.config import Settings
from router.fleet.pool import DECODE, PREFILL, Worker, WorkerPool
from router.fleet.response_owners import ResponseOwners
from router.fleet.upstream import ConnectFailed, Connection, ConnectionLost, ReadTimeout
from router.proxy.access import Access
from router.proxy.disagg import (
    DISAGGREGATED,
    SGLANG,
    VLLM,
    BadPrefillAnswer,
    bootstrap_fields,
    kv_transfer_params,
    protocol_of,
    vllm_prefill_body,
    with_fields,
    with_request_id,
)
from router.proxy.errors import (
    BadGateway,
    GatewayTimeout,
    PayloadTooLarge,
    RouterError,
    TooManyRequests,
    Unauthorized,
    error_body,
    send_error,
)
from router.proxy.metrics import RouterMetrics
from router.proxy.parse import CHAT, COMPLETION, STREAMED_BODIES
from router.proxy.routing import PROMPT_KINDS, Routed, RouterCore
from router.proxy.server import RouterCycle, client_channel
from router.proxy.tokenize import Tokenizer
from router.proxy.usage import MAX_SCANNED_BODY, UsageReader, scan_body, stream_usage

log = logging.getLogger("cache_router.forward")

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
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
RESPONSE_ID_WITHIN = 64 << 10  # a response's id is looked for in its first bytes only
BODY_PEEK = 64 << 10  # a streamed upload's first bytes, read before a worker is picked
# how long an SGLang decode leg's failure waits for news of its prefill leg: a decode that
# failed for want of the prefill's KV fails about when the prefill does
PREFILL_NEWS_S = 0.1

# (status, headers, first body piece, more_body): starts the client's response
Respond = Callable[[int, list[tuple[bytes, bytes]], bytes, bool], Awaitable[None]]


class ClientGone(Exception):
    """The client went away before its request body was complete."""


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
        cancel it (unless it answers the client already: then it ends on its own)."""
        if not self.started and not self.finished and not self.client_gone:
            self.leg_error = error
            self.task.cancel()  # type: ignore[union-attr]


class Forwarder(RouterCore):
    """The ASGI handler for the routed endpoints: generation (chat, completions, /generate,
    responses), calls on a stored response, and the engines' other endpoints; the routing
    itself is the core's (:class:`~router.proxy.routing.RouterCore`)."""

    def __init__(
        self,
        settings: Settings,
        pool: WorkerPool,
        tokenizer: Tokenizer,
        metrics: RouterMetrics,
        owners: ResponseOwners | None = None,
    ) -> None:
        super().__init__(settings, pool, tokenizer, metrics, owners)
        self.session_header = settings.session_header.lower().encode()
        self.access = Access(settings)
        worker_key = settings.worker_api_key
        self.worker_auth = (
            b"authorization: Bearer " + worker_key.get_secret_value().encode() + b"\r\n"
            if worker_key is not None
            else None
        )
        self.worker_header = settings.worker_header
        self.read_timeout = settings.read_timeout_s

    # ---- entry ---------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive, send, kind: str) -> None:
        """The ASGI entry (the app's dispatch; under any ASGI server)."""
        await self.serve(scope, receive, send, kind, client_channel(send))

    async def serve(
        self, scope: dict, receive, send, kind: str, channel: RouterCycle | None
    ) -> None:
        """One generation request; ``channel``: the router server's cycle behind ``send``
        (which calls this directly, without the ASGI dispatch), None under another server."""
        try:
            self.admit()
        except TooManyRequests as error:
            self.unrouted(kind, "429")
            await send_error(send, error)
            return
        try:
            await self._handle(scope, receive, send, kind, channel)
        finally:
            self.leave()

    async def _handle(
        self, scope: dict, receive, send, kind: str, channel: RouterCycle | None
    ) -> None:
        start = time.perf_counter()
        endpoint = kind
        try:
            ex = await self._prepare(scope, receive, kind, start, channel)
        except ClientGone:
            self.unrouted(endpoint, "client_disconnect")
            return
        except RouterError as error:
            self.unrouted(endpoint, str(error.status))
            await send_error(send, error)
            self.metrics.duration(endpoint).observe(time.perf_counter() - start)
            return
        except Exception:  # a bug: answer JSON, never a bare 500 from the server
            log.exception("unexpected error preparing %s", scope.get("path"))
            self.unrouted(endpoint, "500")
            await send_error(send, RouterError("internal error in the router"))
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
                await self._attempts(ex, send, respond)
            except RouterError as error:
                if not ex.tried:
                    self.unrouted(endpoint, str(error.status))
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
            if not ex.client_gone:
                raise
            ex.task.uncancel()  # our own cancellation (client gone): the request is over
        finally:
            ex.finished = True  # from here on a disconnect must not cancel this task
            if channel is not None:
                channel.on_disconnect(None)
            elif watcher is not None and not watcher.done():
                watcher.cancel()
            self.metrics.duration(endpoint).observe(time.perf_counter() - start)

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
        ex = await self.understand(
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
        attempts = self.settings.max_attempts if ex.owner is None else 1
        last_error: RouterError | None = None
        try:
            for attempt in range(attempts):
                if ex.body_rest is not None and ex.body_rest.started:
                    raise last_error  # type: ignore[misc]  # a part of the upload is gone
                worker, pick = self.choose(ex, last_error)
                final = attempt == attempts - 1
                if worker.role == PREFILL:
                    error = await self._disaggregated(ex, worker, pick, send, respond, final)
                else:
                    error = await self._attempt(ex, worker, pick, send, respond, final)
                if error is None:
                    return
                last_error = error
            raise last_error  # type: ignore[misc]
        finally:
            self.settle(ex)

    async def _attempt(
        self,
        ex: Exchange,
        worker: Worker,
        pick,
        send,
        respond: Respond,
        final: bool,
        body: bytes | None = None,
        headers: bytes | None = None,
    ) -> RouterError | None:
        """One try on ``worker``; a RouterError to retry, None when the client was answered.
        ``body``, ``headers``: what the worker gets instead of ``ex.body`` and ``ex.headers``
        (a disaggregated decode leg)."""
        stats = worker.stats
        booking = self.book(ex, worker, pick, radix_later=True)
        if body is None:
            body, headers = ex.body, ex.headers
        conn: Connection | None = None
        status_label = "upstream_lost"
        sse = False
        try:
            try:
                if ex.body_rest is None:
                    conn = await worker.upstream.request(
                        ex.method, ex.path, headers, body, self.read_timeout,
                        booking.insert_radix,
                    )  # fmt: skip
                else:
                    booking.insert_radix()
                    conn = await worker.upstream.request_streamed(
                        ex.method, ex.path, ex.headers, ex.body, ex.body_rest,
                        ex.body_length, self.read_timeout,
                    )  # fmt: skip
                if ex.client_gone:  # belt and braces: a cancellation lost in a race
                    raise asyncio.CancelledError
                if conn.status >= 500 and not final and self._may_retry(ex, worker):
                    stats.count(stats.upstream_errors, "status_5xx")
                    status_label = str(conn.status)
                    ex.failures.append((worker, f"HTTP {conn.status}"))
                    return BadGateway(
                        f"worker {worker.url} answered {conn.status}", code="worker_5xx"
                    )
                data, more = await conn.read(self.read_timeout)
                if more and not _is_event_stream(conn.headers):
                    data, more = await _held_whole(conn, data, self.read_timeout)
            except (ConnectFailed, ConnectionLost, ReadTimeout) as exc:
                status_label, error = self._failed(ex, worker, exc)
                if isinstance(error, GatewayTimeout):
                    raise error from None
                return error

            # first body bytes (or the whole body): the prefill is done
            booking.first_token()
            now = time.perf_counter()
            self.metrics.ttfb(ex.endpoint).observe(now - ex.start)
            status = conn.status
            self.answered(ex, worker, status)  # (a 5xx relayed: no other worker left)
            ids = self.owner_reader(ex, status)
            if ids is not None:
                ids = self.learn_owner(ids, data, worker)
            sse = ex.request.stream and _is_event_stream(conn.headers)
            reader = UsageReader(sse, ex.drop_usage_chunk, status < 300)
            headers = self._response_headers(conn.headers, worker, transformed=sse)
            data = reader.feed(data, not more)
            status_label = str(status)
            ex.started = True
            if not more:
                ex.responded = True
            await respond(status, headers, data, more)
            while more:
                data, more = await conn.read(self.read_timeout)
                if ex.client_gone:
                    raise asyncio.CancelledError
                if ids is not None:  # until the id is whole (it comes first)
                    ids = self.learn_owner(ids, data, worker)
                data = reader.feed(data, not more)
                if not more:
                    ex.responded = True
                if data or not more:
                    await send({"type": "http.response.body", "body": data, "more_body": more})
            conn.release()
            conn = None
            usage = reader.usage()
            if usage is not None and worker.role != DECODE:
                self.report(ex, worker, booking, usage)
            return None
        except (ConnectionLost, ReadTimeout) as exc:
            # after bytes reached the client: never retried, the stream is cut
            kind = "timeout" if isinstance(exc, ReadTimeout) else "reset"
            stats.count(stats.upstream_errors, kind)
            self.pool.record_failure(worker, f"stream cut: {exc}", request=True)
            log.warning("stream from %s cut: %s", worker.url, exc)
            status_label = "upstream_lost"
            if sse and not ex.client_gone:
                # an event stream ends with an error event, as vLLM ends a failed stream
                # (a plain body cannot say it: its connection is closed, short)
                message = f"worker {worker.url}: stream cut: {exc}"
                error = error_body(message, "upstream_error", "worker_stream_cut")
                event = b"data: " + error + b"\n\ndata: [DONE]\n\n"
                ex.responded = True
                await send({"type": "http.response.body", "body": event, "more_body": False})
            return None
        except asyncio.CancelledError:
            status_label = "client_disconnect" if ex.client_gone else "cancelled"
            raise
        except ClientGone:  # during a streamed upload
            status_label = "client_disconnect"
            raise
        finally:
            if conn is not None:
                conn.abort()
            self.release(ex, worker, booking, status_label)

    def _failed(self, ex: Exchange, worker: Worker, exc: Exception) -> tuple[str, RouterError]:
        """An exchange with ``worker`` failed before any byte reached the client: count it,
        and the outcome's label and the error (a 504 is the answer; the others are retried
        on another worker). Connect errors and timeouts count against the worker's circuit
        now; a reset is held until the request's outcome is known (:meth:`settle`)."""
        stats = worker.stats
        if isinstance(exc, ConnectFailed):
            stats.count(stats.upstream_errors, "connect")
            self.pool.record_failure(worker, str(exc), request=True)
            return "connect_error", BadGateway(str(exc), code="connect_error")
        if isinstance(exc, ReadTimeout):
            stats.count(stats.upstream_errors, "timeout")
            prefill = _kv_pending(ex, worker)
            self.pool.record_failure(prefill or worker, "read timeout", request=True)
            waiting = f" (waiting for {prefill.url}'s KV)" if prefill is not None else ""
            return "504", GatewayTimeout(f"worker {worker.url} sent nothing in time{waiting}")
        stats.count(stats.upstream_errors, "reset")
        ex.failures.append((worker, str(exc)))
        return "reset", BadGateway(f"worker {worker.url}: {exc}", code="worker_reset")

    def _may_retry(self, ex: Exchange, worker: Worker) -> bool:
        """Whether ``worker``'s 5xx may be retried rather than relayed: another worker of
        its side is left, or it is an SGLang decode leg whose prefill leg may yet fail (then
        the prefill worker is replaced: :meth:`_sglang_pair`)."""
        return self._others_left(ex, worker) or _kv_pending(ex, worker) is not None

    def _others_left(self, ex: Exchange, worker: Worker) -> bool:
        """Whether a healthy worker of ``worker``'s side (decode, or not) not tried yet
        remains (else a 5xx is the answer)."""
        decode = worker.role == DECODE
        return any(
            w.state.healthy and w not in ex.tried and (w.role == DECODE) == decode
            for w in self.pool.workers
        )

    # ---- disaggregated serving (router/proxy/disagg.py) ----------------------------------

    async def _disaggregated(
        self, ex: Exchange, prefill: Worker, pick, send, respond: Respond, final: bool
    ) -> RouterError | None:
        """Serve ``ex`` on ``prefill`` and a decode worker, by the engines' protocol; a
        RouterError to retry on another prefill worker, None when the client was answered.
        An endpoint the protocol does not split goes to ``prefill`` as it is."""
        protocol = protocol_of(self.settings, prefill)
        if ex.endpoint not in DISAGGREGATED[protocol] or ex.body_rest is not None:
            return await self._attempt(ex, prefill, pick, send, respond, final)
        fields = ex.request.body
        if ex.drop_usage_chunk:  # the usage the router asked the worker for, as in ex.body
            fields = asking_usage(fields)
        table = self.pool.stats.disaggregated
        try:
            if protocol == VLLM:
                error = await self._vllm_pair(ex, prefill, pick, fields, send, respond)
            else:
                error = await self._sglang_pair(ex, prefill, pick, fields, send, respond)
        except RouterError as exc:
            table[protocol, exc.code] = table.get((protocol, exc.code), 0) + 1
            raise
        outcome = "ok" if error is None else error.code
        table[protocol, outcome] = table.get((protocol, outcome), 0) + 1
        return error

    async def _vllm_pair(
        self, ex: Exchange, prefill: Worker, pick, fields: dict, send, respond
    ) -> RouterError | None:
        """vLLM: the prefill leg, then its ``kv_transfer_params`` with the request to a
        decode worker. A decode worker that fails before any byte is retried on another one
        after a new prefill leg on the same prefill worker (the first decode may have pulled
        the KV already; the prefix is cached there now, so the leg costs little)."""
        attempts = self.settings.max_attempts
        last_error: RouterError | None = None
        prefill_body = vllm_prefill_body(fields)
        for attempt in range(attempts):
            decode, decode_pick = self.choose(ex, last_error, decode=True)
            ex.tried.remove(decode)  # (chosen first: no prefill leg without a decode worker)
            headers = with_request_id(ex.headers, attempt)
            answer = await self._prefill_leg(
                ex, prefill, pick, prefill_body, headers, kv=kv_transfer_params
            )
            if isinstance(answer, GatewayTimeout):
                raise answer  # as for any request: nothing in time from a worker is a 504
            if isinstance(answer, RouterError):
                return answer  # another prefill worker
            status, response_headers, data, params = answer
            self.metrics.prefill_leg(VLLM).observe(time.perf_counter() - ex.start)
            if status != 200:  # the request's own fault (a 4xx): the client's answer
                ex.started = ex.responded = True
                headers_out = self._response_headers(response_headers, prefill, False)
                await respond(status, headers_out, data, False)
                return None
            # none: a connector that finds the KV by the prompt (the answer said null)
            extra = {"kv_transfer_params": params} if params else {}
            ex.tried.append(decode)
            error = await self._attempt(
                ex, decode, decode_pick, send, respond, attempt == attempts - 1,
                with_fields(fields, **extra), headers,
            )  # fmt: skip
            if error is None:
                return None
            last_error = error
        raise last_error  # type: ignore[misc]

    async def _sglang_pair(
        self, ex: Exchange, prefill: Worker, pick, fields: dict, send, respond
    ) -> RouterError | None:
        """SGLang: the prefill and the decode leg at once, in a fresh bootstrap room; a
        decode worker that fails before any byte is retried (another one, another room); a
        prefill leg that fails first cancels the decode leg and is retried elsewhere. A
        decode that fails while its prefill leg runs waits ``PREFILL_NEWS_S`` for that leg:
        if it fails too, the prefill worker is the one to blame and to replace."""
        attempts = self.settings.max_attempts
        last_error: RouterError | None = None
        for attempt in range(attempts):
            decode, decode_pick = self.choose(ex, last_error, decode=True)
            body = with_fields(fields, **bootstrap_fields(prefill))
            headers = with_request_id(ex.headers, attempt)
            leg = asyncio.get_running_loop().create_task(
                self._prefill_leg(ex, prefill, pick, body, headers, on_error=ex.leg_failed)
            )
            ex.kv_from = (prefill, leg)
            try:
                error = await self._attempt(
                    ex, decode, decode_pick, send, respond, attempt == attempts - 1, body,
                    headers,
                )  # fmt: skip
                if error is not None and not leg.done():
                    await asyncio.wait((leg,), timeout=PREFILL_NEWS_S)  # (its failure cancels)
            except asyncio.CancelledError:
                failed = ex.leg_error
                if failed is None or ex.client_gone:
                    raise
                ex.leg_error = None
                ex.task.uncancel()  # type: ignore[union-attr]
                # not the decode worker's fault: it may take the next pair
                ex.failures = [(w, why) for w, why in ex.failures if w is not decode]
                if isinstance(failed, GatewayTimeout):
                    raise failed from None
                ex.tried.remove(decode)
                return failed  # the prefill worker failed: another one, from the start
            finally:
                ex.kv_from = None
                if not leg.done():
                    if ex.started:  # the decode answered: its prefill is done, or will be
                        await asyncio.shield(leg)
                    else:
                        leg.cancel()
                        await asyncio.gather(leg, return_exceptions=True)
            answer = leg.result() if not leg.cancelled() else None
            if error is None:
                if not isinstance(answer, RouterError):
                    self.metrics.prefill_leg(SGLANG).observe(time.perf_counter() - ex.start)
                return None
            if isinstance(answer, RouterError):
                # both failed, the decode leg most likely for want of the prefill's KV: the
                # prefill worker is retried, the decode worker is not blamed
                ex.tried.remove(decode)
                ex.failures = [(w, why) for w, why in ex.failures if w is not decode]
                return answer
            last_error = error
        raise last_error  # type: ignore[misc]

    async def _prefill_leg(
        self,
        ex: Exchange,
        worker: Worker,
        pick,
        body: bytes,
        headers: bytes,
        on_error: Callable[[RouterError], None] | None = None,
        kv: Callable[[bytes], dict | None] | None = None,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict | None] | RouterError:
        """Send ``body`` to the prefill worker and read its whole answer (status, headers,
        body, and what ``kv`` reads in a 200: vLLM's ``kv_transfer_params``); a 5xx, or with
        ``kv`` an answer below 400 that is no prefill result, is a RouterError to retry
        elsewhere, the worker's failure (held as a 5xx is). Its cached tokens are the truth
        the prefill workers' shadows learn from. ``on_error`` hears a failure as it
        happens (the SGLang decode leg waits for this one)."""
        booking = self.book(ex, worker, pick, radix_later=True, max_tokens=1)
        conn: Connection | None = None
        label = "upstream_lost"
        try:
            try:
                conn = await worker.upstream.request(
                    ex.method, ex.path, headers, body, self.read_timeout, booking.insert_radix
                )
                status, response_headers = conn.status, conn.headers
                parts: list[bytes] = []
                size, more = 0, True
                while more:
                    data, more = await conn.read(self.read_timeout)
                    size += len(data)
                    if size <= MAX_SCANNED_BODY:
                        parts.append(data)
                conn.release()
                conn = None
            except (ConnectFailed, ConnectionLost, ReadTimeout) as exc:
                label, error = self._failed(ex, worker, exc)
                if on_error is not None:
                    on_error(error)
                return error
            booking.first_token()
            label = str(status)
            if status >= 500:
                worker.stats.count(worker.stats.upstream_errors, "status_5xx")
                ex.failures.append((worker, f"HTTP {status}"))
                error = BadGateway(
                    f"prefill worker {worker.url} answered {status}", code="worker_5xx"
                )
                if on_error is not None:
                    on_error(error)
                return error
            data = b"".join(parts)
            params = None
            if kv is not None and not 400 <= status < 500:  # (a 4xx is the request's)
                try:
                    params = _prefill_result(kv, status, data, size)
                except BadPrefillAnswer as exc:
                    label = "bad_response"
                    return self._bad_prefill(ex, worker, str(exc))
            self.answered(ex, worker, status)
            usage = stream_usage(data) if data.startswith(b"data:") else scan_body(data)
            if usage is not None:
                self.report(ex, worker, booking, usage)
            return status, response_headers, data, params
        finally:
            if conn is not None:
                conn.abort()
            self.release(ex, worker, booking, label)

    def _bad_prefill(self, ex: Exchange, worker: Worker, why: str) -> RouterError:
        """A vLLM prefill worker's answer that is no prefill result: held like a 5xx (its
        failure, unless the request fails alike elsewhere), retried on another one."""
        stats = worker.stats
        stats.count(stats.upstream_errors, "bad_response")
        ex.failures.append((worker, f"bad prefill answer: {why}"))
        message = f"prefill worker {worker.url} gave no usable prefill answer: {why}"
        return BadGateway(message, code="bad_prefill_response")

    def _response_headers(
        self, upstream: list[tuple[bytes, bytes]], worker: Worker, transformed: bool
    ) -> list[tuple[bytes, bytes]]:
        headers = [
            (name, value)
            for name, value in upstream
            if name not in HOP_BY_HOP and not (transformed and name == b"content-length")
        ]
        if self.worker_header:
            headers.append((b"x-cache-router-worker", worker.url.encode()))
        return headers


def _prefill_result(
    kv: Callable[[bytes], dict | None], status: int, data: bytes, size: int
) -> dict | None:
    """What ``kv`` reads in a prefill worker's answer below 400, which must be a 200 read
    whole; BadPrefillAnswer otherwise."""
    if status != 200:
        raise BadPrefillAnswer(f"it answered {status}")
    if size > MAX_SCANNED_BODY:
        raise BadPrefillAnswer(f"its body exceeds {MAX_SCANNED_BODY} bytes")
    return kv(data)


def asking_usage(body: dict) -> dict:
    """``body`` asking for the usage chunk at the end of its stream (where the cached tokens
    are reported), its other stream options kept."""
    options = body.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**body, "stream_options": options}


async def asgi_respond(
    send, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more_body: bool
) -> None:
    """Start the response and send its first body piece, as two ASGI messages (what
    :meth:`router.proxy.server.RouterCycle.respond` does in one write under our server)."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


def _kv_pending(ex: Exchange, worker: Worker) -> Worker | None:
    """The prefill worker whose KV ``worker`` waits for: an SGLang decode leg's, while that
    prefill leg has not answered (a decode that sent nothing in time, or failed, may have
    failed for want of it); None otherwise."""
    pending = ex.kv_from
    if worker.role == DECODE and pending is not None and not pending[1].done():
        return pending[0]
    return None


async def _held_whole(conn: Connection, data: bytes, timeout: float) -> tuple[bytes, bool]:
    """A body that is not an event stream, read whole (up to ``MAX_SCANNED_BODY``; past
    that it goes on piece by piece) before any byte of it goes to the client: a worker that
    cuts it is then retried like one that sent nothing, and a client never gets half a
    JSON answer under a 200."""
    parts, size, more = [data], len(data), True
    while more and size <= MAX_SCANNED_BODY:
        data, more = await conn.read(timeout)
        parts.append(data)
        size += len(data)
    return b"".join(parts), more


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-type":
            return value.startswith(b"text/event-stream")
    return False


class BodyStream:
    """The rest of a request body, piece by piece as the client sends it: ``max_body_bytes``
    still holds (413), a disconnect is :class:`ClientGone`."""

    def __init__(self, receive, size: int, limit: int) -> None:
        self.receive = receive
        self.size = size
        self.limit = limit
        self.started = False  # a piece was read: the body cannot be sent again
        self.done = False

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes:
        if self.done:
            raise StopAsyncIteration
        self.started = True
        message = await self.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(f"request body exceeds {self.limit} bytes")
        self.done = not message.get("more_body", False)
        return chunk


async def open_body(receive, limit: int, peek: int) -> tuple[bytes, BodyStream | None]:
    """The body's first ``peek`` bytes or more (all of it if shorter), and a stream of the
    rest (None when there is none)."""
    parts: list[bytes] = []
    size = 0
    while size < peek:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        if not message.get("more_body", False):
            return b"".join(parts), None
    return b"".join(parts), BodyStream(receive, size, limit)


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; 413 past ``limit`` bytes, ClientGone on a disconnect."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)

"""One try of a request on one worker: book, send, read the answer, pass it to the client,
report and release. Until a byte has gone to the client a connect error, a reset or a 5xx
is an error to retry elsewhere (:class:`~router.proxy.forward.Forwarder` decides); a timeout
is the answer (504). Connect errors and timeouts count against the worker's circuit now;
resets and 5xx answers are held on the request until its outcome is known
(:meth:`~router.core.routing.RouterCore.settle`)."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from policies.base import Pick
from router.core.errors import (
    BadGateway,
    GatewayTimeout,
    RouterError,
    error_body,
    shutting_down,
)
from router.core.routing import RouterCore
from router.core.usage import MAX_SCANNED_BODY, UsageReader, asking_usage
from router.fleet.pool import DECODE, Worker, same_side
from router.fleet.upstream import ConnectFailed, Connection, ConnectionLost, ReadTimeout
from router.proxy.exchange import Exchange, Respond, is_event_stream, response_headers
from router.service.body import ClientGone

log = logging.getLogger("cache_router.forward")


class Attempts:
    """Tries a request on a worker, for the forwarder and both legs of a disaggregated
    pair."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.read_timeout = core.settings.read_timeout_s
        self.name_worker = bool(core.settings.worker_header)

    async def run(
        self,
        ex: Exchange,
        worker: Worker,
        pick: Pick,
        send,
        respond: Respond,
        final: bool,
        body: bytes | None = None,
        headers: bytes | None = None,
    ) -> RouterError | None:
        """One try on ``worker``; a RouterError to retry, None when the client was answered.
        ``body``, ``headers``: what the worker gets instead of ``ex.body`` and ``ex.headers``
        (a disaggregated decode leg)."""
        core = self.core
        booking = core.book(ex, worker, pick, radix_later=True)
        key = slot = claim = None
        if body is None:
            body, headers = ex.body, ex.headers
            key = core.order_key(ex, worker, booking)
            if key is not None and core.settings.engine_priority:  # the engine's order added
                fields = ex.request.body  # as in ex.body: with the usage the router asked for
                if ex.drop_usage_chunk:
                    fields = asking_usage(fields)
                body = orjson.dumps({**fields, "priority": key})
                claim = core.engine_claim(worker, booking, key)
        conn: Connection | None = None
        status_label = "upstream_lost"
        sse = False
        try:
            slot = core.hold_enter(ex, worker, booking, key)
            if slot is not None:
                await core.hold_wait(slot)  # room on the worker, in the router's order
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
                if conn.status >= 500 and not final and self.may_retry(ex, worker):
                    status_label = str(conn.status)
                    return self.server_error(ex, worker, conn.status, "worker")
                data, more = await conn.read(self.read_timeout)
                if more and not is_event_stream(conn.headers):
                    data, more = await held_whole(conn, data, self.read_timeout)
            except (ConnectFailed, ConnectionLost, ReadTimeout) as exc:
                status_label, error = self.failed(ex, worker, exc)
                if isinstance(error, GatewayTimeout):
                    raise error from None
                return error

            # first body bytes (or the whole body): the prefill is done
            booking.first_token()
            core.hold_leave(slot)
            core.engine_unclaim(worker, claim)
            core.metrics.ttfb(ex.endpoint).observe(time.perf_counter() - ex.start)
            status = conn.status
            core.answered(ex, worker, status)  # (a 5xx relayed: no other worker left)
            ids = core.owner_reader(ex, status)
            if ids is not None:
                ids = core.learn_owner(ids, data, worker)
            sse = ex.request.stream and is_event_stream(conn.headers)
            reader = UsageReader(sse, ex.drop_usage_chunk, status < 300)
            headers_out = response_headers(conn.headers, worker, sse, self.name_worker)
            data = reader.feed(data, not more)
            status_label = str(status)
            ex.started = True
            if not more:
                ex.responded = True
            await respond(status, headers_out, data, more)
            while more:
                data, more = await conn.read(self.read_timeout)
                if ex.client_gone:
                    raise asyncio.CancelledError
                if ids is not None:  # until the id is whole (it comes first)
                    ids = core.learn_owner(ids, data, worker)
                data = reader.feed(data, not more)
                if not more:
                    ex.responded = True
                if data or not more:
                    await send({"type": "http.response.body", "body": data, "more_body": more})
            conn.release()
            conn = None
            usage = reader.usage()
            if usage is not None and worker.role != DECODE:
                core.report(ex, worker, booking, usage)
            return None
        except (ConnectionLost, ReadTimeout) as exc:
            # after bytes reached the client: never retried, the stream is cut
            status_label = "upstream_lost"
            await self.cut(ex, worker, exc, sse, send)
            return None
        except asyncio.CancelledError:
            if ex.client_gone:
                status_label = "client_disconnect"
            elif self.core.drain_over:  # the server cut it at the drain's end
                status_label = "shutdown"
                if sse and not ex.responded:
                    message = "the router is shutting down: the stream was cut"
                    await end_stream(send, shutting_down(message).body())
                    ex.responded = True
            else:
                status_label = "cancelled"
            raise
        except ClientGone:  # during a streamed upload
            status_label = "client_disconnect"
            raise
        finally:
            if conn is not None:
                conn.abort()
            core.hold_leave(slot)
            core.engine_unclaim(worker, claim)
            core.release(ex, worker, booking, status_label)

    async def cut(self, ex: Exchange, worker: Worker, exc: Exception, sse: bool, send) -> None:
        """The worker's answer broke off after bytes reached the client: its failure; an
        event stream ends with an error event, as vLLM ends a failed stream (a plain body
        cannot say it: its connection is closed, short)."""
        kind = "timeout" if isinstance(exc, ReadTimeout) else "reset"
        worker.stats.count(worker.stats.upstream_errors, kind)
        self.core.pool.record_failure(worker, f"stream cut: {exc}", request=True)
        log.warning("stream from %s cut: %s", worker.url, exc)
        if sse and not ex.client_gone:
            message = f"worker {worker.url}: stream cut: {exc}"
            ex.responded = True
            await end_stream(send, error_body(message, "upstream_error", "worker_stream_cut"))

    @staticmethod
    def server_error(ex: Exchange, worker: Worker, status: int, who: str) -> RouterError:
        """``worker``'s 5xx, to retry elsewhere: counted, and held on ``ex`` as its failure
        until the request's outcome is known; ``who``: how the message names the worker."""
        worker.stats.count(worker.stats.upstream_errors, "status_5xx")
        ex.failures.append((worker, f"HTTP {status}"))
        return BadGateway(f"{who} {worker.url} answered {status}", code="worker_5xx")

    def failed(self, ex: Exchange, worker: Worker, exc: Exception) -> tuple[str, RouterError]:
        """An exchange with ``worker`` failed before any byte reached the client: count it,
        and the outcome's label and the error (a 504 is the answer; the others are retried
        on another worker)."""
        stats = worker.stats
        pool = self.core.pool
        if isinstance(exc, ConnectFailed):
            stats.count(stats.upstream_errors, "connect")
            pool.record_failure(worker, str(exc), request=True)
            return "connect_error", BadGateway(str(exc), code="connect_error")
        if isinstance(exc, ReadTimeout):
            stats.count(stats.upstream_errors, "timeout")
            prefill = ex.kv_pending(worker)
            if prefill is None:
                pool.record_failure(worker, "read timeout", request=True)
            # else an SGLang decode leg waiting for the KV: its prefill leg's own outcome
            # says whose fault it is (SglangPair.run, once that leg is over)
            waiting = f" (waiting for {prefill.url}'s KV)" if prefill is not None else ""
            return "504", GatewayTimeout(f"worker {worker.url} sent nothing in time{waiting}")
        stats.count(stats.upstream_errors, "reset")
        ex.failures.append((worker, str(exc)))
        return "reset", BadGateway(f"worker {worker.url}: {exc}", code="worker_reset")

    def may_retry(self, ex: Exchange, worker: Worker) -> bool:
        """Whether ``worker``'s 5xx may be retried rather than relayed: a healthy worker of
        its side not tried yet remains, or it is an SGLang decode leg whose prefill leg may
        yet fail (then the prefill worker is replaced)."""
        return (
            any(
                w is not worker and w.state.healthy and w not in ex.tried and same_side(w, worker)
                for w in self.core.pool.workers
            )
            or ex.kv_pending(worker) is not None
        )


async def end_stream(send, error: bytes) -> None:
    """End an event stream under way with ``error`` as its last event, as vLLM ends a
    failed stream (then ``[DONE]``)."""
    event = b"data: " + error + b"\n\ndata: [DONE]\n\n"
    await send({"type": "http.response.body", "body": event, "more_body": False})


async def held_whole(conn: Connection, data: bytes, timeout: float) -> tuple[bytes, bool]:
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

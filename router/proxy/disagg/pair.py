"""What both protocols' pairs share: the prefill leg (book, send, read the whole answer,
report, release) and how a prefill worker's unusable answer is counted."""

from __future__ import annotations

from collections.abc import Callable

from policies.base import Pick
from router.core.errors import BadGateway, RouterError
from router.core.usage import MAX_SCANNED_BODY, UsageReader
from router.fleet.pool import Worker
from router.fleet.upstream import ConnectFailed, Connection, ConnectionLost, ReadTimeout
from router.proxy.attempt import Attempts
from router.proxy.disagg.protocol import BadPrefillAnswer
from router.proxy.exchange import Exchange

# a prefill leg's answer: status, headers, body, and what ``kv`` read in it
LegAnswer = tuple[int, list[tuple[bytes, bytes]], bytes, dict | None]


class Pair:
    """A disaggregated request's two legs, by one engine's protocol (a subclass)."""

    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts
        self.core = attempts.core
        self.max_attempts = self.core.settings.max_attempts

    async def prefill_leg(
        self,
        ex: Exchange,
        worker: Worker,
        pick: Pick,
        body: bytes,
        headers: bytes,
        on_error: Callable[[RouterError], None] | None = None,
        kv: Callable[[bytes], dict | None] | None = None,
    ) -> LegAnswer | RouterError:
        """Send ``body`` to the prefill worker and read its whole answer (status, headers,
        body, and what ``kv`` reads in a 200: vLLM's ``kv_transfer_params``); a 5xx, or with
        ``kv`` an answer below 400 that is no prefill result, is a RouterError to retry
        elsewhere, the worker's failure (held as a 5xx is). Its cached tokens are the truth
        the prefill workers' shadows learn from. ``on_error`` hears a failure as it
        happens (the SGLang decode leg waits for this one)."""
        core = self.core
        timeout = self.attempts.read_timeout
        booking = core.book(ex, worker, pick, radix_later=True, max_tokens=1)
        conn: Connection | None = None
        label = "upstream_lost"
        try:
            try:
                conn = await worker.upstream.request(
                    ex.method, ex.path, headers, body, timeout, booking.insert_radix
                )
                status, response_headers = conn.status, conn.headers
                parts: list[bytes] = []
                size, more = 0, True
                while more:
                    data, more = await conn.read(timeout)
                    size += len(data)
                    if size <= MAX_SCANNED_BODY:
                        parts.append(data)
                conn.release()
                conn = None
            except (ConnectFailed, ConnectionLost, ReadTimeout) as exc:
                label, error = self.attempts.failed(ex, worker, exc)
                if on_error is not None:
                    on_error(error)
                return error
            booking.first_token()
            label = str(status)
            if status >= 500:
                error = self.attempts.server_error(ex, worker, status, "prefill worker")
                if on_error is not None:
                    on_error(error)
                return error
            data = b"".join(parts)
            params = None
            if kv is not None and not 400 <= status < 500:  # (a 4xx is the request's)
                try:
                    params = prefill_result(kv, status, data, size)
                except BadPrefillAnswer as exc:
                    label = "bad_response"
                    return self.bad_prefill(ex, worker, str(exc))
            core.answered(ex, worker, status)
            reader = UsageReader(data.startswith(b"data:"), False, True)
            reader.feed(data, True)
            usage = reader.usage()
            if usage is not None:
                core.report(ex, worker, booking, usage)
            return status, response_headers, data, params
        finally:
            if conn is not None:
                conn.abort()
            core.release(ex, worker, booking, label)

    @staticmethod
    def bad_prefill(ex: Exchange, worker: Worker, why: str) -> RouterError:
        """A vLLM prefill worker's answer that is no prefill result: held like a 5xx (its
        failure, unless the request fails alike elsewhere), retried on another one."""
        stats = worker.stats
        stats.count(stats.upstream_errors, "bad_response")
        ex.failures.append((worker, f"bad prefill answer: {why}"))
        message = f"prefill worker {worker.url} gave no usable prefill answer: {why}"
        return BadGateway(message, code="bad_prefill_response")


def prefill_result(
    kv: Callable[[bytes], dict | None], status: int, data: bytes, size: int
) -> dict | None:
    """What ``kv`` reads in a prefill worker's answer below 400, which must be a 200 read
    whole; BadPrefillAnswer otherwise."""
    if status != 200:
        raise BadPrefillAnswer(f"it answered {status}")
    if size > MAX_SCANNED_BODY:
        raise BadPrefillAnswer(f"its body exceeds {MAX_SCANNED_BODY} bytes")
    return kv(data)

"""SGLang's pair: the prefill and the decode leg at once, in a fresh bootstrap room
(:mod:`router.proxy.disagg.protocol`)."""

from __future__ import annotations

import asyncio
import time

from policies.base import Pick
from router.core.errors import GatewayTimeout, RouterError
from router.fleet.pool import Worker
from router.proxy.disagg.pair import Pair
from router.proxy.disagg.protocol import SGLANG, bootstrap_fields, with_fields, with_request_id
from router.proxy.exchange import Exchange, Respond

# how long an SGLang decode leg's failure waits for news of its prefill leg: a decode that
# failed for want of the prefill's KV fails about when the prefill does
PREFILL_NEWS_S = 0.1


class SglangPair(Pair):
    """A decode worker that fails before any byte is retried (another one, another room);
    a prefill leg that fails first cancels the decode leg and is retried elsewhere. A
    decode that fails while its prefill leg runs waits ``PREFILL_NEWS_S`` for that leg: if
    it fails too, the prefill worker is the one to blame and to replace. A decode that
    times out while its prefill leg runs is a 504 once that leg is over: whichever of the
    two failed on its own is counted (:meth:`blame_timeout`)."""

    async def run(
        self, ex: Exchange, prefill: Worker, pick: Pick, fields: dict, send, respond: Respond
    ) -> RouterError | None:
        """Serve ``ex``; a RouterError to retry on another prefill worker, None when the
        client was answered."""
        last_error: RouterError | None = None
        for attempt in range(self.max_attempts):
            decode, decode_pick = self.core.choose(ex, last_error, decode=True)
            body = with_fields(fields, **bootstrap_fields(prefill))
            headers = with_request_id(ex.headers, attempt)
            leg = asyncio.get_running_loop().create_task(
                self.prefill_leg(ex, prefill, pick, body, headers, on_error=ex.leg_failed)
            )
            ex.kv_from = (prefill, leg)
            final = attempt == self.max_attempts - 1
            try:
                try:
                    error = await self.attempts.run(
                        ex, decode, decode_pick, send, respond, final, body, headers
                    )
                except GatewayTimeout:
                    if not leg.done():  # (then the timeout was counted against nobody yet)
                        await self.blame_timeout(ex, decode, leg)
                    raise
                if error is not None and not leg.done():
                    await asyncio.wait((leg,), timeout=PREFILL_NEWS_S)  # (its failure cancels)
            except asyncio.CancelledError:
                failed = ex.leg_error
                if failed is None or ex.client_gone:
                    raise
                ex.leg_error = None
                ex.task.uncancel()  # type: ignore[union-attr]
                unblame(ex, decode)
                if isinstance(failed, GatewayTimeout):
                    raise failed from None
                return failed  # the prefill worker failed: another one, from the start
            finally:
                ex.kv_from = None
                await settle_leg(ex, leg)
            answer = leg.result() if not leg.cancelled() else None
            if error is None:
                if not isinstance(answer, RouterError):
                    self.core.metrics.prefill_leg(SGLANG).observe(time.perf_counter() - ex.start)
                return None
            if isinstance(answer, RouterError):
                # both failed, the decode leg most likely for want of the prefill's KV: the
                # prefill worker is retried, the decode worker is not blamed
                unblame(ex, decode)
                return answer
            ex.tried.append(decode)  # its own failure: another decode worker next
            last_error = error
        raise last_error  # type: ignore[misc]

    async def blame_timeout(self, ex: Exchange, decode: Worker, leg: asyncio.Task) -> None:
        """The decode leg sent nothing in time while its prefill leg had not answered: it
        may have waited for the KV, or failed on its own. The prefill leg runs to its end
        (its own read timeout bounds it), not cancelled: a prefill that fails is counted
        for its own failure, one that answers leaves the timeout to the decode worker. (A
        prefill leg cancelled once blamed would be counted for a failure never its own.)"""
        ex.kv_from = None  # no decode leg waits on it now: its failure cancels nothing
        await asyncio.wait((leg,))
        if not isinstance(leg.result(), RouterError):
            self.core.pool.record_failure(decode, "read timeout", request=True)


def unblame(ex: Exchange, decode: Worker) -> None:
    """The decode leg failed for want of its prefill's KV: not its fault, so the failures
    held against it go (it may take the next pair)."""
    ex.failures = [(w, why) for w, why in ex.failures if w is not decode]


async def settle_leg(ex: Exchange, leg: asyncio.Task) -> None:
    """The prefill leg when its decode leg is over: left to finish when the decode answered
    (its prefill is done, or will be), else cancelled."""
    if leg.done():
        return
    if ex.started:
        await asyncio.shield(leg)
    else:
        leg.cancel()
        await asyncio.gather(leg, return_exceptions=True)

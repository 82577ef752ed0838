"""vLLM's pair: the prefill leg, then its ``kv_transfer_params`` with the request to a decode
worker (:mod:`router.proxy.disagg.protocol`)."""

from __future__ import annotations

import time

from policies.base import Pick
from router.core.errors import GatewayTimeout, RouterError
from router.fleet.pool import Worker
from router.proxy.disagg.pair import Pair
from router.proxy.disagg.protocol import (
    VLLM,
    kv_transfer_params,
    vllm_prefill_body,
    with_fields,
    with_request_id,
)
from router.proxy.exchange import Exchange, Respond, response_headers


class VllmPair(Pair):
    """A decode worker that fails before any byte is retried on another one after a new
    prefill leg on the same prefill worker (the first decode may have pulled the KV
    already; the prefix is cached there now, so the leg costs little)."""

    async def run(
        self, ex: Exchange, prefill: Worker, pick: Pick, fields: dict, send, respond: Respond
    ) -> RouterError | None:
        """Serve ``ex``; a RouterError to retry on another prefill worker, None when the
        client was answered."""
        core = self.core
        last_error: RouterError | None = None
        prefill_body = vllm_prefill_body(fields)
        for attempt in range(self.max_attempts):
            # chosen first: no prefill leg without a decode worker
            decode, decode_pick = core.choose(ex, last_error, decode=True)
            headers = with_request_id(ex.headers, attempt)
            answer = await self.prefill_leg(
                ex, prefill, pick, prefill_body, headers, kv=kv_transfer_params
            )
            if isinstance(answer, GatewayTimeout):
                raise answer  # as for any request: nothing in time from a worker is a 504
            if isinstance(answer, RouterError):
                return answer  # another prefill worker
            status, upstream_headers, data, params = answer
            core.metrics.prefill_leg(VLLM).observe(time.perf_counter() - ex.start)
            if status != 200:  # the request's own fault (a 4xx): the client's answer
                ex.started = ex.responded = True
                out = response_headers(upstream_headers, prefill, False, self.attempts.name_worker)
                await respond(status, out, data, False)
                return None
            # none: a connector that finds the KV by the prompt (the answer said null)
            extra = {"kv_transfer_params": params} if params else {}
            ex.tried.append(decode)
            error = await self.attempts.run(
                ex, decode, decode_pick, send, respond, attempt == self.max_attempts - 1,
                with_fields(fields, **extra), headers,
            )  # fmt: skip
            if error is None:
                return None
            last_error = error
        raise last_error  # type: ignore[misc]

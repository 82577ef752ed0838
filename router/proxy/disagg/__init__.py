"""Disaggregated serving: a request the picker sends to a prefill worker
(:data:`router.fleet.pool.PREFILL`) is served by two workers, each leg as its engine's
protocol defines it (:mod:`.protocol`: what goes in each leg's body; :mod:`.vllm` and
:mod:`.sglang`: the order of the legs, their retries and whom a failure is counted against;
:mod:`.pair`: the prefill leg both share)."""

from __future__ import annotations

from policies.base import Pick
from router.core.errors import RouterError
from router.fleet.pool import Worker
from router.proxy.attempt import Attempts
from router.proxy.disagg.protocol import DISAGGREGATED, SGLANG, VLLM, protocol_of
from router.proxy.disagg.sglang import SglangPair
from router.proxy.disagg.vllm import VllmPair
from router.proxy.exchange import Exchange, Respond


class Disaggregation:
    """Serves a request prefilled on a given worker by its protocol's pair."""

    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts
        self.core = attempts.core
        self.pairs = {VLLM: VllmPair(attempts), SGLANG: SglangPair(attempts)}

    async def run(
        self, ex: Exchange, prefill: Worker, pick: Pick, fields: dict, send,
        respond: Respond, final: bool,
    ) -> RouterError | None:  # fmt: skip
        """Serve ``ex`` (whose worker body is ``fields``) on ``prefill`` and a decode
        worker; a RouterError to retry on another prefill worker, None when the client was
        answered. An endpoint the protocol does not split goes to ``prefill`` as it is."""
        protocol = protocol_of(self.core.settings, prefill)
        if ex.endpoint not in DISAGGREGATED[protocol] or ex.body_rest is not None:
            return await self.attempts.run(ex, prefill, pick, send, respond, final)
        table = self.core.pool.stats.disaggregated
        try:
            error = await self.pairs[protocol].run(ex, prefill, pick, fields, send, respond)
        except RouterError as exc:
            table[protocol, exc.code] = table.get((protocol, exc.code), 0) + 1
            raise
        outcome = "ok" if error is None else error.code
        table[protocol, outcome] = table.get((protocol, outcome), 0) + 1
        return error

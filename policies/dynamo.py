"""dynamo: NVIDIA Dynamo's KV router, approximate mode, classic cost.

Follows ai-dynamo/dynamo ``lib/llm/src/kv_router`` / ``lib/kv-router`` as read 2026-11 (the
spec's section 2; the newer tiered ``credit`` formula equals this one on one tier). Each
healthy worker ``w`` is priced in blocks of ``B`` tokens:

    prefill_tokens_w = active_prefill_tokens_w + (ISL - o_w * B)
    decode_blocks_w  = |active_blocks_w| + |request blocks not already active on w|
    cost_w           = overlap_score_weight * prefill_tokens_w / B + decode_blocks_w

and the cheapest wins (temperature 0, the default; ties at random). With a temperature
``T > 0`` the worker is drawn with ``p_w ~ exp(-(c_w - c_min) / ((c_max - c_min) * T))``.

- ``o_w``: consecutive blocks of the request, from its start, that the router's own past
  decisions put on ``w`` within the last ``ttl_s`` (120 s): approximate mode, Dynamo's
  setting without KV events. The request's blocks are recorded for the chosen worker at
  pick time, each (re)starting its TTL.
- ActiveSequences, Dynamo's per-worker state of in-flight requests (add on route, prefill
  done at first token, free at completion), is the router's booked state, which follows the
  same lifecycle in the proxy and the simulator (:mod:`policies.peer_views`):
  ``active_prefill_tokens_w`` is the view's ``pending_prefill_tokens`` (booked at dispatch,
  released at the first token) and ``active_blocks_w`` the block shadow's pinned blocks
  (pinned at dispatch, released at completion). So the picker needs no lifecycle hooks.

Modelling choices and deviations:

- ``B`` is our block (the request's ``block_size``, 512 tokens in traces), not the engine's
  KV block (16 or 64): both cost terms are in blocks, so the scale cancels out of the
  argmin but for rounding; overlaps are whole blocks of ours.
- The prefill Dynamo books for a request is ``ISL - o*B`` with its own overlap; the booked
  state books ``ISL -`` the router's estimated hit (its shadow, or its KV-event index),
  which is what ``active_prefill_tokens`` then holds for requests routed earlier.
- ``ISL - o_w * B`` is floored at 0 (a trailing partial block can make it negative).
- The TTL runs on ``request.arrival`` (the simulator's virtual time) when set, else on
  :attr:`DynamoPicker.clock` (``time.monotonic``, the clock the proxy books with); entries
  expire lazily, at the next pick.
- Dynamo's radix index from KV events (its precise mode) is not modelled here;
  :mod:`policies.llmd_precise` covers routing on the workers' events.
- Random draws come from the picker's seeded generator (``seed``).

Branches: ``cost`` (one cheapest worker), ``cost_tie`` (drawn among equal costs),
``sampled`` (temperature > 0).
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from policies.base import BlockShadow, Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.peer_views import active_blocks, new_active_blocks

OVERLAP_SCORE_WEIGHT = 1.0
TTL_S = 120.0
"""How long approximate mode trusts a routing decision to have left its blocks cached."""


class ApproxIndex:
    """One worker's blocks from past decisions, each with an expiry; oldest expiry first."""

    __slots__ = ("_expiry",)

    def __init__(self) -> None:
        self._expiry: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def expire(self, now: float) -> None:
        expiry = self._expiry
        while expiry and next(iter(expiry.values())) <= now:
            expiry.popitem(last=False)

    def overlap(self, blocks: Sequence[int]) -> int:
        """Consecutive ``blocks`` from the start that are held (call :meth:`expire` first)."""
        held = self._expiry
        n = 0
        for block in blocks:
            if block not in held:
                break
            n += 1
        return n

    def add(self, blocks: Sequence[int], until: float) -> None:
        expiry = self._expiry
        for block in blocks:
            expiry[block] = until
            expiry.move_to_end(block)


class DynamoPicker:
    """argmin of ``w * prefill_blocks + decode_blocks``, overlap from its own decisions."""

    name = "dynamo"
    needs = (BlockShadow,)
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        *,
        overlap_score_weight: float = OVERLAP_SCORE_WEIGHT,
        temperature: float = 0.0,
        ttl_s: float = TTL_S,
        seed: int | None = 0,
    ) -> None:
        if overlap_score_weight < 0 or temperature < 0 or ttl_s <= 0:
            raise ValueError("overlap_score_weight and temperature must be >= 0, ttl_s > 0")
        self.overlap_score_weight = overlap_score_weight
        self.temperature = temperature
        self.ttl_s = ttl_s
        self.seed = seed
        self._rng = random.Random(seed)
        self._indexes: list[ApproxIndex] = []

    def costs(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        healthy: list[int],
        now: float,
    ) -> list[float]:
        """Dynamo's cost of each healthy worker (in ``healthy`` order)."""
        indexes = self._indexes
        while len(indexes) < len(workers):
            indexes.append(ApproxIndex())
        size = request.block_size
        blocks = request.blocks
        costs = []
        for i in healthy:
            view = workers[i]
            index = indexes[i]
            index.expire(now)
            overlap = index.overlap(blocks)
            prefill = view.pending_prefill_tokens + max(0, request.input_length - overlap * size)
            decode = active_blocks(view) + new_active_blocks(view, blocks)
            costs.append(self.overlap_score_weight * prefill / size + decode)
        return costs

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        now = request.arrival if request.arrival is not None else self.clock()
        costs = self.costs(request, workers, healthy, now)
        if self.temperature > 0:
            k, branch = self._sample(costs), "sampled"
        else:
            low = min(costs)
            tied = [k for k, cost in enumerate(costs) if cost == low]
            k = tied[self._rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
            branch = "cost_tie" if len(tied) > 1 else "cost"
        chosen = healthy[k]
        if request.blocks:
            self._indexes[chosen].add(request.blocks, now + self.ttl_s)
        return Pick(chosen, branch, hits[chosen], best_hit)

    def _sample(self, costs: list[float]) -> int:
        """Dynamo's softmax over min-max normalised costs (uniform when all are equal)."""
        low, high = min(costs), max(costs)
        if high == low:
            return self._rng.randrange(len(costs))
        scale = (high - low) * self.temperature
        weights = [math.exp(-(c - low) / scale) for c in costs]
        return self._rng.choices(range(len(costs)), weights=weights)[0]

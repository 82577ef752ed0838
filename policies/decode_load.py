"""decode_load: the decode worker of a disaggregated fleet, by running requests and KV held.

A decode worker receives a prompt's KV from a prefill worker and then only decodes: its
prefix cache saves a transfer, not a prefill, so the cache terms that rank prefill workers
mean little here. What slows a decode worker is its batch (each step's time grows with the
running sequences) and what stops it is memory (a full KV cache preempts running requests).
So: among healthy workers whose booked KV (prompt plus expected output of every request
booked there, :attr:`WorkerState.held_tokens`) leaves room for this request, the fewest
running requests, then the least KV held; ties go round-robin, so an idle pool spreads.
When no worker has room, the same order over all of them (the engine queues or preempts).

Branches: ``decode_load`` (one best), ``decode_tie`` (round-robin among equals),
``decode_full`` (no worker had room for the request's KV).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.tiebreak import RoundRobinCounter


class DecodeLoadPicker:
    """Fewest running requests among the workers with KV room, then least KV held."""

    name = "decode_load"
    needs = ()  # the core view alone

    def __init__(self) -> None:
        self._rr = RoundRobinCounter()

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        healthy = [i for i, hit in enumerate(hits) if hit != UNHEALTHY]
        need = request.input_length
        room = [
            i for i in healthy
            if workers[i].held_tokens + need <= workers[i].kv_capacity_tokens
        ]  # fmt: skip
        candidates = room or healthy
        best_key = min((workers[i].num_requests, workers[i].held_tokens) for i in candidates)
        tied = [
            i for i in candidates if (workers[i].num_requests, workers[i].held_tokens) == best_key
        ]
        chosen = tied[0] if len(tied) == 1 else self._rr.choose(tied)
        branch = "decode_full" if not room else "decode_load" if len(tied) == 1 else "decode_tie"
        return Pick(chosen, branch, hits[chosen], best_hit)

"""The one pass every picker starts with: health and estimated cache hit per worker.

``estimate_cache_hit`` is called exactly once per healthy worker per pick and the result is
reused for scoring and for the :class:`~policies.base.Pick` report, whatever the picker, so
the proxy's routing-loss metric (chosen hit vs best hit) means the same for every policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import NoHealthyWorker, RequestFeatures, WorkerView

UNHEALTHY = -1
"""Marker in the hits list for a worker the picker must skip."""


def estimate_hits(request: RequestFeatures, workers: Sequence[WorkerView]) -> tuple[list[int], int]:
    """Estimated hit tokens per worker (``UNHEALTHY`` for unhealthy ones) and the best.

    Raises :class:`NoHealthyWorker` when no worker is healthy (or there are none).
    """
    blocks, tokens = request.blocks, request.tokens
    hits: list[int] = []
    best = UNHEALTHY
    for worker in workers:
        if worker.healthy:
            hit = worker.estimate_cache_hit(blocks, tokens)
            if hit > best:
                best = hit
        else:
            hit = UNHEALTHY
        hits.append(hit)
    if best == UNHEALTHY:
        raise NoHealthyWorker(f"no healthy worker among {len(workers)}")
    return hits, best


def estimate_tier_hits(
    request: RequestFeatures, workers: Sequence[WorkerView]
) -> tuple[list[int], list[float] | None, int]:
    """:func:`estimate_hits` counting what a worker would load from its CPU KV tier as a hit,
    and the seconds each load takes (None when no view shows a tier: the plain hits).

    A view shows a tier with ``tiered`` true, ``estimate_tiers(blocks, tokens)`` giving its
    (GPU hit, CPU-tier hit) and ``kv_load_s_per_token``
    (:class:`~router.cache.worker_state.WorkerState`).
    """
    if not any(getattr(w, "tiered", False) for w in workers):
        hits, best = estimate_hits(request, workers)
        return hits, None, best
    blocks, tokens = request.blocks, request.tokens
    hits: list[int] = []
    loads: list[float] = []
    best = UNHEALTHY
    for worker in workers:
        load = 0.0
        if not worker.healthy:
            hit = UNHEALTHY
        elif getattr(worker, "tiered", False):
            hit, cpu = worker.estimate_tiers(blocks, tokens)
            if cpu:
                hit += cpu
                load = cpu * worker.kv_load_s_per_token
        else:
            hit = worker.estimate_cache_hit(blocks, tokens)
        if hit > best:
            best = hit
        hits.append(hit)
        loads.append(load)
    if best == UNHEALTHY:
        raise NoHealthyWorker(f"no healthy worker among {len(workers)}")
    return hits, loads, best

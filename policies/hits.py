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

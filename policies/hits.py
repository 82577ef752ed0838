"""The one pass every picker starts with: health and estimated cache hit per worker.

``estimate_cache_hit`` is called exactly once per healthy worker per pick and the result is
reused for scoring and for the :class:`~policies.base.Pick` report, whatever the picker, so
the proxy's routing-loss metric (chosen hit vs best hit) means the same for every policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.base import CPUTier, NoHealthyWorker, RequestFeatures, WorkerView

UNHEALTHY = -1
"""Marker in the hits list for a worker the picker must skip."""


class TieredView(WorkerView, CPUTier, Protocol):
    """A view that says whether the router reads a CPU tier of its worker."""


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


def estimate_tier_split(
    request: RequestFeatures, workers: Sequence[TieredView]
) -> tuple[list[int], list[int] | None, int]:
    """Per worker, its GPU hit (``UNHEALTHY`` for unhealthy ones) and what it would load from
    its CPU KV tier after it (0 without a tier; the list is None when no view shows a tier),
    one estimate each; and the best GPU hit.

    The views are :class:`~policies.base.CPUTier` s: a view shows a tier with ``tiered``
    true, ``estimate_tiers(blocks, tokens)`` giving its (GPU hit, CPU-tier hit) and
    ``kv_load_s_per_token`` (:class:`~router.cache.worker_state.WorkerState`).
    """
    if not any(w.tiered for w in workers):
        hits, best = estimate_hits(request, workers)
        return hits, None, best
    blocks, tokens = request.blocks, request.tokens
    gpu_hits: list[int] = []
    cpu_hits: list[int] = []
    best = UNHEALTHY
    for worker in workers:
        cpu = 0
        if not worker.healthy:
            hit = UNHEALTHY
        elif worker.tiered:
            hit, cpu = worker.estimate_tiers(blocks, tokens)
        else:
            hit = worker.estimate_cache_hit(blocks, tokens)
        best = max(best, hit)
        gpu_hits.append(hit)
        cpu_hits.append(cpu)
    if best == UNHEALTHY:
        raise NoHealthyWorker(f"no healthy worker among {len(workers)}")
    return gpu_hits, cpu_hits, best


def estimate_tier_hits(
    request: RequestFeatures, workers: Sequence[TieredView]
) -> tuple[list[int], list[float] | None, int]:
    """:func:`estimate_tier_split` counting what a worker would load from its CPU KV tier as
    a hit, and the seconds each load takes (None when no view shows a tier: the plain hits)."""
    gpu_hits, cpu_hits, best = estimate_tier_split(request, workers)
    if cpu_hits is None:
        return gpu_hits, None, best
    hits = [g + c if g != UNHEALTHY else g for g, c in zip(gpu_hits, cpu_hits, strict=True)]
    loads = [
        c * w.kv_load_s_per_token if c else 0.0 for c, w in zip(cpu_hits, workers, strict=True)
    ]
    return hits, loads, max(hits)

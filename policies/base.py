"""The picker contract shared by the live proxy and the offline simulator.

A picker is a pure function of (request features, per-worker state views, the picker's own
small state such as session bindings or a round-robin counter). It never mutates worker
state: booking (counters, shadow insert, pins) is the caller's job, done once per request.

A request's features (:class:`~router.cache.features.RequestFeatures`) belong to the cache
model, which computes and books them; they are re-exported here as part of the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from router.cache.cost_model import WorkerCost
from router.cache.features import RequestFeatures


@runtime_checkable
class WorkerView(Protocol):
    """What a picker may read about one worker."""

    @property
    def healthy(self) -> bool: ...

    @property
    def num_requests(self) -> int:
        """Requests waiting or running on the worker (booked by the router)."""

    @property
    def pending_prefill_tokens(self) -> int:
        """Prompt tokens booked but not yet prefilled (released at first token)."""

    @property
    def ongoing_decode_tokens(self) -> int: ...

    @property
    def held_tokens(self) -> int:
        """KV tokens booked: prompt plus expected output of every request booked there."""

    @property
    def kv_capacity_tokens(self) -> int: ...

    @property
    def cost(self) -> WorkerCost | None:
        """The worker's TTFT cost model (its queue and decode batch as booked, its learned
        correction: :mod:`router.cache.cost_model`); None for a view without one."""

    def estimate_cache_hit(self, blocks: Sequence[int], tokens: bytes | None = None) -> int:
        """Tokens of the longest prefix of the request the worker probably has cached.

        ``blocks`` answer a block-hash shadow; ``tokens`` (when the caller has them) let a
        radix-tree shadow answer at token granularity.
        """


@dataclass(frozen=True, slots=True)
class Pick:
    """A routing decision and why it was taken.

    ``worker`` indexes the ``workers`` sequence given to the picker. ``hit_tokens`` is the
    chosen worker's estimated cache hit; ``best_hit_tokens`` the best estimate among healthy
    workers, so a metric can tell routing loss (hit < best) from a cold workload (best == 0).
    """

    worker: int
    branch: str
    hit_tokens: int = 0
    best_hit_tokens: int = 0


class NoHealthyWorker(LookupError):
    """Raised by a picker when no worker in the view is healthy."""


class Picker(Protocol):
    name: str

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick: ...


__all__ = ["NoHealthyWorker", "Pick", "Picker", "RequestFeatures", "WorkerView"]

"""The picker contract shared by the live proxy and the offline simulator.

A picker is a pure function of (request features, per-worker state views, the picker's own
small state such as session bindings or a round-robin counter). It never mutates worker
state: booking (counters, shadow insert, pins) is the caller's job, done once per request.

What a picker may read is stated here: :class:`WorkerView`, the members every view has, and
the capabilities, small protocols for what only some pickers read (a learned rate, the
prefill queue, session footprints, the block shadow, a CPU tier, LoRA slots, the engine's
own figures). A picker names the capabilities it reads in ``needs``; the live pool and the
simulator check their views against them once (:func:`check_views`), so a pick reads its
members directly, never probing. A view that does not track a capability still has its
members, with the neutral values each protocol documents (None, False, 0).

A request's features (:class:`~router.cache.features.RequestFeatures`) belong to the cache
model, which computes and books them; they are re-exported here as part of the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from router.cache.block_lru import BlockLRU
from router.cache.cost_model import WorkerCost
from router.cache.features import RequestFeatures
from router.cache.lora import AdapterSlots
from router.cache.workload import PrefillRate, SessionFootprint


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


class QueuedPrefill(Protocol):
    """A booking in a worker's prefill queue."""

    @property
    def prefill_released(self) -> bool:
        """Whether its first token has come (its prefill is done)."""


@runtime_checkable
class LearnedRate(Protocol):
    """The worker's prefill rate, learned from its answers
    (:class:`~router.cache.workload.PrefillRate`); None: price at the configured rate."""

    @property
    def rate(self) -> PrefillRate | None: ...


@runtime_checkable
class PrefillProgress(Protocol):
    """Where the worker's queued prefill stands; ``prefill_queue`` None: not tracked (then
    the methods are never called)."""

    @property
    def prefill_queue(self) -> Sequence[QueuedPrefill] | None:
        """The bookings whose prefill is pending, oldest first."""

    def prefill_left(self, now: float) -> int:
        """Prefill tokens still to compute at ``now`` (the oldest has begun)."""

    def prefill_tail(self, chunk_tokens: int) -> tuple[int, int]:
        """The queue's last engine step: (tokens still free in it, requests ending in it)."""


@runtime_checkable
class SessionFootprints(Protocol):
    """The KV of the sessions seen on the worker (:class:`~router.cache.workload.
    SessionFootprint`, its ``clock`` the latest booking); None: not tracked."""

    @property
    def footprint(self) -> SessionFootprint | None: ...


@runtime_checkable
class BlockShadow(Protocol):
    """The router's block-hash shadow of the worker's cache, its pins the in-flight
    requests' blocks; None: no block shadow."""

    @property
    def blocks(self) -> BlockLRU | None: ...


@runtime_checkable
class CPUTier(Protocol):
    """The worker's CPU KV tier as the router reads it; ``tiered`` False: none read (then
    ``estimate_tiers`` is never called)."""

    @property
    def tiered(self) -> bool: ...

    @property
    def kv_load_s_per_token(self) -> float:
        """Seconds to load one token's KV from the tier."""

    def estimate_tiers(self, blocks: Sequence[int], tokens: bytes | None = None) -> tuple[int, int]:
        """(GPU hit, what the CPU tier holds after it), in tokens."""


@runtime_checkable
class LoRASlots(Protocol):
    """The worker's LoRA adapter slots as booked (:class:`~router.cache.lora.AdapterSlots`);
    None: not tracked (no adapter term)."""

    @property
    def adapters(self) -> AdapterSlots | None: ...


@runtime_checkable
class EngineFigures(Protocol):
    """Figures the engine reports of itself; None where the view has none (the peers then
    derive them from the booked state: :mod:`policies.peer_views`)."""

    @property
    def num_requests_waiting(self) -> int | None: ...

    @property
    def kv_usage_fraction(self) -> float | None:
        """The share of its KV cache in use, 0..1."""

    @property
    def worker_block_size(self) -> int | None:
        """Its KV block size in tokens."""


CAPABILITIES: tuple[type, ...] = (
    LearnedRate,
    PrefillProgress,
    SessionFootprints,
    BlockShadow,
    CPUTier,
    LoRASlots,
    EngineFigures,
)
"""Every capability a picker may name in ``needs``."""


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
    needs: ClassVar[tuple[type, ...]]
    """The capabilities (of :data:`CAPABILITIES`) it reads beyond :class:`WorkerView`."""

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick: ...


def check_views(picker: Picker, views: Sequence[object]) -> None:
    """Refuse ``views`` that lack a capability ``picker`` reads: a ``TypeError`` naming it.

    Called once where a picker meets its views (the pool adding a worker, the simulator
    building its fleet), so a missing member is an error at start, never in a pick. The
    core members are the views' type (:class:`WorkerView`), not checked here.
    """
    for view in views:
        missing = [cap.__name__ for cap in picker.needs if not isinstance(view, cap)]
        if missing:
            raise TypeError(
                f"picker {picker.name!r} reads {', '.join(missing)}, which "
                f"{type(view).__name__} does not offer"
            )


__all__ = [
    "CAPABILITIES",
    "BlockShadow",
    "CPUTier",
    "EngineFigures",
    "LearnedRate",
    "LoRASlots",
    "NoHealthyWorker",
    "Pick",
    "Picker",
    "PrefillProgress",
    "RequestFeatures",
    "SessionFootprints",
    "WorkerView",
    "check_views",
]

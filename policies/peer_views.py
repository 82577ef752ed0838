"""What the peers read about a worker, as our views offer it (for the peer pickers).

The peers read figures we do not scrape onto the views: llm-d the model server's waiting
count and KV usage (vLLM's ``num_requests_waiting``, ``kv_cache_usage_perc``), Dynamo the
set of block hashes its in-flight requests hold. A view that carries the worker's own
figure (:class:`~policies.base.EngineFigures`: ``num_requests_waiting`` /
``kv_usage_fraction`` not None) is read as is; else we derive it from the router's booked
state, which the live proxy and the simulator keep alike
(:class:`router.cache.worker_state.WorkerState`):

- waiting: the booked requests with no first token yet, less the one the engine is
  prefilling (engines prefill in admission order, as ``WorkerState.prefill_left``
  assumes); so a queue behind a long prompt, or requests whose KV does not fit, count,
  and a worker prefilling its only request reads 0, as vLLM's metric would;
- KV usage: the in-flight KV (the block shadow's pinned blocks, each shared prefix once
  as the engine shares it, plus the output booked for them) over the KV capacity, at
  most 1; without a block shadow, ``held_tokens`` (shared prefixes counted per request);
- active blocks: the block shadow's pinned blocks, pinned at booking and released at
  completion, exactly when Dynamo's ActiveSequences adds and frees them.

The booked state is current; the peers' scraped metrics are tens of milliseconds old. A
view with neither (a test double: no figures, no prefill queue, no block shadow) reads
nothing waiting and no active blocks.

What each function reads is a capability of :mod:`policies.base`; a picker that calls one
names it in its ``needs``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from policies.base import BlockShadow, EngineFigures, PrefillProgress, WorkerView


class QueueView(EngineFigures, PrefillProgress, Protocol):
    """What :func:`waiting_requests` reads."""


class UsageView(WorkerView, EngineFigures, BlockShadow, Protocol):
    """What :func:`kv_usage` reads."""


def waiting_requests(view: QueueView) -> int:
    """The worker's waiting-request count (llm-d's ``q``)."""
    own = view.num_requests_waiting
    if own is not None:
        return int(own)
    queue = view.prefill_queue
    if queue is None:
        return 0
    pending = sum(1 for booking in queue if not booking.prefill_released)
    return max(0, pending - 1)


def kv_usage(view: UsageView) -> float:
    """The fraction of the worker's KV cache in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
    own = view.kv_usage_fraction
    if own is not None:
        return min(1.0, max(0.0, float(own)))
    capacity = view.kv_capacity_tokens
    if capacity <= 0:
        return 0.0
    shadow = view.blocks
    if shadow is not None:
        used = shadow.pinned_blocks * shadow.block_size + view.ongoing_decode_tokens
    else:
        used = view.held_tokens
    return min(1.0, used / capacity)


def active_blocks(view: BlockShadow) -> int:
    """Unique blocks held by the worker's in-flight requests."""
    shadow = view.blocks
    return shadow.pinned_blocks if shadow is not None else 0


def new_active_blocks(view: BlockShadow, blocks: Iterable[int]) -> int:
    """How many of ``blocks`` (unique) no in-flight request on the worker holds."""
    unique = set(blocks)
    shadow = view.blocks
    if shadow is None:
        return len(unique)
    pinned = shadow.is_pinned
    return sum(1 for block in unique if not pinned(block))

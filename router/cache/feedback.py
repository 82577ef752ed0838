"""Truth feedback: a worker's reported cached tokens, scored against and used to correct
the router's shadows of that worker.

Units. Estimates are in the router's tokens (exact ids, or the 4-bytes-a-token
approximation). The worker reports real tokens, together with its prompt token count, so a
report becomes ``cached * input_length / prompt_tokens`` router tokens (identity when the
tokenization is exact), capped at the request's length.

Correction. When the report arrives the request's own blocks are on the worker again (it just
computed them), so membership needs no fix. What a report tells is whether the shadow's
*capacity* is right:

- a **false hit** (the shadow held ``k`` leading blocks the worker no longer had) means the
  worker keeps less than the shadow thinks (a smaller cache, traffic the router does not see,
  a restart). The shadow's capacity shrinks to its current size minus ``k`` blocks, which
  evicts its ``k`` least recently used unpinned blocks: under LRU the worker lost its oldest
  blocks first, and those are the ones the shadow still counted;
- a **false miss** (the worker had ``k`` more leading blocks than the shadow) means the
  shadow forgot too early: its capacity grows by ``k`` blocks, never beyond the configured
  capacity.

The radix shadow gets the same rule in tokens. A floor (1/64 of the configured capacity)
keeps a burst of false hits (a worker restart) from emptying the shadow for good; false
misses grow it back. Compared in whole blocks, so a worker's finer block granularity never
reads as a false hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.cache.worker_state import Booking

MIN_CAPACITY_FRACTION = 64
"""The shadows never shrink below 1/64 of their configured capacity."""


@dataclass(frozen=True, slots=True)
class Correction:
    """What one report changed: capacity deltas (blocks, radix tokens); 0 means unchanged."""

    blocks_delta: int = 0
    radix_tokens_delta: int = 0


def to_router_tokens(cached: int, prompt_tokens: int | None, input_length: int) -> int:
    """The worker's cached-token count in the router's token units."""
    if cached <= 0 or input_length <= 0:
        return 0
    if prompt_tokens and prompt_tokens > 0 and prompt_tokens != input_length:
        cached = round(cached * input_length / prompt_tokens)
    return min(cached, input_length)


def correct_shadow(
    booking: Booking, reported: int, configured_blocks: int, configured_tokens: int | None
) -> Correction:
    """Adapt the booked worker's shadow capacities to a report (router tokens).

    ``configured_tokens`` is the radix tree's configured capacity in its own tokens.
    """
    reported = max(0, reported - booking.cpu_estimate)  # the GPU's part, as far as we know
    worker = booking.worker
    lru = worker.blocks
    size = lru.block_size
    estimated_blocks = booking.blocks_estimate // size
    reported_blocks = reported // size
    blocks_delta = 0
    if estimated_blocks > reported_blocks:
        floor = max(1, configured_blocks // MIN_CAPACITY_FRACTION)
        target = max(
            floor, min(lru.capacity_blocks, len(lru)) - (estimated_blocks - reported_blocks)
        )
        if target < lru.capacity_blocks:
            blocks_delta = target - lru.capacity_blocks
            lru.resize(target)
    elif reported_blocks > estimated_blocks and lru.capacity_blocks < configured_blocks:
        target = min(configured_blocks, lru.capacity_blocks + reported_blocks - estimated_blocks)
        blocks_delta = target - lru.capacity_blocks
        lru.resize(target)

    radix_delta = 0
    tree = worker.radix
    if tree is not None and booking.radix_estimate is not None and configured_tokens:
        current = tree.capacity_tokens if tree.capacity_tokens is not None else configured_tokens
        weight = worker.radix_token_weight  # real tokens per tree token (1 but in the simulator)
        # compare at block granularity too: finer worker pages are not false hits
        est, rep = booking.radix_estimate // size * size, reported // size * size
        if est > rep:
            floor = max(size // weight, configured_tokens // MIN_CAPACITY_FRACTION)
            target = max(floor, min(current, tree.total_tokens) - (est - rep) // weight)
            if target < current:
                radix_delta = target - current
                tree.capacity_tokens = target
                if tree.total_tokens > target:
                    tree.evict(tree.total_tokens - target)
        elif rep > est and current < configured_tokens:
            target = min(configured_tokens, current + (rep - est) // weight)
            radix_delta = target - current
            tree.capacity_tokens = target
    return Correction(blocks_delta, radix_delta)


def reset_shadow(booking_worker, configured_blocks: int, configured_tokens: int | None) -> None:
    """Forget everything unpinned and restore configured capacities (a worker restart)."""
    lru = booking_worker.blocks
    lru.clear()
    lru.resize(configured_blocks)
    tree = booking_worker.radix
    if tree is not None:
        tree.capacity_tokens = configured_tokens
        if tree.evictable_tokens:
            tree.evict(tree.evictable_tokens)

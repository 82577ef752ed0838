"""Which request on a worker will compute each block of a prompt: a request whose estimated
hit ends in such a block is ordered after that one.

The shadows count a request's blocks from its booking, before its worker computes them. A
session's next turn (or a sibling sharing a system prompt) booked on the same worker while
the first is still held at the router (:mod:`router.core.dispatch_hold`) or waiting in its
engine's priority queue (:mod:`router.core.engine_priority`) is therefore priced short; let
first, it would compute the shared prefix itself (an engine caches a block once the step that
computes it is scheduled, not when the request holding it arrives), while the first, keyed as
a cold prompt, waits behind everything with its prefix by then cached. Keyed at least as the
first, it goes right after it. The chained block hash names the whole prefix, so one lookup
of the last hit block finds the owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Owner(Protocol):
    """What :class:`PrefixOwners` keeps: a request's key and its prompt's block hashes."""

    key: int
    blocks: Sequence[int]


class Claim:
    """A request sent with an engine priority whose first token has not come."""

    __slots__ = ("blocks", "key")

    def __init__(self, key: int, blocks: Sequence[int]) -> None:
        self.key = key
        self.blocks = blocks


class PrefixOwners:
    """Per worker: block hash -> the first registered request that will compute it."""

    __slots__ = ("_workers",)

    def __init__(self) -> None:
        self._workers: dict[Any, dict[int, Owner]] = {}

    def add(self, worker: Any, owner: Owner) -> None:
        """``owner`` will compute its blocks on ``worker`` (those not claimed already)."""
        blocks = self._workers.setdefault(worker, {})
        for block in owner.blocks:
            blocks.setdefault(block, owner)

    def remove(self, worker: Any, owner: Owner) -> None:
        """``owner``'s blocks are computed, on their way (sent), or never will be."""
        blocks = self._workers.get(worker)
        if blocks is None:
            return
        for block in owner.blocks:
            if blocks.get(block) is owner:
                del blocks[block]
        if not blocks:
            del self._workers[worker]

    def after(self, worker: Any, blocks: Sequence[int], hit_blocks: int) -> int | None:
        """The key of the request that will compute the last of the first ``hit_blocks`` of
        ``blocks`` on ``worker`` (a request's estimated hit there); None: none will."""
        owners = self._workers.get(worker)
        if not owners or hit_blocks <= 0 or not blocks:
            return None
        owner = owners.get(blocks[min(hit_blocks, len(blocks)) - 1])
        return owner.key if owner is not None else None

    def __len__(self) -> int:
        """Blocks registered, on every worker."""
        return sum(len(b) for b in self._workers.values())


def owner_key(
    registries: Sequence[Any], worker: Any, blocks: Sequence[int], hit_blocks: int
) -> int | None:
    """The highest key among ``registries``' owners (each with ``after``, as
    :meth:`PrefixOwners.after`; None entries skipped) of the request's hit; None: none."""
    found = None
    for registry in registries:
        if registry is not None:
            key = registry.after(worker, blocks, hit_blocks)
            if key is not None and (found is None or key > found):
                found = key
    return found

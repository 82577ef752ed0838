"""The block-hash LRU shadow of one worker's prefix cache (seed 002, with pins from seed 003).

The worker probably holds a set of block hashes; a request's estimated hit is the longest
prefix of its blocks that is in the set. Every operation is O(1) per block: a dict of pin
counts answers membership, an ``OrderedDict`` of the *unpinned* blocks keeps LRU order, so
eviction pops from the front without ever walking past pinned blocks.

Pinned blocks (those of in-flight requests) are never evicted, as vLLM never frees blocks a
running request uses; while everything is pinned the set may exceed its capacity and shrinks
back as blocks are released. A request's blocks are touched root-first-most-recent: the
first block ends up most recently used, so under pressure a prefix loses its tail blocks
before its head and the set stays prefix-closed (vLLM frees blocks in reverse order for the
same reason).

Not thread-safe: the proxy runs on one asyncio loop, the simulator on one thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import takewhile

from router.cache.block_hash import BLOCK_SIZE


class BlockLRU:
    """LRU set of block hashes with a capacity in blocks and pin counts for in-flight blocks."""

    __slots__ = (
        "_contains",
        "_lru",
        "_pins",
        "block_size",
        "capacity_blocks",
        "evictions",
        "on_evict",
    )

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int = BLOCK_SIZE,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._pins: dict[int, int] = {}  # every cached block -> pin count (0: evictable)
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned blocks, LRU first
        self._contains = self._pins.__contains__
        self.evictions = 0
        # told of each block evicted for capacity (a tier below takes it; KV events)
        self.on_evict = on_evict

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, block: int) -> bool:
        return block in self._pins

    @property
    def pinned_blocks(self) -> int:
        """Blocks currently pinned by at least one in-flight request."""
        return len(self._pins) - len(self._lru)

    def is_pinned(self, block: int) -> bool:
        """Whether an in-flight request holds ``block`` (the active set some peers price)."""
        return self._pins.get(block, 0) > 0

    def match_blocks(self, blocks: Iterable[int]) -> int:
        """Number of leading ``blocks`` present (stops at the first miss)."""
        return len(list(takewhile(self._contains, blocks)))

    def estimate_cache_hit(self, blocks: Iterable[int]) -> int:
        """Tokens in the longest prefix of ``blocks`` the worker probably has cached."""
        return len(list(takewhile(self._contains, blocks))) * self.block_size

    def insert(self, blocks: Sequence[int]) -> None:
        """Add or touch ``blocks`` as most recently used, then evict beyond capacity."""
        pins, lru = self._pins, self._lru
        for block in reversed(blocks):
            count = pins.get(block)
            if count is None:
                pins[block] = 0
                lru[block] = None
            elif count == 0:
                lru.move_to_end(block)
        self._evict_over_capacity()

    def acquire(self, blocks: Sequence[int]) -> None:
        """Insert ``blocks`` and pin each one for an in-flight request."""
        pins, lru = self._pins, self._lru
        for block in reversed(blocks):
            count = pins.get(block, 0)
            if count == 0:
                lru.pop(block, None)
            pins[block] = count + 1
        self._evict_over_capacity()

    def release(self, blocks: Sequence[int]) -> None:
        """Unpin blocks pinned by :meth:`acquire`; fully released ones become most recent.

        Raises ``ValueError`` (before changing anything) if a block is not pinned as many
        times as it appears in ``blocks``: a release must match exactly one acquire.
        """
        pins, lru = self._pins, self._lru
        needed: dict[int, int] = {}
        for block in blocks:
            needed[block] = needed.get(block, 0) + 1
        for block, times in needed.items():
            if pins.get(block, 0) < times:
                raise ValueError(f"block {block:#x} released more often than acquired")
        for block in reversed(blocks):
            count = pins[block] - 1
            pins[block] = count
            if count == 0:
                lru[block] = None
        self._evict_over_capacity()

    def discard(self, blocks: Iterable[int]) -> int:
        """Forget unpinned ``blocks`` (the worker said it does not have them); returns count."""
        dropped = 0
        for block in blocks:
            if self._pins.get(block) == 0:
                del self._pins[block]
                del self._lru[block]
                dropped += 1
        return dropped

    def clear(self) -> None:
        """Forget every unpinned block (worker restart or cache reset)."""
        for block in self._lru:
            del self._pins[block]
        self._lru.clear()

    def resize(self, capacity_blocks: int) -> None:
        """Change the capacity (e.g. once the worker's real KV size is known)."""
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._evict_over_capacity()

    def lru_order(self) -> list[int]:
        """Unpinned blocks from least to most recently used (for tests and debugging)."""
        return list(self._lru)

    def _evict_over_capacity(self) -> None:
        pins, lru = self._pins, self._lru
        excess = len(pins) - self.capacity_blocks
        while excess > 0 and lru:
            block, _ = lru.popitem(last=False)
            del pins[block]
            excess -= 1
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(block)

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.cache.block_lru import BlockLRU


def test_estimate_is_longest_present_prefix_in_tokens():
    lru = BlockLRU(capacity_blocks=10, block_size=512)
    lru.insert([1, 2, 3])
    assert lru.estimate_cache_hit([1, 2, 3, 4]) == 3 * 512
    assert lru.estimate_cache_hit([1, 9, 3]) == 512  # stops at the first miss
    assert lru.estimate_cache_hit([9, 1, 2]) == 0
    assert lru.estimate_cache_hit([]) == 0


def test_first_block_is_most_recent_so_tails_go_first():
    lru = BlockLRU(capacity_blocks=4)
    lru.insert([1, 2, 3])
    assert lru.lru_order() == [3, 2, 1]
    lru.insert([4, 5])  # one over capacity: evicts 3, the tail of the older prefix
    assert lru.lru_order() == [2, 1, 5, 4]
    assert lru.match_blocks([1, 2, 3]) == 2
    assert lru.evictions == 1


def test_pinned_blocks_are_never_evicted_and_return_as_most_recent():
    lru = BlockLRU(capacity_blocks=2)
    lru.acquire([1, 2])
    lru.insert([3, 4])  # over capacity, but only unpinned blocks can go
    assert 1 in lru and 2 in lru
    assert 3 not in lru and 4 not in lru
    assert lru.pinned_blocks == 2
    lru.acquire([1])  # pinned twice
    lru.release([1, 2])
    assert lru.pinned_blocks == 1 and lru.lru_order() == [2]
    lru.release([1])
    assert lru.pinned_blocks == 0 and lru.lru_order() == [2, 1]


def test_release_without_acquire_raises_and_changes_nothing():
    lru = BlockLRU(capacity_blocks=5)
    lru.acquire([1])
    with pytest.raises(ValueError):
        lru.release([1, 1])
    assert lru.pinned_blocks == 1
    with pytest.raises(ValueError):
        lru.release([7])


def test_discard_clear_and_resize_keep_pins():
    lru = BlockLRU(capacity_blocks=10)
    lru.insert([1, 2, 3])
    lru.acquire([4])
    assert lru.discard([2, 4, 99]) == 1
    assert 2 not in lru and 4 in lru
    lru.clear()
    assert len(lru) == 1 and 4 in lru
    lru.insert([5, 6, 7])
    lru.resize(2)
    assert len(lru) == 2 and 4 in lru and 5 in lru


class BlockLRUMachine(RuleBasedStateMachine):
    """Random insert/acquire/release/estimate sequences against a list-based reference."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 6
        self.lru = BlockLRU(self.capacity, block_size=4)
        self.order: list[int] = []  # reference: unpinned blocks, LRU first
        self.pins: dict[int, int] = {}  # reference: pinned block -> count
        self.held: list[list[int]] = []

    def _ref_evict(self) -> None:
        while len(self.order) + len(self.pins) > self.capacity and self.order:
            self.order.pop(0)

    def _ref_touch(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            if b in self.pins:
                continue
            if b in self.order:
                self.order.remove(b)
            self.order.append(b)

    blocks = st.lists(st.integers(0, 12), max_size=8, unique=True)

    @rule(blocks=blocks)
    def insert(self, blocks):
        self.lru.insert(blocks)
        self._ref_touch(blocks)
        self._ref_evict()

    @rule(blocks=blocks)
    def acquire(self, blocks):
        self.lru.acquire(blocks)
        for b in blocks:
            if b in self.order:
                self.order.remove(b)
            self.pins[b] = self.pins.get(b, 0) + 1
        self._ref_evict()
        self.held.append(blocks)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def release(self, i):
        blocks = self.held.pop(i % len(self.held))
        self.lru.release(blocks)
        for b in reversed(blocks):
            self.pins[b] -= 1
            if self.pins[b] == 0:
                del self.pins[b]
                self.order.append(b)
        self._ref_evict()

    @rule(blocks=blocks)
    def estimate(self, blocks):
        present = set(self.order) | set(self.pins)
        n = 0
        while n < len(blocks) and blocks[n] in present:
            n += 1
        assert self.lru.estimate_cache_hit(blocks) == n * 4

    @invariant()
    def same_state(self):
        assert self.lru.lru_order() == self.order
        assert self.lru.pinned_blocks == len(self.pins)
        assert len(self.lru) == len(self.order) + len(self.pins)
        assert len(self.lru) <= self.capacity or not self.order


TestBlockLRUMachine = BlockLRUMachine.TestCase
TestBlockLRUMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)

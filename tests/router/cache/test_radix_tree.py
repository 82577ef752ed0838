"""The radix tree against a brute-force reference, plus hand cases and complexity checks."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from router.cache.block_hash import token_bytes
from router.cache.radix_tree import EVICTION_POLICIES, RadixTree, TreeNode

# ---- a brute-force reference model -------------------------------------------------------


class RefNode:
    def __init__(self, key: tuple[int, ...], parent: RefNode | None, pos: tuple) -> None:
        self.key, self.parent, self.pos = key, parent, pos
        self.children: dict[tuple[int, ...], RefNode] = {}
        self.lock = self.hits = self.priority = 0


class RefTree:
    """SGLang's algorithm, naively: per-token walks, and eviction that rescans every leaf
    and takes the best victim by the policy's key each time.

    ``pos`` orders nodes by recency (or creation for fifo/filo): a fresh tuple on every
    access; an upper node made by a split sits just after its lower part.
    """

    def __init__(self, capacity: int | None, page: int, policy: str) -> None:
        self.capacity, self.page = capacity, page
        self.policy = policy
        self.touch_moves = policy not in ("fifo", "filo")
        self.clock = 0
        self.root = RefNode((), None, (0,))

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _segment(self, n: RefNode) -> int:
        return {"lfu": n.hits, "slru": int(n.hits >= 2), "priority": n.priority}.get(self.policy, 0)

    def nodes(self) -> list[RefNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def total(self) -> int:
        return sum(len(n.key) for n in self.nodes())

    def _common(self, a, b) -> int:
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i - i % self.page

    def _split(self, child: RefNode, at: int) -> RefNode:
        upper = RefNode(child.key[:at], child.parent, (*child.pos, -self._tick()))
        upper.lock, upper.hits, upper.priority = child.lock, child.hits, child.priority
        del child.parent.children[child.key[: self.page]]
        child.parent.children[upper.key[: self.page]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[: self.page]] = child
        return upper

    def descend(self, key, split: bool):
        key = key[: len(key) - len(key) % self.page]
        node, off = self.root, 0
        while off < len(key):
            child = node.children.get(key[off : off + self.page])
            if child is None:
                break
            c = self._common(child.key, key[off:])
            if c == len(child.key):
                node, off = child, off + c
                continue
            if split:
                node = self._split(child, c)
            off += c
            break
        return key, node, off

    def touch(self, node: RefNode) -> None:
        while node is not self.root:
            node.hits += 1
            if self.touch_moves:
                node.pos = (self._tick(),)
            node = node.parent

    def match(self, key) -> tuple[int, RefNode]:
        _, node, off = self.descend(key, split=True)
        self.touch(node)
        return off, node

    def insert(self, key, priority: int, lock: bool) -> tuple[int, RefNode]:
        key, node, off = self.descend(key, split=True)
        cached = off
        if off < len(key):
            new = RefNode(key[off:], node, (self._tick(),))
            node.children[new.key[: self.page]] = new
            node = new
        walk = node
        while walk is not self.root:
            walk.priority = max(walk.priority, priority)
            walk = walk.parent
        self.touch(node)
        if lock:
            self.lock(node, +1)
        self.enforce()
        return cached, node

    def lock(self, node: RefNode, delta: int) -> None:
        while node is not self.root:
            node.lock += delta
            node = node.parent
        if delta < 0:
            self.enforce()

    def enforce(self) -> None:
        if self.capacity is not None and self.total() > self.capacity:
            self.evict(self.total() - self.capacity)

    def evict(self, num: int) -> int:
        freed = 0
        newest_first = self.policy in ("mru", "filo")
        while freed < num:
            leaves = [n for n in self.nodes() if not n.children and n.lock == 0]
            if not leaves:
                break
            if newest_first:
                victim = max(leaves, key=lambda n: n.pos)
            else:
                victim = min(leaves, key=lambda n: (self._segment(n), n.pos))
            del victim.parent.children[victim.key[: self.page]]
            freed += len(victim.key)
        return freed


def paths(root_children, key_of) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every node as (full token path) -> (edge length, lock ref)."""
    out = {}
    stack = [((), c) for c in root_children]
    while stack:
        prefix, node = stack.pop()
        full = prefix + key_of(node)
        out[full] = (len(key_of(node)), node.lock_ref if isinstance(node, TreeNode) else node.lock)
        stack.extend((full, c) for c in node.children.values())
    return out


def tree_key(node: TreeNode) -> tuple[int, ...]:
    import array

    return tuple(array.array("I", node.key))


# ---- the property test -------------------------------------------------------------------

tokens = st.lists(st.integers(0, 3), max_size=14)


class RadixMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(sorted(EVICTION_POLICIES)),
        page=st.sampled_from([1, 1, 2]),
        capacity=st.one_of(st.none(), st.integers(4, 40)),
    )
    def setup(self, policy, page, capacity):
        self.tree = RadixTree(capacity_tokens=capacity, page_size=page, policy=policy)
        self.ref = RefTree(capacity, page, policy)
        self.held: list[tuple[TreeNode, RefNode]] = []

    @rule(key=tokens, priority=st.integers(0, 2), lock=st.booleans())
    def insert(self, key, priority, lock):
        got = self.tree.insert(key, priority=priority, lock=lock)
        want = self.ref.insert(tuple(key), priority, lock)
        assert got.cached_tokens == want[0]
        if lock:
            self.held.append((got.node, want[1]))

    @rule(key=tokens, lock=st.booleans())
    def match(self, key, lock):
        got = self.tree.match_prefix(key)
        want = self.ref.match(tuple(key))
        assert got.length == want[0]
        if lock and got.length:
            self.tree.inc_lock_ref(got.node)
            self.ref.lock(want[1], +1)
            self.held.append((got.node, want[1]))

    @rule(key=tokens)
    def estimate(self, key):
        _, _, off = self.ref.descend(tuple(key), split=False)
        assert self.tree.prefix_length(key) == off

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50))
    def unlock(self, i):
        node, ref = self.held.pop(i % len(self.held))
        self.tree.dec_lock_ref(node)
        self.ref.lock(ref, -1)

    @rule(n=st.integers(0, 30))
    def evict(self, n):
        assert self.tree.evict(n) == self.ref.evict(n)

    @invariant()
    def same_as_reference(self):
        if not hasattr(self, "tree"):
            return
        assert paths(self.tree.root.children.values(), tree_key) == paths(
            self.ref.root.children.values(), lambda n: n.key
        )

    @invariant()
    def sizes_add_up(self):
        if not hasattr(self, "tree"):
            return
        t = self.tree
        nodes = list(t.iter_nodes())
        assert t.total_tokens == sum(n.num_tokens for n in nodes)
        assert t.protected_tokens == sum(n.num_tokens for n in nodes if n.lock_ref)
        assert t.node_count == len(nodes) == len(t.eviction_order())
        if t.capacity_tokens is not None and t.evictable_tokens:
            assert t.total_tokens <= t.capacity_tokens
        for node, _ in self.held:  # locked tokens are never evicted
            assert not node.evicted


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


# ---- hand cases (seeds 001, 004) ---------------------------------------------------------


def test_match_split_insert_as_in_seed_001():
    t = RadixTree()
    t.insert([10, 20, 30, 40, 50])
    assert t.insert([10, 20, 30, 81, 82]).cached_tokens == 3
    assert t.node_count == 3 and t.total_tokens == 7
    assert t.prefix_length([10, 20, 30, 40, 50, 61]) == 5
    assert t.prefix_length([10, 20, 31]) == 2
    m = t.match_prefix([10, 20, 30, 40])  # splits [40, 50]
    assert m.length == 4 and tree_key(m.node) == (40,)
    assert t.node_count == 4 and t.total_tokens == 7


def test_lock_propagates_to_parents_and_blocks_eviction():
    t = RadixTree()
    t.insert([1, 2, 3])
    leaf = t.insert([1, 2, 3, 4, 5]).node
    t.inc_lock_ref(leaf)
    assert t.protected_tokens == 5 and t.evictable_tokens == 0
    assert t.evict(100) == 0
    t.dec_lock_ref(leaf)
    assert t.evictable_tokens == 5
    assert t.evict(1) == 2  # whole leaf node [4, 5]
    assert t.total_tokens == 3
    with pytest.raises(ValueError):
        t.dec_lock_ref(t.match_prefix([1, 2, 3]).node)


def test_capacity_evicts_lru_first_and_cascades():
    t = RadixTree(capacity_tokens=6)
    t.insert([1, 1, 1])
    t.insert([2, 2, 2])
    t.match_prefix([1, 1, 1])  # [1,1,1] is now more recent
    t.insert([3, 3, 3])
    assert t.prefix_length([1, 1, 1]) == 3 and t.prefix_length([2, 2, 2]) == 0


def test_refresh_makes_a_chain_most_recent_without_counting_a_hit():
    t = RadixTree(capacity_tokens=6)
    node = t.insert([1, 1, 1]).node
    t.insert([2, 2, 2])
    hits = node.hit_count
    t.refresh(node)  # a finished request's path, as SGLang's cache_finished_req touches it
    assert node.hit_count == hits
    t.insert([3, 3, 3])
    assert t.prefix_length([1, 1, 1]) == 3 and t.prefix_length([2, 2, 2]) == 0


def test_insert_with_lock_survives_its_own_capacity_pressure():
    t = RadixTree(capacity_tokens=4)
    t.insert([9, 9, 9, 9])
    node = t.insert([1, 2, 3, 4, 5, 6], lock=True).node
    assert t.prefix_length([1, 2, 3, 4, 5, 6]) == 6 and t.total_tokens == 6  # over: all locked
    t.dec_lock_ref(node)
    assert t.total_tokens <= 4


def test_page_size_aligns_matches_and_inserts():
    t = RadixTree(page_size=4)
    t.insert(list(range(10)))  # 8 tokens kept
    assert t.total_tokens == 8
    assert t.prefix_length([0, 1, 2, 3, 4, 5, 9, 9]) == 4
    assert t.prefix_length(list(range(12))) == 8


@pytest.mark.parametrize(
    ("policy", "survivor"),
    [
        ("lru", [2, 2]),  # [1,1] least recently used
        ("mru", [1, 1]),  # [2,2] most recently used
        ("fifo", [2, 2]),  # [1,1] created first
        ("filo", [1, 1]),  # [2,2] created last
        ("lfu", [1, 1]),  # [1,1] hit three times
        ("slru", [1, 1]),  # [1,1] protected (2+ hits), [2,2] probationary
        ("priority", [2, 2]),  # [2,2] inserted with higher priority
    ],
)
def test_each_policy_picks_its_victim(policy, survivor):
    t = RadixTree(policy=policy)
    t.insert([1, 1])
    t.match_prefix([1, 1])
    t.match_prefix([1, 1])
    t.insert([2, 2], priority=5 if policy == "priority" else 0)
    assert t.evict(1) == 2
    assert t.prefix_length(survivor) == 2
    assert t.total_tokens == 2


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="lru"):
        RadixTree(policy="random")


def test_reset_refuses_with_locks_and_clears_otherwise():
    t = RadixTree()
    node = t.insert([1, 2], lock=True).node
    with pytest.raises(ValueError):
        t.reset()
    t.dec_lock_ref(node)
    t.reset()
    assert t.total_tokens == 0 and t.prefix_length([1, 2]) == 0
    with pytest.raises(ValueError):
        t.inc_lock_ref(node)  # evicted handle


# ---- seed 000: one batch eviction visits each node once ----------------------------------


def interleaved_worst_case(k: int) -> RadixTree:
    """head ┄ S1 ┄ L1 ┄ S2 ┄ L2 ┄ ... ┄ Sk ┄ Lk ┄ tail: S locked, L evictable leaves."""
    t = RadixTree()
    for i in range(k):
        t.insert(token_bytes([2 * i]))  # L_i
        t.insert(token_bytes([2 * i + 1]), lock=True)  # S_i, more recent than L_i
    return t


@pytest.mark.parametrize("k", [100, 1_000, 10_000])
def test_batch_eviction_is_linear_on_interleaved_worst_case(k):
    t = interleaved_worst_case(k)
    before = t.evict_visits
    freed = t.evict(2 * k)  # asks for more than is evictable: evicts every L_i
    visits = t.evict_visits - before
    assert freed == k  # each L_i is one token
    assert visits == 2 * k  # each of the k skips and k leaves visited exactly once


def test_eviction_visits_grow_linearly_not_quadratically():
    counts = {}
    for k in (100, 1_000, 10_000):
        t = interleaved_worst_case(k)
        t.evict(2 * k)
        counts[k] = t.evict_visits
    assert counts[10_000] / counts[1_000] < 11
    assert counts[1_000] / counts[100] < 11  # restart-from-tail would give about 100x


def test_root_mru_chains_skip_each_ancestor_once():
    # N chains of depth D (root - A - A1 - A11 ...), each touched: leaves nearest the tail.
    t = RadixTree()
    n, d = 500, 6
    for i in range(n):
        t.insert(token_bytes([i + 1] * 1))
        for depth in range(2, d + 1):
            t.insert(token_bytes([i + 1] + [0] * (depth - 1)))
    order = t.eviction_order()
    assert not order[0].children  # the scan meets a leaf first
    assert t.evict(10**9) == n * d
    assert t.evict_visits <= n * d  # every node visited exactly once, cascade included
    assert t.total_tokens == 0

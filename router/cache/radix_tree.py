"""A token-level radix tree with SGLang RadixCache semantics, used as a real cache.

One module serves the router's shadow radix tree and the simulated worker's KV cache:
longest-prefix match, insert with node split, lock refs that propagate up the parent chain,
a token capacity, and ``evict(num_tokens)`` of unlocked leaves with cascade to parents that
become leaves (seeds 001, 004). Keys are little-endian uint32 token buffers (``bytes``), so a
node compares its whole edge with one ``memcmp`` and finds a mismatch with numpy, never with a
per-token Python loop.

Eviction order (seed 000). Nodes sit in intrusive doubly linked lists, one per *segment*
of the eviction policy. Touching a matched chain moves it to the head leaf-first, so the
root-side ancestor is most recent and each leaf sits nearer the tail than its ancestors
(root-MRU chain ordering). ``evict`` scans each list once with a cursor that never restarts:
a node is marked when the cursor passes it, and when an eviction turns an already-passed
parent into an evictable leaf, that parent is the best remaining victim and goes at once;
a parent not yet passed will be reached by the scan. Evicting M leaves past K skip nodes
(locked or non-leaf) thus costs O(M + K) node visits, not O(M x K).

Policies (seed 004) are small orderings over those lists, not copies of the tree:

======== ================================ ===================== =======================
name     segment (evicted lowest first)   moves on access       scan within segment
======== ================================ ===================== =======================
lru      one                              yes                   oldest first
mru      one                              yes                   newest first
fifo     one                              no (creation order)   oldest first
filo     one                              no (creation order)   newest first
lfu      hit count                        yes                   oldest first
slru     probation (<2 hits), protected   yes                   oldest first
priority request priority (max on path)   yes                   oldest first
======== ================================ ===================== =======================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from router.cache.block_hash import TOKEN_BYTES, TokenInput, token_bytes


class TreeNode:
    """One edge of the tree: the tokens on it, its children and its eviction bookkeeping."""

    __slots__ = (
        "children",
        "hit_count",
        "key",
        "lock_ref",
        "next",
        "parent",
        "prev",
        "priority",
        "scan_mark",
        "segment",
    )

    def __init__(self, key: bytes, parent: TreeNode | None) -> None:
        self.key = key  # uint32 LE token buffer of this edge
        self.parent = parent
        self.children: dict[bytes, TreeNode] = {}  # first page of the child's key -> child
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = 0
        self.segment = 0
        self.scan_mark = 0
        self.prev: TreeNode | None = None  # towards the list head (more recent)
        self.next: TreeNode | None = None  # towards the list tail (less recent)

    @property
    def num_tokens(self) -> int:
        return len(self.key) // TOKEN_BYTES

    @property
    def evicted(self) -> bool:
        """True once removed from its tree (the root and list sentinels have empty keys)."""
        return self.parent is None and bool(self.key)


class _NodeList:
    """Circular doubly linked list with a sentinel: ``sentinel.next`` is the head (newest)."""

    __slots__ = ("sentinel",)

    def __init__(self) -> None:
        s = TreeNode(b"", None)
        s.prev = s.next = s
        self.sentinel = s

    def push_front(self, node: TreeNode) -> None:
        s = self.sentinel
        node.prev, node.next = s, s.next
        s.next.prev = node
        s.next = node

    def insert_before(self, ref: TreeNode, node: TreeNode) -> None:
        """Place ``node`` just on the head side of ``ref``."""
        node.prev, node.next = ref.prev, ref
        ref.prev.next = node
        ref.prev = node

    @staticmethod
    def unlink(node: TreeNode) -> None:
        node.prev.next = node.next
        node.next.prev = node.prev
        node.prev = node.next = None

    def empty(self) -> bool:
        return self.sentinel.next is self.sentinel


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    """An ordering of evictable leaves: segment first, then list position."""

    name: str
    segment: Callable[[TreeNode], int]
    touch_on_access: bool = True
    oldest_first: bool = True


def _one_segment(node: TreeNode) -> int:
    return 0


EVICTION_POLICIES: dict[str, EvictionPolicy] = {
    p.name: p
    for p in (
        EvictionPolicy("lru", _one_segment),
        EvictionPolicy("mru", _one_segment, oldest_first=False),
        EvictionPolicy("fifo", _one_segment, touch_on_access=False),
        EvictionPolicy("filo", _one_segment, touch_on_access=False, oldest_first=False),
        EvictionPolicy("lfu", lambda n: n.hit_count),
        EvictionPolicy("slru", lambda n: 1 if n.hit_count >= 2 else 0),
        EvictionPolicy("priority", lambda n: n.priority),
    )
}


class MatchResult(NamedTuple):
    length: int  # matched tokens
    node: TreeNode  # the node ending exactly at the match (the root when nothing matched)


class InsertResult(NamedTuple):
    cached_tokens: int  # tokens of the key that were already in the tree
    node: TreeNode  # the node ending at the last inserted token


def _common_prefix_bytes(a: bytes, b: bytes, page_bytes: int) -> int:
    """Bytes of the common prefix of two token buffers, rounded down to whole pages."""
    n = min(len(a), len(b)) // TOKEN_BYTES
    x = np.frombuffer(a, dtype="<u4", count=n)
    y = np.frombuffer(b, dtype="<u4", count=n)
    differ = x != y
    tokens = int(differ.argmax()) if differ.any() else n
    common = tokens * TOKEN_BYTES
    return common - common % page_bytes


class RadixTree:
    """Radix tree over token ids with a token capacity, lock refs and pluggable eviction.

    ``capacity_tokens=None`` means unbounded (evict only when asked). With a capacity,
    :meth:`insert` and :meth:`dec_lock_ref` evict unlocked leaves until the tree fits; locked
    tokens never go, so a tree whose locked tokens exceed the capacity stays over it.
    """

    def __init__(
        self, capacity_tokens: int | None = None, page_size: int = 1, policy: str = "lru"
    ) -> None:
        if page_size <= 0:
            raise ValueError("page_size must be positive")
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0 or None")
        try:
            self.policy = EVICTION_POLICIES[policy]
        except KeyError:
            names = ", ".join(EVICTION_POLICIES)
            raise ValueError(f"unknown eviction policy {policy!r}; choose one of {names}") from None
        self.capacity_tokens = capacity_tokens
        self.page_size = page_size
        self._page_bytes = page_size * TOKEN_BYTES
        self.root = TreeNode(b"", None)
        self.root.lock_ref = 1  # never evicted, never counted
        self._lists: dict[int, _NodeList] = {}
        self._epoch = 0
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.node_count = 0
        self.evict_visits = 0  # list nodes looked at by evict(), for complexity tests
        self.evicted_tokens = 0
        self.on_evict: Callable[[bytes], None] | None = None  # an evicted node's key (events)

    # ---- sizes -------------------------------------------------------------------------

    @property
    def total_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens

    def __len__(self) -> int:
        return self.total_tokens

    # ---- lookup ------------------------------------------------------------------------

    def _aligned(self, tokens: TokenInput) -> bytes:
        buf = token_bytes(tokens)
        return buf[: len(buf) - len(buf) % self._page_bytes]

    def prefix_length(self, tokens: TokenInput) -> int:
        """Tokens of the longest cached prefix of ``tokens``; changes nothing (an estimate)."""
        return self._descend(self._aligned(tokens), split=False)[1] // TOKEN_BYTES

    def match_prefix(self, tokens: TokenInput) -> MatchResult:
        """Longest cached prefix, as SGLang matches it: splits the node at a partial match
        so the returned node ends exactly there, and counts as an access of the path."""
        buf = self._aligned(tokens)
        node, off = self._descend(buf, split=True)
        self._touch(node)
        return MatchResult(off // TOKEN_BYTES, node)

    # ---- insert ------------------------------------------------------------------------

    def insert(self, tokens: TokenInput, priority: int = 0, lock: bool = False) -> InsertResult:
        """Cache ``tokens`` (page-aligned), splitting where they diverge from a cached edge.

        ``lock=True`` takes a lock ref on the new path before capacity is enforced, so the
        caller's own tokens cannot be evicted by this insert (release with dec_lock_ref).
        """
        buf = self._aligned(tokens)
        node, off = self._descend(buf, split=True)
        cached = off // TOKEN_BYTES
        if off < len(buf):
            node = self._add_child(node, buf[off:])
        if priority:
            walk = node
            while walk is not self.root:
                if walk.priority < priority:
                    walk.priority = priority
                walk = walk.parent
        self._touch(node)
        if lock:
            self.inc_lock_ref(node)
        self._enforce_capacity()
        return InsertResult(cached, node)

    def _descend(self, buf: bytes, split: bool) -> tuple[TreeNode, int]:
        """Walk ``buf`` down the tree; return the deepest node reached and the bytes matched.
        With ``split``, a partially matched edge is split so the node ends at the match."""
        pb = self._page_bytes
        node, off, end = self.root, 0, len(buf)
        while off < end:
            child = node.children.get(buf[off : off + pb])
            if child is None:
                break
            klen = len(child.key)
            if buf[off : off + klen] == child.key:
                off += klen
                node = child
                continue
            common = _common_prefix_bytes(child.key, buf[off : off + klen], pb)
            if split:
                node = self._split(child, common)
            off += common
            break
        return node, off

    def _add_child(self, parent: TreeNode, key: bytes) -> TreeNode:
        node = TreeNode(key, parent)
        parent.children[key[: self._page_bytes]] = node
        node.segment = self.policy.segment(node)
        self._list(node.segment).push_front(node)
        self.node_count += 1
        self.evictable_tokens += node.num_tokens
        return node

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut ``child``'s edge after ``at`` bytes; the new upper node takes its place."""
        pb = self._page_bytes
        parent = child.parent
        upper = TreeNode(child.key[:at], parent)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.priority = child.priority
        upper.segment = child.segment
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[:pb]] = child
        parent.children[upper.key[:pb]] = upper
        self._lists[child.segment].insert_before(child, upper)
        self.node_count += 1
        return upper

    # ---- recency -----------------------------------------------------------------------

    def _list(self, segment: int) -> _NodeList:
        lst = self._lists.get(segment)
        if lst is None:
            lst = self._lists[segment] = _NodeList()
        return lst

    def refresh(self, node: TreeNode) -> None:
        """Make the chain ending at ``node`` most recent without counting a hit: SGLang's
        ``cache_finished_req`` re-inserts a finished request's tokens, which refreshes
        their access time (vLLM frees a finished request's blocks to its free queue's
        tail alike), so a cache is evicted in order of last *use*, not of admission."""
        self._touch(node, hit=False)

    def _touch(self, node: TreeNode, hit: bool = True) -> None:
        """Count an access of the chain ending at ``node`` (a hit, unless ``hit`` is False);
        root-side ends up most recent."""
        policy = self.policy
        while node is not self.root:
            node.hit_count += hit
            segment = policy.segment(node)
            if policy.touch_on_access or segment != node.segment:
                old = self._lists[node.segment]
                _NodeList.unlink(node)
                if old.empty() and node.segment != segment:
                    del self._lists[node.segment]
                node.segment = segment
                self._list(segment).push_front(node)
            node = node.parent

    # ---- locks -------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the chain root..node from eviction (one in-flight user)."""
        if node.evicted:
            raise ValueError("cannot lock an evicted node")
        while node is not self.root:
            if node.lock_ref == 0:
                n = node.num_tokens
                self.evictable_tokens -= n
                self.protected_tokens += n
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one lock taken by :meth:`inc_lock_ref` on the same node."""
        walk = node
        while walk is not self.root:  # validate first: never leave a half-released chain
            if walk.lock_ref <= 0:
                raise ValueError("dec_lock_ref without a matching inc_lock_ref")
            walk = walk.parent
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                n = node.num_tokens
                self.evictable_tokens += n
                self.protected_tokens -= n
            node = node.parent
        self._enforce_capacity()

    # ---- eviction ----------------------------------------------------------------------

    def _enforce_capacity(self) -> None:
        cap = self.capacity_tokens
        if cap is not None and self.total_tokens > cap:
            self.evict(self.total_tokens - cap)

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves in policy order until ``num_tokens`` are freed (or nothing
        evictable is left); returns the tokens freed (whole nodes, so possibly more)."""
        if num_tokens <= 0 or self.evictable_tokens == 0:
            return 0
        self._epoch += 1
        epoch = self._epoch
        freed = 0
        for node in self._scan():
            self.evict_visits += 1
            node.scan_mark = epoch
            if node.lock_ref == 0 and not node.children:
                freed += self._evict_chain(node, epoch, num_tokens - freed)
                if freed >= num_tokens:
                    break
        self._drop_empty_lists()
        return freed

    def _scan(self) -> Iterator[TreeNode]:
        """List nodes in eviction order; the next node is read before yielding, so the
        consumer may delete the yielded node and nodes already yielded."""
        newest_first = not self.policy.oldest_first
        for segment in sorted(self._lists):
            sentinel = self._lists[segment].sentinel
            node = sentinel.next if newest_first else sentinel.prev
            while node is not sentinel:
                following = node.next if newest_first else node.prev
                yield node
                node = following

    def _evict_chain(self, leaf: TreeNode, epoch: int, wanted: int) -> int:
        """Evict ``leaf``, then each parent that became an evictable leaf the scan has
        already passed (it is now the best victim) while more tokens are wanted."""
        freed = 0
        node = leaf
        while True:
            parent = node.parent
            freed += self._delete_leaf(node)
            if (
                freed >= wanted
                or parent is self.root
                or parent.children
                or parent.lock_ref
                or parent.scan_mark != epoch
            ):
                return freed
            node = parent

    def _delete_leaf(self, node: TreeNode) -> int:
        n = node.num_tokens
        if self.on_evict is not None:
            self.on_evict(node.key)
        del node.parent.children[node.key[: self._page_bytes]]
        _NodeList.unlink(node)
        node.parent = None
        self.evictable_tokens -= n
        self.evicted_tokens += n
        self.node_count -= 1
        return n

    def _drop_empty_lists(self) -> None:
        for segment in [s for s, lst in self._lists.items() if lst.empty()]:
            del self._lists[segment]

    # ---- maintenance -------------------------------------------------------------------

    def reset(self) -> None:
        """Drop everything (a worker restart or cache reset); refuses while locks are held."""
        if self.protected_tokens:
            raise ValueError("cannot reset a tree with locked tokens")
        for node in list(self.iter_nodes()):
            node.parent = None  # stale handles now read as evicted
        self.root.children.clear()
        self._lists.clear()
        self.evictable_tokens = 0
        self.node_count = 0

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, depth first."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def eviction_order(self) -> list[TreeNode]:
        """All list nodes in the order eviction scans them (for tests and debugging)."""
        return list(self._scan())

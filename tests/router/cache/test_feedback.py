"""Truth feedback: reports rescaled to router tokens; shadow capacity shrinks on false hits
and grows back on false misses, within [configured / 64, configured]."""

from __future__ import annotations

from policies.base import RequestFeatures
from router.cache.block_hash import hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.feedback import correct_shadow, reset_shadow, to_router_tokens
from router.cache.radix_tree import RadixTree
from router.cache.worker_state import WorkerState

B = 4  # tokens per block


def worker(capacity_blocks=64):
    return WorkerState("w", BlockLRU(capacity_blocks, B), RadixTree(capacity_blocks * B))


def request(tokens):
    buf = token_bytes(tokens)
    return RequestFeatures(hash_blocks(buf, B), len(tokens), None, buf, block_size=B)


def test_reports_are_rescaled_to_router_tokens():
    assert to_router_tokens(50, 100, 100) == 50  # exact tokenization: unchanged
    assert to_router_tokens(60, 120, 100) == 50  # the worker counts 1.2 tokens per ours
    assert to_router_tokens(500, None, 100) == 100  # never more than the request
    assert to_router_tokens(0, 100, 100) == 0


def test_false_hit_shrinks_and_evicts_the_oldest_blocks():
    w = worker()
    old = [request(list(range(i * 100, i * 100 + 16))) for i in range(6)]  # 4 blocks each
    for r in old:
        w.book(r).finish()
    assert len(w.blocks) == 24
    hot = old[-1]
    booking = w.book(hot)
    assert booking.blocks_estimate == 16
    # the worker had only the first block: 3 blocks were gone, so it holds less than we think
    change = correct_shadow(booking, 4, configured_blocks=64, configured_tokens=256)
    assert change.blocks_delta == 24 - 3 - 64 and w.blocks.capacity_blocks == 21
    # the 3 least recently used went: the oldest prefix lost its tail first
    assert old[0].blocks[0] in w.blocks
    assert all(b not in w.blocks for b in old[0].blocks[1:])
    assert all(b in w.blocks for b in hot.blocks)  # pinned, and just computed anyway
    assert change.radix_tokens_delta < 0 and w.radix.capacity_tokens < 256
    booking.finish()
    assert w.blocks.pinned_blocks == 0 and w.radix.protected_tokens == 0


def test_false_miss_grows_back_to_configured_never_beyond():
    w = worker()
    w.blocks.resize(10)
    w.radix.capacity_tokens = 40
    booking = w.book(request(list(range(16))))
    change = correct_shadow(booking, 16, configured_blocks=64, configured_tokens=256)
    assert change.blocks_delta == 4 and w.blocks.capacity_blocks == 14
    assert change.radix_tokens_delta == 16 and w.radix.capacity_tokens == 56
    booking.finish()
    full = worker()
    booking = full.book(request(list(range(16))))
    assert correct_shadow(booking, 16, 64, 256).blocks_delta == 0  # already configured


def test_capacity_has_a_floor_and_reset_restores_it():
    w = worker(capacity_blocks=640)
    for i in range(50):
        booking = w.book(request(list(range(i * 1000, i * 1000 + 400))))
        booking.finish()
        booking = w.book(request(list(range(i * 1000, i * 1000 + 400))))
        correct_shadow(booking, 0, configured_blocks=640, configured_tokens=2560)
        booking.finish()
    assert w.blocks.capacity_blocks == 10  # 640 / 64
    reset_shadow(w, 640, 2560)
    assert w.blocks.capacity_blocks == 640 and len(w.blocks) == 0
    assert w.radix.capacity_tokens == 2560 and w.radix.total_tokens == 0


def test_equal_report_changes_nothing():
    w = worker()
    w.book(request(list(range(16)))).finish()
    booking = w.book(request(list(range(16))))
    change = correct_shadow(booking, 16, 64, 256)
    assert (change.blocks_delta, change.radix_tokens_delta) == (0, 0)
    assert w.blocks.capacity_blocks == 64 and w.radix.capacity_tokens == 256


def test_radix_correction_in_tree_units_when_a_tree_token_stands_for_many():
    """The simulator's trees hold block keys (radix_token_weight real tokens each): the
    correction converts the reported difference into tree tokens."""
    tree = RadixTree(capacity_tokens=64)
    w = WorkerState("w", BlockLRU(64, 512), tree, radix_token_weight=256)
    tokens = bytes(range(32))  # 8 tree tokens (4 bytes each) = 2048 real tokens
    w.book(RequestFeatures([1, 2, 3, 4], 2048, None, tokens)).finish()
    booking = w.book(RequestFeatures([1, 2, 3, 4], 2048, None, tokens))
    assert booking.radix_estimate == 2048
    change = correct_shadow(booking, 1024, configured_blocks=64, configured_tokens=64)
    # 1024 real tokens were false hits: 4 tree tokens off the 8 it holds
    assert change.radix_tokens_delta == 4 - 64 and tree.capacity_tokens == 4
    booking.finish()

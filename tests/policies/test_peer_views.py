"""peer_views: the peers' inputs (waiting count, KV usage, active blocks) from booked state."""

from __future__ import annotations

import pytest

from policies.base import RequestFeatures
from policies.peer_views import active_blocks, kv_usage, new_active_blocks, waiting_requests
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState

BLOCK = 512


def _state(capacity_blocks: int = 100) -> WorkerState:
    return WorkerState(name="w", blocks=BlockLRU(capacity_blocks, BLOCK))


def _book(state: WorkerState, blocks: list[int], output: int = 0):
    return state.book(RequestFeatures(blocks, len(blocks) * BLOCK), output, now=0.0)


def test_waiting_is_the_requests_without_first_token_less_the_one_in_prefill():
    state = _state()
    assert waiting_requests(state) == 0
    first = _book(state, [1, 2])
    assert waiting_requests(state) == 0  # its only request is being prefilled
    second, _third = _book(state, [3]), _book(state, [4])
    assert waiting_requests(state) == 2
    second.first_token(now=1.0)  # out of order: the others still wait
    assert waiting_requests(state) == 1
    first.first_token(now=2.0)
    assert waiting_requests(state) == 0


def test_kv_usage_counts_shared_prefix_blocks_once_plus_booked_output():
    state = _state(capacity_blocks=10)  # 5120 tokens
    _book(state, [1, 2], output=256)
    _book(state, [1, 2, 3], output=256)  # blocks 1 and 2 shared: 3 pinned blocks
    assert kv_usage(state) == pytest.approx((3 * BLOCK + 512) / 5120)
    _book(state, list(range(10, 20)), output=0)
    assert kv_usage(state) == 1.0  # capped


def test_active_blocks_are_the_pins_of_in_flight_requests():
    state = _state()
    booking = _book(state, [1, 2, 3])
    assert active_blocks(state) == 3
    assert new_active_blocks(state, [1, 2, 9, 9]) == 1  # unique blocks, 9 is new
    booking.finish()
    assert active_blocks(state) == 0
    assert new_active_blocks(state, [1, 2]) == 2  # still cached, no longer active


def test_a_view_with_its_own_figures_is_read_as_is(worker):
    view = worker(num_requests=7)
    assert (waiting_requests(view), active_blocks(view), new_active_blocks(view, [1, 1, 2])) == (
        0,
        0,
        2,
    )
    view.held_tokens = view.kv_capacity_tokens // 4
    assert kv_usage(view) == 0.25  # no block shadow: held tokens over capacity
    view.num_requests_waiting, view.kv_usage_fraction = 3, 0.6
    assert (waiting_requests(view), kv_usage(view)) == (3, 0.6)

"""The engine priority: the predicted prefill, aged by the send time, the client's as major."""

from __future__ import annotations

from policies.registry import make_picker
from router.cache.block_lru import BlockLRU
from router.cache.cost_model import CostTerms, WorkerCost
from router.cache.cost_profile import resolve
from router.cache.features import RequestFeatures
from router.cache.worker_state import Booking, WorkerState
from router.core.engine_priority import AGING_PER_S, CLIENT_BAND, engine_priority, orders_engine

FIRST = 0


def _state() -> WorkerState:
    terms = CostTerms.of_profile(resolve("h100-llama8b"))
    return WorkerState("w", BlockLRU(10_000, 512), cost=WorkerCost(terms))


def _booking(state: WorkerState, tokens: int) -> Booking:
    """A cold prompt of ``tokens`` (distinct blocks, so nothing is cached)."""
    global FIRST
    blocks = list(range(FIRST, FIRST + tokens // 512))
    FIRST += len(blocks)
    return state.book(RequestFeatures(blocks=blocks, input_length=tokens), 16)


def test_a_shorter_prefill_goes_first_and_a_later_send_ages_the_key():
    state = _state()
    short = _booking(state, 1_024)
    long = _booking(state, 61_440)
    assert engine_priority(short, 10.0) < engine_priority(long, 10.0)
    # a long prompt waits behind shorter ones sent at most 1 / AGING_PER_S times its
    # prefill later, not behind those sent after that
    own = state.cost.prefill_s(61_440, 0)
    later = 10.0 + 1.1 * own / AGING_PER_S
    assert engine_priority(short, later) > engine_priority(long, 10.0)


def test_the_clients_priority_is_the_major_key():
    state = _state()
    long = _booking(state, 61_440)
    short = _booking(state, 512)
    assert engine_priority(long, 0.0, client=-1) < engine_priority(short, 1e6, client=0)
    assert engine_priority(short, 0.0, client=1) // CLIENT_BAND == 1


def test_only_pickers_that_say_so_order_the_engine():
    assert orders_engine(make_picker("ttft"))
    assert not orders_engine(make_picker("llmd_precise"))
    assert not orders_engine(make_picker("round_robin"))

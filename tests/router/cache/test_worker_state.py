import pytest

from policies.base import RequestFeatures
from router.cache.block_hash import hash_blocks, token_bytes
from router.cache.block_lru import BlockLRU
from router.cache.radix_tree import RadixTree
from router.cache.worker_state import WorkerState


def make_worker(shadow: str = "blocks") -> WorkerState:
    return WorkerState("w0", BlockLRU(100, 4), RadixTree(capacity_tokens=400), shadow=shadow)


def request(tokens: list[int], session: str | None = None) -> RequestFeatures:
    buf = token_bytes(tokens)
    return RequestFeatures(hash_blocks(buf, 4), len(tokens), session, buf, block_size=4)


def test_booking_follows_seed_002_state_machine_and_releases_once():
    w = make_worker()
    warm = request(list(range(10)))
    w.book(warm).finish()  # caches blocks [0..3], [4..7]
    booking = w.book(request([*range(10), 99, 98]), expected_output_tokens=7)
    assert w.num_requests == 1
    assert w.pending_prefill_tokens == 12 - 8  # two cached blocks of 4
    assert w.ongoing_decode_tokens == 7
    assert w.blocks.pinned_blocks == 3 and w.radix.protected_tokens == 12
    booking.first_token()
    booking.first_token()
    assert w.pending_prefill_tokens == 0 and w.num_requests == 1
    assert booking.finish() is True
    assert booking.finish() is False  # every exit path may call finish()
    assert (w.num_requests, w.pending_prefill_tokens, w.ongoing_decode_tokens) == (0, 0, 0)
    assert w.blocks.pinned_blocks == 0 and w.radix.protected_tokens == 0


def test_shadow_choice_decides_the_estimate_and_both_are_scored():
    blocks_w, radix_w = make_worker("blocks"), make_worker("radix")
    for w in (blocks_w, radix_w):
        w.book(request([1, 2, 3, 4, 5, 6])).finish()
    probe = request([1, 2, 3, 4, 5, 6, 7, 8])
    assert blocks_w.estimate_cache_hit(probe.blocks, probe.tokens) == 4  # whole blocks only
    assert radix_w.estimate_cache_hit(probe.blocks, probe.tokens) == 6  # token granular
    booking = radix_w.book(probe)
    assert radix_w.pending_prefill_tokens == 2
    booking.report_cached(4)
    booking.report_cached(0)  # only the first report counts
    acc = radix_w.accuracy
    assert (acc.requests, acc.reported_tokens) == (1, 4)
    assert acc.blocks_abs_error_tokens == 0 and acc.radix_abs_error_tokens == 2
    booking.finish()


@pytest.mark.parametrize("shadow", ["blocks", "radix"])
def test_both_shadows_evict_in_order_of_last_use(shadow: str):
    """As the engines: a prompt booked first but finished last outlives one booked after
    it that finished first (vLLM frees blocks at finish, SGLang re-inserts them)."""
    w = WorkerState("w0", BlockLRU(4, 4), RadixTree(capacity_tokens=16), shadow=shadow)
    long_answer, short_answer = request(list(range(8))), request(list(range(100, 108)))
    first, second = w.book(long_answer), w.book(short_answer)
    second.finish()
    first.finish()
    w.book(request(list(range(200, 208)))).finish()  # room for it: one prompt goes
    assert w.estimate_cache_hit(long_answer.blocks, long_answer.tokens) == 8
    assert w.estimate_cache_hit(short_answer.blocks, short_answer.tokens) == 0


def test_unknown_shadow_is_rejected():
    with pytest.raises(ValueError):
        WorkerState("w", BlockLRU(1), shadow="bloom")


def test_bookings_feed_the_footprint_and_clean_reports_feed_the_rate():
    w = make_worker()
    w.rate.configured = w.rate.tokens_per_s = 1000.0  # small numbers for 4-token blocks
    first = w.book(request(list(range(2000)), session="s"), expected_output_tokens=10, now=5.0)
    assert w.footprint.tokens_of("s") == 2010 and w.footprint.clock == 5.0
    second = w.book(request(list(range(3000, 3600))), now=5.5)  # queued behind the first
    assert (first.queued_ahead, second.queued_ahead) == (0, 2000)
    first.first_token(now=7.0)
    first.report_cached(0)  # nothing ahead: 2000 tokens in 2 s is a clean sample
    assert w.rate.samples == 1
    second.first_token(now=8.0)
    second.report_cached(0)  # waited behind another: not a sample
    assert w.rate.samples == 1
    third = w.book(request(list(range(5000, 6000))), now=9.0)
    third.ttft_valid = False  # not streamed: its first byte is the whole answer
    third.first_token(now=20.0)
    third.report_cached(0)
    assert w.rate.samples == 1
    for b in (first, second, third):
        b.finish()
    assert w.kv_capacity_tokens == 100 * 4


def test_a_radix_insert_left_for_later_ends_as_the_eager_one():
    eager, later = make_worker(), make_worker()
    held = []
    for turn in (request([*range(10), 99, 98]), request([*range(10), 7]), request([1, 2, 3])):
        done = eager.book(turn)
        left = later.book(turn, radix_later=True)
        assert left.radix_estimate is None and left.radix_pending is not None
        assert later.radix.total_tokens < eager.radix.total_tokens  # not inserted yet
        left.insert_radix()
        left.insert_radix()  # once
        assert (left.radix_estimate, left.new_prefill) == (done.radix_estimate, done.new_prefill)
        assert later.radix.protected_tokens == eager.radix.protected_tokens
        assert later.radix.total_tokens == eager.radix.total_tokens
        held += [done, left]
    for booking in held:
        assert booking.finish() is True
    assert later.radix.protected_tokens == eager.radix.protected_tokens == 0
    # a booking that ends before its insert (the request never went out) leaves the tree
    # as the eager one does
    eager.book(request([5, 6, 7, 8, 9])).finish()
    unsent = later.book(request([5, 6, 7, 8, 9]), radix_later=True)
    assert unsent.finish() is True
    assert later.radix.total_tokens == eager.radix.total_tokens
    assert later.radix.protected_tokens == 0 and later.num_requests == 0


def test_the_radix_shadow_is_never_left_for_later():
    w = make_worker("radix")
    booking = w.book(request([1, 2, 3, 4, 5]), radix_later=True)
    assert booking.radix_pending is None and booking.radix_estimate == 0
    assert w.radix.protected_tokens == 5


def test_the_oldest_pending_prefill_counts_as_in_progress():
    w = make_worker()
    w.rate.configured = w.rate.tokens_per_s = 1000.0
    head = w.book(request(list(range(2000))), now=0.0)
    behind = w.book(request(list(range(3000, 3600))), now=0.5)
    assert w.prefill_left(0.0) == 2600  # nothing done yet
    assert w.prefill_left(1.0) == 2600 - 1000  # the head has had 1 s at 1000 tokens/s
    assert w.prefill_left(9.0) == 600  # at most the head itself, until its first token
    head.first_token(now=2.0)  # the next one begins at the head's first token
    assert w.prefill_left(2.0) == 600 and w.prefill_left(2.5) == 100
    behind.first_token(now=3.0)
    assert w.prefill_left(4.0) == 0 and not w.prefill_queue
    for b in (head, behind):
        b.finish()
    released = w.book(request(list(range(5000, 5100))), now=10.0)
    released.finish()  # gone before its first token (a client that left): not in progress
    assert w.prefill_left(11.0) == 0 and not w.prefill_queue


def test_the_queues_last_step_is_where_its_prefill_ends_in_whole_chunks():
    w = make_worker()
    w.rate.configured = w.rate.tokens_per_s = 1000.0
    assert w.prefill_tail(1000) == (0, 0)  # nothing queued
    a = w.book(request(list(range(1500))), now=0.0)  # steps of 1000: ends 500 into the 2nd
    assert w.prefill_tail(1000) == (500, 1)
    b = w.book(request(list(range(2000, 2300))), now=0.1)  # ends in the same step
    assert w.prefill_tail(1000) == (200, 2)
    c = w.book(request(list(range(3000, 3200))), now=0.2)  # fills it to the chunk
    assert w.prefill_tail(1000) == (0, 0)
    a.first_token(now=1.0)
    b.first_token(now=1.0)  # the busy period goes on while c is queued
    d = w.book(request(list(range(4000, 4100))), now=1.1)
    assert w.prefill_tail(1000) == (900, 1)  # only d ends in the step it began
    for booking in (c, d):
        booking.first_token(now=2.0)
    assert w.prefill_tail(1000) == (0, 0)
    e = w.book(request(list(range(5000, 5400))), now=3.0)  # a new busy period starts a chunk
    assert w.prefill_tail(1000) == (600, 1)
    for booking in (a, b, c, d, e):
        booking.finish()

"""PrefillRate (learned, bounded) and SessionFootprint (warm sessions over a horizon)."""

from __future__ import annotations

import pytest

from router.cache.workload import BOUND, MIN_WORK_TOKENS, PrefillRate, SessionFootprint


def test_rate_starts_at_the_configured_one_and_follows_observations():
    rate = PrefillRate(10_000)
    assert rate.tokens_per_s == 10_000 and rate.samples == 0
    for _ in range(100):
        rate.observe(20_000, 20_000 / 20_000 + 0.012)  # a worker twice as fast
    assert rate.tokens_per_s == pytest.approx(20_000, rel=0.02)
    assert rate.samples == 100


def test_rate_is_bounded_and_ignores_tiny_samples():
    rate = PrefillRate(10_000)
    rate.observe(MIN_WORK_TOKENS - 1, 100.0)  # overhead-dominated: skipped
    assert rate.samples == 0 and rate.tokens_per_s == 10_000
    for _ in range(500):
        rate.observe(10_000, 1000.0)  # a stalled worker
    assert rate.tokens_per_s == 10_000 / BOUND
    for _ in range(500):
        rate.observe(100_000, 0.0001)
    assert rate.tokens_per_s == 10_000 * BOUND
    with pytest.raises(ValueError):
        PrefillRate(0)


def test_footprint_sums_warm_sessions_and_forgets_old_ones():
    fp = SessionFootprint(horizon_s=10.0)
    fp.touch("a", 1000, now=0.0)
    fp.touch("b", 500, now=5.0)
    fp.touch("a", 1200, now=6.0)  # a grew: replaced, not added
    assert fp.warm_tokens == 1700 and fp.tokens_of("a") == 1200 and len(fp) == 2
    assert fp.expire(14.0) == 1700
    assert fp.expire(15.5) == 1200  # b last seen at 5.0
    assert fp.tokens_of("b") == 0 and fp.tokens_of(None) == 0
    fp.touch("c", 10, now=30.0)
    assert fp.warm_tokens == 10 and fp.clock == 30.0


def test_displaced_pushes_out_whole_sessions_oldest_first_each_capped():
    fp = SessionFootprint(horizon_s=100.0)
    fp.touch("old", 3000, now=0.0)
    fp.touch("mid", 50_000, now=1.0)
    fp.touch("me", 9000, now=2.0)
    fp.touch("new", 1000, now=3.0)
    fp.others_tokens("me", 3.0)
    assert fp.displaced("me", 0) == 0
    assert fp.displaced("me", 2000) == 3000  # "old" goes whole
    assert fp.displaced("me", 3001) == 53_000  # then "mid"
    assert fp.displaced("me", 3001, cap=10_000) == 13_000  # each one at most the cap
    assert fp.displaced("me", 60_000) == 54_000  # "me" itself is skipped
    # a session that has moved elsewhere frees its tokens at no charge
    homes = {"mid": 1, "old": 0}
    assert fp.displaced("me", 3001, home_of=homes.get, here=0) == 3000


def test_live_sessions_counts_recent_others_not_bound_elsewhere():
    fp = SessionFootprint(horizon_s=300.0)
    fp.touch("old", 10, now=0.0)
    fp.touch("a", 10, now=50.0)
    fp.touch("me", 10, now=55.0)
    fp.touch("b", 10, now=60.0)
    assert fp.live_sessions("me", since=40.0) == 2  # a, b ("old" is before since)
    assert fp.live_sessions(None, since=0.0) == 4
    assert fp.live_sessions("me", since=40.0, home_of={"a": 1, "b": 0}.get, here=0) == 1
    assert fp.live_sessions("me", since=61.0) == 0


def test_sessions_past_the_capacity_are_out_already_and_cost_nothing():
    fp = SessionFootprint(horizon_s=100.0)
    fp.touch("gone", 3000, now=0.0)  # long pushed out by the newer ones
    fp.touch("old", 4000, now=1.0)
    fp.touch("new", 4000, now=2.0)
    fp.others_tokens("me", 2.0)
    assert fp.displaced("me", 1000, skip=3000) == 4000  # "old" is the oldest still held
    assert fp.displaced("me", 1000, skip=5000) == 2000  # half of "old" is gone already
    # 11k warm + 1k prompt in a capacity of 8k: 4k over, the prompt inserts 1k of them;
    # the oldest 3k ("gone") were out already, so the 1k push out "old"
    assert fp.pushed_out("me", 1000, 1000, 8000, 2.0) == 4000
    assert fp.pushed_out("me", 1000, 1000, 11_000, 2.0) == 3000  # all fit but 1k: "gone"

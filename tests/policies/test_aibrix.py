"""aibrix: AIBrix prefix-cache: running-count filter, match %, mean + stddev, TTL'd index."""

from __future__ import annotations

import math

import pytest

from policies.aibrix import AIBrixPicker
from policies.base import RequestFeatures

BLOCK = 512


def _request(blocks, arrival=0.0) -> RequestFeatures:
    return RequestFeatures(list(blocks), len(blocks) * BLOCK, arrival=arrival)


def _seed(picker, request, workers, target):
    for i, w in enumerate(workers):
        w.healthy = i == target
    assert picker.pick(request, workers).worker == target
    for w in workers:
        w.healthy = True


def _fleet(idle_fleet, picker, running):
    """Workers 0 and 2 hold blocks 1..4 and 1..2; then running counts as given."""
    workers = idle_fleet(len(running))
    _seed(picker, _request([1, 2, 3, 4]), workers, 0)
    _seed(picker, _request([1, 2]), workers, 2)
    for w, count in zip(workers, running, strict=True):
        w.num_requests = count
    return workers


def test_match_percent_per_pod(idle_fleet):
    picker = AIBrixPicker()
    _fleet(idle_fleet, picker, [0, 0, 0, 0])
    assert picker.match([1, 2, 3, 4], None, [0, 1, 2, 3]) == {0: 100, 2: 50}
    assert picker.match([1, 2, 3], None, [1, 2, 3]) == {2: 66}  # integer percent


def test_imbalance_over_8_keeps_only_the_least_running(idle_fleet):
    # max - min = 8: no filter; w0 100% (8 > mean 4 + sqrt(8)), w2 50% (4 <= 6.83)
    picker = AIBrixPicker()
    pick = picker.pick(_request([1, 2, 3, 4]), _fleet(idle_fleet, picker, [8, 0, 4, 4]))
    assert (pick.worker, pick.branch) == (2, "prefix_match")
    # max - min = 9: only worker 1 is kept, and it holds nothing
    picker = AIBrixPicker()
    pick = picker.pick(_request([1, 2, 3, 4]), _fleet(idle_fleet, picker, [9, 0, 4, 4]))
    assert (pick.worker, pick.branch) == (1, "least_request")


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ([5, 0, 4, 4], 0),  # mean 3.25, stddev 1.92: 5 <= 5.17, the best match wins
        ([6, 0, 4, 4], 2),  # mean 3.5, stddev 2.18: 6 > 5.68, the next one (50%) within it
    ],
)
def test_mean_plus_one_stddev_rule(idle_fleet, running, expected):
    counts = running
    mean = sum(counts) / 4
    bound = mean + math.sqrt(sum((c - mean) ** 2 for c in counts) / 4)
    assert (counts[0] <= bound) == (expected == 0)
    picker = AIBrixPicker()
    pick = picker.pick(_request([1, 2, 3, 4]), _fleet(idle_fleet, picker, running))
    assert (pick.worker, pick.branch) == (expected, "prefix_match")


def test_every_match_over_the_bound_falls_back_to_the_least_running(idle_fleet):
    picker = AIBrixPicker()
    workers = _fleet(idle_fleet, picker, [7, 0, 7, 0])  # mean 3.5, stddev 3.5: 7 <= 7
    assert picker.pick(_request([1, 2, 3, 4]), workers).worker == 0
    picker = AIBrixPicker(stddev_factor=0.5)  # bound 3.5 + 1.75: both holders (7) over it
    pick = picker.pick(_request([1, 2, 3, 4]), _fleet(idle_fleet, picker, [7, 0, 7, 0]))
    assert pick.branch == "least_request"
    assert pick.worker in (1, 3)


def test_equal_matches_are_drawn_at_random(idle_fleet):
    chosen = set()
    for seed in range(20):
        picker = AIBrixPicker(seed=seed)
        workers = idle_fleet(3)
        for target in range(3):
            _seed(picker, _request([1, 2]), workers, target)
        chosen.add(picker.pick(_request([1, 2, 3]), workers).worker)
    assert chosen == {0, 1, 2}


def test_entries_live_20_minutes_from_their_last_write(idle_fleet):
    picker = AIBrixPicker()
    now = [0.0]
    picker.clock = lambda: now[0]
    workers = idle_fleet(2)
    workers[1].num_requests = 0
    _seed(picker, RequestFeatures([1, 2], 2 * BLOCK), workers, 1)
    workers[0].num_requests, workers[1].num_requests = 0, 1
    now[0] = 1200.0  # exactly the TTL: still there (AIBrix drops entries older than it)
    assert picker.pick(RequestFeatures([1, 2], 2 * BLOCK), workers).worker == 1
    now[0] = 2400.5  # 1200.5 s after that pick's write
    pick = picker.pick(RequestFeatures([1, 2], 2 * BLOCK), workers)
    assert (pick.worker, pick.branch) == (0, "least_request")


def test_request_arrival_wins_over_the_clock(idle_fleet):
    picker = AIBrixPicker(ttl_s=10.0)
    picker.clock = lambda: 0.0
    workers = idle_fleet(2)
    _seed(picker, _request([1, 2], arrival=0.0), workers, 1)
    assert picker.pick(_request([1, 2], arrival=11.0), workers).branch == "least_request"


def test_the_index_spans_its_bytes_in_our_blocks(idle_fleet):
    # 200,000 entries of 4 bytes at 4 bytes a token: 200,000 tokens, 390 blocks of 512
    assert AIBrixPicker().capacity_blocks(512) == 390
    picker = AIBrixPicker(block_number=2 * 512)  # two of our blocks
    workers = idle_fleet(2)
    _seed(picker, _request([1, 2, 3]), workers, 0)
    assert len(picker.index) == 2
    assert picker.match([2, 3], None, [0, 1]) == {0: 100}
    assert picker.match([1, 2, 3], None, [0, 1]) == {}  # block 1, written first, is gone

"""vllm_router: vllm-router 0.1.17's cache_aware, worked by hand: sgl-router's classic rule
with a miss sent to the least loaded worker instead of the smallest tree."""

from __future__ import annotations

import numpy as np

from policies.registry import make_picker
from policies.sglang_cache_aware import SGLangCacheAwarePicker
from policies.vllm_router import VLLMRouterCacheAwarePicker


def test_misses_go_to_the_least_loaded_not_the_smallest_tree(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = VLLMRouterCacheAwarePicker()
    classic = SGLangCacheAwarePicker()
    requests = [request_for(blocks) for blocks in ([1, 2, 3, 4], [9, 8, 7, 6], [20, 21])]
    # idle fleet: every miss to the first worker, whose tree grows (4, then 8, 10 blocks)
    assert [(p.worker, p.branch) for p in (picker.pick(r, workers) for r in requests)] == [
        (0, "least_load"),
        (0, "least_load"),
        (0, "least_load"),
    ]
    # sgl-router 0.3.2 spreads the same misses by tree size: 0, 1, 2
    assert [classic.pick(r, workers).worker for r in requests] == [0, 1, 2]


def test_a_miss_follows_the_router_in_flight_counts(idle_fleet, request_for):
    workers = idle_fleet(3)
    workers[0].num_requests, workers[1].num_requests, workers[2].num_requests = 3, 1, 1
    pick = VLLMRouterCacheAwarePicker().pick(request_for([5, 6]), workers)
    assert (pick.worker, pick.branch) == (1, "least_load")  # loads 3, 1, 1: first of the 1s


def test_a_hit_above_the_threshold_goes_to_the_deepest_holder(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = VLLMRouterCacheAwarePicker()
    picker.pick(request_for([1, 2, 3, 4]), workers)  # tree 0: blocks 1..4
    workers[0].num_requests = 5  # busier, but 5 - 0 = 5 <= 64: balanced
    pick = picker.pick(request_for([1, 2, 3, 4, 5]), workers)
    assert (pick.worker, pick.branch) == (0, "cache_match")  # 4/5 > 0.3
    # 3 of 10 blocks: 0.3 is not > 0.3: a miss, to the least loaded (worker 1)
    pick = picker.pick(request_for([1, 2, 3, *range(50, 57)]), workers)
    assert (pick.worker, pick.branch) == (1, "least_load")
    # the miss was inserted into worker 1's tree: 10 blocks of 2 pseudo-tokens
    assert [t.total_tokens for t in picker.trees(request_for(), 2)] == [10, 20]


def test_imbalance_needs_both_thresholds_over_every_worker(worker, request_for):
    def pick_with(loads, healthy=None):
        workers = [worker(n) for n in loads]
        for i, ok in enumerate(healthy or [True] * len(loads)):
            workers[i].healthy = ok
        picker = VLLMRouterCacheAwarePicker()
        picker.trees(request_for(), len(workers))[0].insert(
            np.asarray([1, 2, 3, 4], dtype="<u8").tobytes()
        )
        return picker.pick(request_for([1, 2, 3, 4]), workers)

    # 100 - 30 = 70 > 64 and 100 > 45: shortest queue despite worker 0's match
    assert (pick_with([100, 30]).worker, pick_with([100, 30]).branch) == (1, "imbalance")
    assert pick_with([100, 36]).branch == "cache_match"  # 64 is not > 64
    assert pick_with([200, 134]).branch == "cache_match"  # 200 <= 1.5 * 134
    # an unhealthy worker's count still enters max - min (vllm-router folds every worker):
    # loads 10 (match), 80 (down), 12: 80 - 10 = 70 > 64 and 80 > 15: the least loaded
    # healthy worker, worker 0 itself
    pick = pick_with([10, 80, 12], healthy=[True, False, True])
    assert (pick.worker, pick.branch) == (0, "imbalance")
    pick = pick_with([12, 80, 10], healthy=[True, False, True])
    assert (pick.worker, pick.branch) == (2, "imbalance")


def test_tree_holds_half_sgl_routers_characters(request_for):
    picker = make_picker("vllm_router")
    assert isinstance(picker, VLLMRouterCacheAwarePicker)
    assert picker.max_tree_size == 2**25
    assert picker.capacity_tokens == 2**23  # 4 characters a token
    # a tree of 8192 characters (2048 tokens, 4 blocks) forgets the oldest prefix
    tree = VLLMRouterCacheAwarePicker(max_tree_size=8192).trees(request_for(), 1)[0]
    tree.insert(np.asarray([1, 2, 3, 4], dtype="<u8").tobytes())
    tree.insert(np.asarray([5, 6], dtype="<u8").tobytes())
    assert tree.total_tokens == 4  # [5, 6] as 2 pseudo-tokens each; [1..4] trimmed


def test_exact_tokens_when_present(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = VLLMRouterCacheAwarePicker()
    tokens = np.arange(1000, dtype="<u4")
    picker.pick(request_for([1], tokens=tokens.tobytes()), workers)
    workers[0].num_requests = 1
    # 400 of 1000 tokens shared (0.4 > 0.3): worker 0 though worker 1 is idler
    other = np.concatenate([tokens[:400], np.arange(5000, 5600, dtype="<u4")])
    pick = picker.pick(request_for([2], tokens=other.tobytes()), workers)
    assert (pick.worker, pick.branch) == (0, "cache_match")
    # 200 of 1000: a miss, to the idle worker 1
    third = np.concatenate([tokens[:200], np.arange(7000, 7800, dtype="<u4")])
    pick = picker.pick(request_for([3], tokens=third.tobytes()), workers)
    assert (pick.worker, pick.branch) == (1, "least_load")


def test_unhealthy_workers_take_nothing(worker, request_for):
    picker = VLLMRouterCacheAwarePicker()
    workers = [worker(), worker(), worker()]
    picker.pick(request_for([1, 2, 3, 4]), workers)  # tree 0 holds the prefix
    workers[0].healthy = False
    pick = picker.pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.branch) == (1, "least_load")
    assert [t.total_tokens for t in picker.trees(request_for(), 3)] == [8, 8, 0]

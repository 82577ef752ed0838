"""sglang_cache_aware: SGLang's documented cache_aware algorithm on per-worker trees."""

from __future__ import annotations

import numpy as np

from policies.sglang_cache_aware import SGLangCacheAwarePicker


def test_fresh_fleet_new_prefixes_go_to_the_smallest_tree(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = SGLangCacheAwarePicker()
    picks = [
        picker.pick(request_for(blocks), workers)
        for blocks in ([1, 2, 3, 4], [9, 8, 7, 6], [1, 2, 3, 4, 5], [20, 21])
    ]
    # all empty: first worker; then worker 1 (tree 0 holds 4 blocks); then a 4/5 match
    # on worker 0; then tree sizes are 5, 4, 0 blocks: worker 2
    assert [(p.worker, p.branch) for p in picks] == [
        (0, "smallest_tree"),
        (1, "smallest_tree"),
        (0, "cache_match"),
        (2, "smallest_tree"),
    ]


def test_light_load_sends_every_prefix_sharing_a_system_prompt_to_one_worker(
    idle_fleet, request_for
):
    workers = idle_fleet(4)
    picker = SGLangCacheAwarePicker()
    system = [100, 101, 102]
    picks = [picker.pick(request_for([*system, 1000 + i]), workers) for i in range(8)]
    # 3/4 matched > 0.3 every time after the first: one worker takes them all
    assert {p.worker for p in picks} == {0}
    assert [p.branch for p in picks[1:]] == ["cache_match"] * 7


def test_match_rate_exactly_threshold_is_not_a_match(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = SGLangCacheAwarePicker()
    picker.pick(request_for([1, 2, 3, 4]), workers)  # tree 0: blocks 1..4
    # 3 of 10 blocks match: 0.3 is not > 0.3 -> smallest tree (worker 1)
    pick = picker.pick(request_for([1, 2, 3, *range(50, 57)]), workers)
    assert (pick.worker, pick.branch) == (1, "smallest_tree")
    # 4 of 10 match: 0.4 > 0.3
    pick = picker.pick(request_for([1, 2, 3, 4, *range(60, 66)]), workers)
    assert (pick.worker, pick.branch) == (0, "cache_match")


def test_imbalance_needs_both_thresholds(worker, request_for):
    def pick_with(loads):
        workers = [worker(n) for n in loads]
        picker = SGLangCacheAwarePicker()
        picker.trees(request_for(), len(workers))[0].insert(
            np.asarray([1, 2, 3, 4], dtype="<u8").tobytes()
        )
        return picker.pick(request_for([1, 2, 3, 4]), workers)

    # 100 - 30 = 70 > 64 and 100 > 1.5 * 30: shortest queue, despite worker 0's match
    assert (pick_with([100, 30]).worker, pick_with([100, 30]).branch) == (1, "imbalance")
    # 100 - 36 = 64, not > 64: balanced, cache match wins
    assert pick_with([100, 36]).branch == "cache_match"
    # 200 - 134 = 66 > 64 but 200 <= 1.5 * 134 = 201: balanced
    assert pick_with([200, 134]).branch == "cache_match"
    # shortest queue ties go to the first worker
    assert pick_with([200, 10, 10]).worker == 1


def test_tree_outlives_the_real_cache(worker, request_for):
    # the tree is sized to 2**26 characters, not to the worker's KV cache: after the worker
    # evicted the prefix (its view is cold), SGLang still routes by its stale match
    workers = [worker(), worker()]
    picker = SGLangCacheAwarePicker()
    picker.pick(request_for([1, 2, 3, 4]), workers)
    workers[1].cached = {1, 2, 3, 4}  # where the prefix really is now
    pick = picker.pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.branch) == (0, "cache_match")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)
    assert picker.capacity_tokens == 2**24
    assert picker.trees(request_for(), 2)[0].capacity_tokens == 2**24 // 512 * 2


def test_small_tree_forgets_oldest_prefix(worker, request_for):
    # 8192 characters / 4 per token = 2048 tokens = 4 blocks per tree
    picker = SGLangCacheAwarePicker(max_tree_size=8192)
    workers = [worker()]
    picker.pick(request_for([1, 2, 3, 4]), workers)
    picker.pick(request_for([5, 6]), workers)  # 6 blocks > 4: the older prefix goes
    tree = picker.trees(request_for(), 1)[0]
    assert tree.total_tokens == 4  # [5, 6] as 2 pseudo-tokens each
    assert picker.pick(request_for([1, 2, 3, 4]), workers).branch == "smallest_tree"


def test_exact_tokens_when_present(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = SGLangCacheAwarePicker()
    tokens = np.arange(1000, dtype="<u4")
    picker.pick(request_for([1], tokens=tokens.tobytes()), workers)
    # 400 of 1000 tokens shared (0.4 > 0.3), though the block keys differ entirely
    other = np.concatenate([tokens[:400], np.arange(5000, 5600, dtype="<u4")])
    pick = picker.pick(request_for([2], tokens=other.tobytes()), workers)
    assert (pick.worker, pick.branch) == (0, "cache_match")
    assert picker.trees(request_for(tokens=b""), 2)[0].total_tokens == 1600


def test_unhealthy_workers_are_ignored(worker, request_for):
    picker = SGLangCacheAwarePicker()
    workers = [worker(), worker(), worker()]
    picker.pick(request_for([1, 2, 3, 4]), workers)  # tree 0 holds the prefix
    workers[0].healthy = False
    workers[0].num_requests = 1000  # would make the fleet imbalanced if it counted
    pick = picker.pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.branch) == (1, "smallest_tree")
    trees = picker.trees(request_for(), 3)
    assert [t.total_tokens for t in trees] == [8, 8, 0]  # inserted into the chosen tree only

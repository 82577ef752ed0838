"""llmd: llm-d's default profile (queue 2 + kv 2 + prefix 3) over its approximate index."""

from __future__ import annotations

import pytest

from policies.llmd import LLMDPicker, PodLRU, queue_scores


def _pod(worker, waiting=0, usage=0.0, **kw):
    view = worker(**kw)
    view.num_requests_waiting, view.kv_usage_fraction = waiting, usage
    return view


def _route_alone(picker, request, pods, target):
    """Pick ``request`` with only ``pods[target]`` healthy: the index learns it there."""
    for i, pod in enumerate(pods):
        pod.healthy = i == target
    assert picker.pick(request, pods).worker == target
    for pod in pods:
        pod.healthy = True


def test_hand_computed_totals(worker, request_for):
    pods = [_pod(worker, waiting=0, usage=0.2), _pod(worker, waiting=4, usage=0.6)]
    picker = LLMDPicker()
    _route_alone(picker, request_for([1, 2]), pods, 1)  # pod 1's index: blocks 1, 2
    request = request_for([1, 2, 3, 4])
    scores, _ = picker.prefix_scores(request, pods, [0, 1], [0, 0])
    assert scores == [0.0, 0.5]  # 2 of 4 blocks
    # pod 0: 2*1 + 2*0.8 + 3*0 = 3.6; pod 1: 2*0 + 2*0.4 + 3*0.5 = 2.3
    assert picker.pick(request, pods).worker == 0
    # same queues: pod 0: 2 + 1.6 + 0 = 3.6; pod 1: 2 + 0.8 + 3*0.5 = 4.3
    pods[1].num_requests_waiting = 0
    picker = LLMDPicker()
    _route_alone(picker, request_for([1, 2]), pods, 1)
    pick = picker.pick(request, pods)
    assert (pick.worker, pick.branch) == (1, "max_score")


def test_queue_scorer_is_min_max_normalised():
    assert queue_scores([0, 4, 2]) == [1.0, 0.0, 0.5]
    assert queue_scores([3, 3]) == [1.0, 1.0]


def test_walk_credits_every_pod_holding_a_block_until_no_pod_holds_one(worker, request_for):
    pods = [_pod(worker), _pod(worker), _pod(worker)]
    picker = LLMDPicker()
    _route_alone(picker, request_for([1, 3]), pods, 0)
    _route_alone(picker, request_for([1, 2]), pods, 1)
    _route_alone(picker, request_for([5]), pods, 2)
    scores, _ = picker.prefix_scores(request_for([1, 2, 3, 4, 5]), pods, [0, 1, 2], [0] * 3)
    # block 1: pods 0, 1; block 2: pod 1; block 3: pod 0; block 4: nobody -> stop (5 unseen)
    assert scores == [2 / 5, 2 / 5, 0.0]


def test_ties_fall_at_random_and_a_seed_reproduces_them(worker, request_for):
    def first_picks(seed):
        picker = LLMDPicker(seed=seed)
        pods = [_pod(worker) for _ in range(4)]
        return [picker.pick(request_for([100 + k]), pods) for k in range(8)]

    picks = first_picks(0)
    assert {p.branch for p in picks} == {"max_score_tie"}  # all cold, idle: equal totals
    assert [p.worker for p in picks] == [p.worker for p in first_picks(0)]
    assert len({first_picks(seed)[0].worker for seed in range(20)}) > 1


def test_lookups_do_not_refresh_and_adds_evict_the_oldest():
    lru = PodLRU()
    lru.add([1, 2], capacity=2)
    assert 1 in lru  # a lookup: 1 stays the oldest
    lru.add([3], capacity=2)
    assert (1 in lru, 2 in lru, 3 in lru) == (False, True, True)
    lru.add([2, 4], capacity=2)  # 2 refreshed by the add, 3 goes
    assert (3 in lru, len(lru)) == (False, 2)


@pytest.mark.parametrize(
    ("kv_capacity", "engine_block", "expected"),
    [
        (
            1 << 20,
            None,
            (1 << 20) // 16 * 64 // 512,
        ),  # num_gpu_blocks of 16 tokens, 64-token blocks
        (1 << 20, 128, (1 << 20) // 128 * 128 // 512),  # the pod's block over 64
        (0, None, 31_250 * 64 // 512),  # unknown: llm-d's 31,250
    ],
)
def test_capacity_is_num_gpu_blocks_of_llmd_blocks(worker, kv_capacity, engine_block, expected):
    pod = worker()
    pod.kv_capacity_tokens, pod.worker_block_size = kv_capacity, engine_block
    assert LLMDPicker().pod_capacity(pod, 512) == expected


def test_index_is_bounded_by_the_capacity(worker, request_for):
    pods = [_pod(worker)]
    picker = LLMDPicker(capacity_blocks=16)  # 16 entries of 64 tokens: two 512-token blocks
    picker.pick(request_for([1, 2, 3]), pods)
    scores, _ = picker.prefix_scores(request_for([1, 2, 3]), pods, [0], [0])
    assert scores == [0.0]  # block 1 (added first) was evicted: the walk stops at once
    assert picker.prefix_scores(request_for([2, 3]), pods, [0], [0])[0] == [1.0]

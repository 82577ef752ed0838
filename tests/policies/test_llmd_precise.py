"""llmd_precise: prefix 2 + kv 1 + queue 1 on the views' exact estimates."""

from __future__ import annotations

import pytest

from policies.llmd_precise import LLMDPrecisePicker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState


def _pod(worker, waiting, usage, cached=()):
    view = worker(cached=cached)
    view.num_requests_waiting, view.kv_usage_fraction = waiting, usage
    return view


def test_hand_computed_totals(worker, request_for):
    request = request_for([1, 2, 3, 4])
    # pod 1 holds the whole prompt: pod 0: 2*0 + 0.8 + 1 = 1.8; pod 1: 2*1 + 0.4 + 0 = 2.4
    pods = [_pod(worker, 0, 0.2), _pod(worker, 4, 0.6, cached=[1, 2, 3, 4])]
    pick = LLMDPrecisePicker().pick(request, pods)
    assert (pick.worker, pick.branch, pick.hit_tokens) == (1, "max_score", 4 * 512)
    # half of it: pod 1: 2*0.5 + 0.4 + 0 = 1.4 < 1.8
    pods[1].cached = {1, 2}
    assert LLMDPrecisePicker().pick(request, pods).worker == 0


def test_learns_nothing_from_its_own_picks(worker, request_for):
    pods = [_pod(worker, 0, 0.0) for _ in range(4)]
    picker = LLMDPrecisePicker(seed=3)
    picks = [picker.pick(request_for([1, 2, 3]), pods) for _ in range(40)]
    # the views stay cold, so every pick is a fresh random tie: no affinity
    assert {p.branch for p in picks} == {"max_score_tie"}
    assert len({p.worker for p in picks}) == 4


def _tiered_fleet(cpu_tier: bool) -> list[WorkerState]:
    """w0: blocks 1, 2 on the GPU and 3, 4 in its CPU tier; w1: blocks 1, 2, 3 on the GPU."""

    def state(name: str) -> WorkerState:
        cpu = BlockLRU(1000, 512) if cpu_tier else None
        return WorkerState(name=name, blocks=BlockLRU(1000, 512), cpu=cpu, kv_load_s_per_token=1e-5)

    fleet = [state("w0"), state("w1")]
    fleet[0].blocks.insert([1, 2])
    if cpu_tier:
        fleet[0].cpu.insert([3, 4])
    fleet[1].blocks.insert([1, 2, 3])
    return fleet


def test_a_block_in_the_cpu_tier_weighs_cpu_weight(request_for):
    request = request_for([1, 2, 3, 4])
    # idle pods: kv and queue score 1 each; prefix w0 (1024 + 0.8 * 1024) / 2048 = 0.9,
    # w1 1536 / 2048 = 0.75
    pick = LLMDPrecisePicker().pick(request, _tiered_fleet(cpu_tier=True))
    assert (pick.worker, pick.branch) == (0, "max_score")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (1024, 1536)  # the GPU hits, as tiered's
    # at 0.4 a CPU block weighs less: w0 (1024 + 0.4 * 1024) / 2048 = 0.7 < 0.75
    assert LLMDPrecisePicker(cpu_weight=0.4).pick(request, _tiered_fleet(cpu_tier=True)).worker == 1
    # without the tier w0 holds half the prompt
    assert LLMDPrecisePicker().pick(request, _tiered_fleet(cpu_tier=False)).worker == 1


def test_cpu_weight_is_a_fraction():
    with pytest.raises(ValueError, match="cpu_weight"):
        LLMDPrecisePicker(cpu_weight=1.5)

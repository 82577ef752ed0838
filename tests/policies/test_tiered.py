"""tiered: fixed credits per tier (vllm-router's kv_aware), costs worked by hand."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker, RequestFeatures
from policies.hits import estimate_tier_split
from policies.registry import PICKER_NAMES, make_picker, picker_params
from policies.tiered import HOST_CREDIT, TieredPicker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState

BLOCK = 512


def _state(name: str, tier: bool = True) -> WorkerState:
    return WorkerState(
        name=name,
        blocks=BlockLRU(1000, BLOCK),
        cpu=BlockLRU(1000, BLOCK) if tier else None,
        kv_load_s_per_token=1e-5,
    )


def _fleet(tier: bool = True) -> list[WorkerState]:
    """w0: blocks 1, 2 on the GPU and 3, 4 in the CPU tier; w1: cold."""
    fleet = [_state("w0", tier), _state("w1", tier)]
    fleet[0].blocks.insert([1, 2])
    if tier:
        fleet[0].cpu.insert([3, 4])
    return fleet


def _request(blocks, input_length=None) -> RequestFeatures:
    length = len(blocks) * BLOCK if input_length is None else input_length
    return RequestFeatures(list(blocks), length)


def _costs(picker: TieredPicker, request: RequestFeatures, fleet) -> list[float]:
    hits, cpu_hits, _ = estimate_tier_split(request, fleet)
    return picker.costs(request, fleet, hits, cpu_hits or [0] * len(hits))


def test_costs_by_hand():
    fleet = _fleet()
    r = _request([1, 2, 3, 4])
    # w0: credit (1024 + 0.8 * 1024) / 512 = 3.6, prefill 4 - 3.6 = 0.4, decode 0 + 4 new
    # w1: prefill 4, decode 4
    assert _costs(TieredPicker(), r, fleet) == pytest.approx([4.4, 8.0])
    pick = TieredPicker().pick(r, fleet)
    assert (pick.worker, pick.branch) == (0, "cost")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (1024, 1024)  # the GPU hits


def test_costs_count_pending_prefill_and_active_blocks():
    fleet = _fleet()
    fleet[0].book(_request([10, 11]), 16, now=0.0)  # 1024 pending, blocks 10, 11 active
    fleet[1].book(_request([3, 20]), 16, now=0.0)  # 1024 pending, blocks 3, 20 active
    r = _request([1, 2, 3, 4])
    # w0: 0.4 + 2 pending; decode 2 active + 4 new -> 8.4
    # w1: 4 + 2 pending; decode 2 active + 3 new (3 is active there) -> 11
    assert _costs(TieredPicker(), r, fleet) == pytest.approx([8.4, 11.0])
    # a prompt shorter than its credited overlap: no negative prefill
    short = _request([1, 2, 3, 4], input_length=1500)
    # w0: 2 + max(1500/512 - 3.6, 0) = 2; decode 6 -> 8
    assert _costs(TieredPicker(), short, fleet)[0] == pytest.approx(8.0)


@pytest.mark.parametrize(
    ("host_credit", "scale", "expected_w0"),
    [
        (0.0, 1.0, 2.0 + 4.0),  # the CPU tier counts for nothing: GPU overlap only
        (0.5, 1.0, 1.0 + 4.0),
        (1.0, 1.0, 0.0 + 4.0),  # a CPU hit as good as a GPU hit
        (0.8, 2.0, 0.8 + 4.0),
        (0.8, 0.0, 4.0),
    ],
)
def test_host_credit_and_prefill_scale(host_credit, scale, expected_w0):
    picker = TieredPicker(host_credit=host_credit, prefill_load_scale=scale)
    costs = _costs(picker, _request([1, 2, 3, 4]), _fleet())
    assert costs == pytest.approx([expected_w0, scale * 4.0 + 4.0])


def test_host_credit_decides_between_gpu_and_cpu_overlap():
    """w0 holds 2 blocks on the GPU, w1 all 4 in its CPU tier: the credit picks."""
    fleet = [_state("w0"), _state("w1")]
    fleet[0].blocks.insert([1, 2])
    fleet[1].cpu.insert([1, 2, 3, 4])
    r = _request([1, 2, 3, 4])
    # w0: 2 + 4 = 6; w1: 4 - 4 * credit + 4
    assert TieredPicker(host_credit=0.8).pick(r, fleet).worker == 1  # 4.8 < 6
    assert TieredPicker(host_credit=0.25).pick(r, fleet).worker == 0  # 7 > 6


def test_tier_blind_views_use_the_gpu_hit_only():
    blind = _fleet(tier=False)
    assert not blind[0].tiered
    r = _request([1, 2, 3, 4])
    assert _costs(TieredPicker(), r, blind) == pytest.approx([6.0, 8.0])  # Dynamo's classic
    # a view with a tier shadow but no load rate is tier-blind too
    fleet = _fleet()
    fleet[0].kv_load_s_per_token = 0.0
    assert _costs(TieredPicker(), r, fleet) == pytest.approx([6.0, 8.0])


def test_fake_views_without_tiers(worker, request_for):
    fleet = [worker(cached=(1, 2)), worker(pending=1024)]
    r = request_for([1, 2, 3])
    # fakes hold no active blocks: every request block is new
    assert _costs(TieredPicker(), r, fleet) == pytest.approx([1.0 + 3.0, 2.0 + 3.0 + 3.0])


def test_unhealthy_workers_cost_inf_and_are_never_picked():
    fleet = _fleet()
    fleet[0].healthy = False
    r = _request([1, 2, 3, 4])
    assert TieredPicker().pick(r, fleet).worker == 1
    fleet[1].healthy = False
    with pytest.raises(NoHealthyWorker):
        TieredPicker().pick(r, fleet)


def test_ties_at_random_seeded():
    cold = [_state(f"w{i}") for i in range(4)]
    r = _request([1, 2])
    picks = [TieredPicker(seed=s).pick(r, cold) for s in range(20)]
    assert {p.branch for p in picks} == {"cost_tie"}
    assert len({p.worker for p in picks}) > 1
    a, b = TieredPicker(seed=3), TieredPicker(seed=3)
    assert [a.pick(r, cold).worker for _ in range(8)] == [b.pick(r, cold).worker for _ in range(8)]


@pytest.mark.parametrize(
    "kwargs",
    [{"host_credit": -0.1}, {"host_credit": 1.5}, {"prefill_load_scale": -1.0}],
)
def test_validation(kwargs):
    with pytest.raises(ValueError):
        TieredPicker(**kwargs)


def test_registry():
    assert "tiered" in PICKER_NAMES
    picker = make_picker("tiered", host_credit=0.75)
    assert isinstance(picker, TieredPicker) and picker.name == "tiered"
    assert picker.host_credit == 0.75
    assert picker_params("tiered")["host_credit"] == HOST_CREDIT == 0.8

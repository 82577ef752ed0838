"""ttft with CPU KV tiers: a CPU-tier hit costs its load time, not a recompute."""

from __future__ import annotations

import pytest

from policies.base import RequestFeatures
from policies.hits import estimate_hits, estimate_tier_hits
from policies.ttft import CHUNK_TOKENS, TTFTPicker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState
from router.cache.workload import STEP_OVERHEAD_S

BLOCK = 512
RATE = 15_000.0  # WorkerState's default (configured) prefill rate
PROMPT = list(range(1, 9))  # 8 blocks, 4096 tokens


def _state(name: str, load_s: float = 1e-5, tier: bool = True, blocks: int = 1000):
    return WorkerState(
        name=name,
        blocks=BlockLRU(blocks, BLOCK),
        cpu=BlockLRU(blocks, BLOCK) if tier else None,
        kv_load_s_per_token=load_s,
    )


def _request(blocks=PROMPT, session=None) -> RequestFeatures:
    return RequestFeatures(list(blocks), len(blocks) * BLOCK, session)


def _idle_cost(uncached: int, load: float = 0.0) -> float:
    """An idle worker's predicted TTFT: its own prefill plus the step term, plus a load."""
    return uncached / RATE + (uncached / CHUNK_TOKENS + 1.0) * STEP_OVERHEAD_S + load


def _costs(picker: TTFTPicker, request: RequestFeatures, fleet) -> list[float]:
    hits, loads, _ = estimate_tier_hits(request, fleet)
    return picker.costs(request, fleet, hits, loads=loads)


def test_estimate_tier_hits_counts_the_cpu_part_and_its_load():
    fleet = [_state("w0"), _state("w1"), _state("w2", tier=False)]
    fleet[0].blocks.insert(PROMPT[:2])
    fleet[0].cpu.insert(PROMPT[2:6])
    fleet[2].blocks.insert(PROMPT[:3])
    hits, loads, best = estimate_tier_hits(_request(), fleet)
    assert hits == [6 * BLOCK, 0, 3 * BLOCK] and best == 6 * BLOCK
    assert loads == pytest.approx([4 * BLOCK * 1e-5, 0.0, 0.0])
    fleet[1].healthy = False
    hits, loads, _ = estimate_tier_hits(_request(), fleet)
    assert hits[1] < 0 and loads[1] == 0.0


def test_warm_in_cpu_beats_cold_idle_when_loading_is_cheaper():
    fleet = [_state("w0"), _state("w1")]
    fleet[0].cpu.insert(PROMPT)  # the whole prefix, in host memory only
    r = _request()
    load = 4096 * 1e-5
    assert _costs(TTFTPicker(), r, fleet) == pytest.approx([_idle_cost(0, load), _idle_cost(4096)])
    pick = TTFTPicker().pick(r, fleet)
    assert (pick.worker, pick.branch) == (0, "cost")
    assert pick.hit_tokens == 4096  # the CPU hit counts as a hit


def test_slow_link_prefers_recompute_elsewhere():
    slow = 1e-3  # > 1 / RATE: reloading a token costs more than computing it
    fleet = [_state("w0", load_s=slow), _state("w1", load_s=slow)]
    fleet[0].cpu.insert(PROMPT)
    r = _request()
    costs = _costs(TTFTPicker(), r, fleet)
    assert costs == pytest.approx([_idle_cost(0, 4096 * slow), _idle_cost(4096)])
    assert costs[0] > costs[1]
    assert TTFTPicker().pick(r, fleet).worker == 1


def test_partial_gpu_hit_with_cpu_continuation():
    fleet = [_state("w0"), _state("w1")]
    fleet[0].blocks.insert(PROMPT[:2])
    fleet[0].cpu.insert(PROMPT[2:5])
    fleet[1].blocks.insert(PROMPT[:4])  # a longer GPU hit, but a shorter total
    costs = _costs(TTFTPicker(), _request(), fleet)
    # w0: 5 blocks cached (3 of them loaded), 3 to compute; w1: 4 cached, 4 to compute
    assert costs == pytest.approx([_idle_cost(1536, 1536 * 1e-5), _idle_cost(2048)])
    assert TTFTPicker().pick(_request(), fleet).worker == 0


def test_tier_blind_views_give_the_old_costs_exactly():
    blind = [_state("w0", tier=False), _state("w1", tier=False)]
    plain = [WorkerState(name=f"w{i}", blocks=BlockLRU(1000, BLOCK)) for i in range(2)]
    for fleet in (blind, plain):
        fleet[0].blocks.insert(PROMPT[:3])
        fleet[1].book(_request([50, 51]), 64, now=0.0)  # busy: pending prefill, a request
    r = _request()
    hits, loads, best = estimate_tier_hits(r, blind)
    assert loads is None and (hits, best) == estimate_hits(r, blind)
    picker = TTFTPicker()
    old = picker.costs(r, plain, estimate_hits(r, plain)[0])
    assert _costs(picker, r, blind) == old
    assert old[0] == _idle_cost(5 * BLOCK)  # w0 idle, 3 blocks warm
    assert TTFTPicker().pick(r, blind).worker == TTFTPicker().pick(r, plain).worker == 0


def _crowded(tier: bool, load_s: float) -> list[WorkerState]:
    """Two 16-block workers; w0 holds another session's 6000 warm tokens (finished)."""
    fleet = [_state(f"w{i}", load_s=load_s, tier=tier, blocks=16) for i in range(2)]
    other = RequestFeatures(list(range(100, 112)), 6000, "other")
    fleet[0].book(other, 0, now=0.0).finish()
    fleet[1].book(RequestFeatures([200], 100, "third"), 0, now=0.0).finish()
    return fleet


@pytest.mark.parametrize("load_s", [1e-5, 1e-3])
def test_eviction_charge_at_the_reload_rate_when_cheaper(load_s):
    r = _request(session="new")  # 4096 cold tokens: 6000 + 4096 > 8192 on w0
    no_evict = TTFTPicker(eviction_weight=0.0)
    picker = TTFTPicker()
    blind = _crowded(tier=False, load_s=load_s)
    tiered = _crowded(tier=True, load_s=load_s)
    hits = [0, 0]
    base = no_evict.costs(r, blind, hits)
    blind_costs = picker.costs(r, blind, hits)
    pushed = (blind_costs[0] - base[0]) * RATE  # tokens the blind charge recomputes
    assert pushed > 0 and blind_costs[1] == base[1]
    tiered_costs = _costs(picker, r, tiered)
    per_token = min(1.0 / RATE, load_s)
    assert tiered_costs[0] == pytest.approx(base[0] + pushed * per_token)
    assert tiered_costs[1] == pytest.approx(base[1])

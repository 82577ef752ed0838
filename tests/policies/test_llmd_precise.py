"""llmd_precise: prefix 2 + kv 1 + queue 1 on the views' exact estimates."""

from __future__ import annotations

from policies.llmd_precise import LLMDPrecisePicker


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

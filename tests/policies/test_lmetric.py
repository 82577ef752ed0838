"""lmetric: hand-computed scores from seed 002 §1 and both tie rules."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker
from policies.lmetric import LMetricPicker


def test_smallest_score_wins_even_if_cold(worker, request_for):
    # input 2048 tokens = blocks 1..4
    workers = [
        worker(cached={1, 2, 3}, num_requests=3, pending=1000),  # (1000 + 512) * 3 = 4536
        worker(num_requests=2),  # (0 + 2048) * 2 = 4096  <- smallest
        worker(cached={1, 2, 3, 4}, num_requests=2, pending=3000),  # (3000 + 0) * 2 = 6000
    ]
    pick = LMetricPicker().pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.branch) == (1, "score")
    # routing loss is visible: the chosen worker is cold while another has it all
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)


def test_warm_worker_wins_at_equal_load(worker, request_for):
    workers = [worker(num_requests=1), worker(cached={1, 2}, num_requests=1)]
    # scores: 2048 * 1 vs (2048 - 1024) * 1
    pick = LMetricPicker().pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.hit_tokens, pick.best_hit_tokens) == (1, 1024, 1024)


def test_pending_prefill_counts(worker, request_for):
    workers = [
        worker(cached={1, 2, 3, 4}, num_requests=1, pending=5000),  # 5000
        worker(num_requests=1),  # 2048
    ]
    assert LMetricPicker().pick(request_for([1, 2, 3, 4]), workers).worker == 1


def test_new_prefill_never_negative(worker, request_for):
    # hit (2048) exceeds input_length (1500): new_prefill is 0, not -548
    workers = [
        worker(cached={1, 2, 3, 4}, num_requests=1, pending=100),  # (100 + 0) * 1 = 100
        worker(num_requests=1, pending=0),  # (0 + 1500) * 1 = 1500
    ]
    pick = LMetricPicker().pick(request_for([1, 2, 3, 4], input_length=1500), workers)
    assert pick.worker == 0


def test_idle_fleet_scores_zero_but_multikey_prefers_warm(worker, request_for):
    # every num_requests is 0, so every score is 0, cache hit or not
    workers = [worker(), worker(cached={1}), worker(cached={1, 2, 3}), worker()]
    picker = LMetricPicker()
    for _ in range(3):
        pick = picker.pick(request_for([1, 2, 3, 4]), workers)
        assert (pick.worker, pick.branch) == (2, "score")


def test_idle_fleet_first_tie_break_ignores_cache(worker, request_for):
    workers = [worker(), worker(cached={1, 2, 3, 4})]
    pick = LMetricPicker(tie_break="first").pick(request_for([1, 2, 3, 4]), workers)
    assert (pick.worker, pick.branch) == (0, "tie_first")
    assert (pick.hit_tokens, pick.best_hit_tokens) == (0, 2048)


def test_cold_idle_fleet_spreads_round_robin(idle_fleet, request_for):
    workers = idle_fleet(3)
    picker = LMetricPicker()
    picks = [picker.pick(request_for([i]), workers) for i in range(7)]
    assert [p.worker for p in picks] == [0, 1, 2, 0, 1, 2, 0]
    assert {p.branch for p in picks} == {"tie_rr"}


def test_first_tie_break_pins_worker_zero(idle_fleet, request_for):
    picker = LMetricPicker(tie_break="first")
    workers = idle_fleet(3)
    assert {picker.pick(request_for([i]), workers).worker for i in range(5)} == {0}


def test_round_robin_only_among_exact_ties(worker, request_for):
    # workers 1 and 3 tie on (score, new_prefill, num_requests) = (0, 2048, 0); 0 and 2 busier
    workers = [worker(num_requests=1), worker(), worker(num_requests=1), worker()]
    picker = LMetricPicker()
    assert [picker.pick(request_for(), workers).worker for _ in range(4)] == [1, 3, 1, 3]


def test_counter_advances_only_on_ties(worker, request_for):
    picker = LMetricPicker()
    tied = [worker(), worker()]
    assert picker.pick(request_for(), tied).worker == 0
    # a pick with a unique winner must not move the counter
    assert picker.pick(request_for(), [worker(num_requests=1), worker()]).branch == "score"
    assert picker.pick(request_for(), tied).worker == 1


def test_num_requests_is_third_key(worker, request_for):
    workers = [
        worker(num_requests=2, pending=0),  # (0 + 2048) * 2 = 4096, new_prefill 2048, n=2
        worker(num_requests=1, pending=2048),  # (2048 + 2048) * 1 = 4096, new_prefill 2048, n=1
    ]
    assert LMetricPicker().pick(request_for(), workers).worker == 1
    first = LMetricPicker(tie_break="first").pick(request_for(), workers)
    assert (first.worker, first.branch) == (0, "tie_first")


def test_unhealthy_worker_skipped_and_not_best(worker, request_for):
    workers = [worker(cached={1, 2, 3, 4}, healthy=False), worker(num_requests=4)]
    pick = LMetricPicker().pick(request_for(), workers)
    assert (pick.worker, pick.best_hit_tokens) == (1, 0)
    assert workers[0].estimate_calls == 0


def test_no_healthy_worker(worker, request_for):
    with pytest.raises(NoHealthyWorker):
        LMetricPicker().pick(request_for(), [worker(healthy=False)])
    with pytest.raises(NoHealthyWorker):
        LMetricPicker().pick(request_for(), [])


def test_estimate_called_once_per_worker(worker, request_for):
    workers = [worker(cached={1}), worker(), worker(num_requests=2)]
    LMetricPicker().pick(request_for(), workers)
    assert [w.estimate_calls for w in workers] == [1, 1, 1]


def test_unknown_tie_break_rejected():
    with pytest.raises(ValueError, match="multikey"):
        LMetricPicker(tie_break="lowest")  # type: ignore[arg-type]

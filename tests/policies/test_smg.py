"""smg: SMG 1.13 cache_aware: least-loaded deepest holder, load gate, misses least loaded."""

from __future__ import annotations

from policies.smg import SMGCacheAwarePicker


def _seed(picker, request, workers, targets):
    """Insert ``request`` into each target's tree (picked with only that worker healthy)."""
    for target in targets:
        for i, w in enumerate(workers):
            w.healthy = i == target
        assert picker.pick(request, workers).worker == target
    for w in workers:
        w.healthy = True


def test_misses_go_to_the_least_loaded_then_the_least_sent(idle_fleet, request_for):
    workers = idle_fleet(3)
    workers[0].num_requests = 2
    picker = SMGCacheAwarePicker()
    picks = [picker.pick(request_for([100 * k, 100 * k + 1]), workers) for k in range(1, 4)]
    # loads 2, 0, 0: worker 1, then worker 2 (worker 1 was sent one), then worker 1
    assert [(p.worker, p.branch) for p in picks] == [
        (1, "least_load"),
        (2, "least_load"),
        (1, "least_load"),
    ]


def test_a_hit_goes_to_the_least_loaded_holder_of_the_deepest_match(idle_fleet, request_for):
    workers = idle_fleet(4)
    picker = SMGCacheAwarePicker()
    _seed(picker, request_for([1, 2, 3, 4]), workers, [0, 1])
    _seed(picker, request_for([1, 2, 9]), workers, [2])  # a shallower match
    workers[0].num_requests, workers[1].num_requests = 3, 2
    pick = picker.pick(request_for([1, 2, 3, 4, 5]), workers)  # 4/5 > 0.3 on workers 0, 1
    assert (pick.worker, pick.branch) == (1, "cache_match")
    # at threshold exactly (3 of 10 blocks): not a hit -> least loaded (worker 2 or 3)
    pick = picker.pick(request_for([1, 2, 9, *range(50, 57)]), workers)
    assert pick.branch == "least_load"


def test_equal_holders_are_drawn_at_random(idle_fleet, request_for):
    chosen = set()
    for seed in range(20):
        workers = idle_fleet(3)
        picker = SMGCacheAwarePicker(seed=seed)
        _seed(picker, request_for([1, 2]), workers, [0, 1, 2])
        chosen.add(picker.pick(request_for([1, 2, 3]), workers).worker)
    assert chosen == {0, 1, 2}


def test_spill_needs_load_over_both_margins(idle_fleet, request_for):
    def pick_with(loads, **kw):
        workers = idle_fleet(len(loads))
        picker = SMGCacheAwarePicker(**kw)
        _seed(picker, request_for([1, 2, 3]), workers, [0])
        for w, load in zip(workers, loads, strict=True):
            w.num_requests = load
        return picker.pick(request_for([1, 2, 3]), workers)

    # avg = L / 4; spill iff L > 1.5 * L / 4 and L > L / 4 + 64, i.e. L > 85.33
    assert (pick_with([85, 0, 0, 0]).worker, pick_with([85, 0, 0, 0]).branch) == (0, "cache_match")
    assert (pick_with([86, 0, 0, 0]).worker, pick_with([86, 0, 0, 0]).branch) == (1, "spill")
    # avg 75: over the absolute margin (100 > 75 + 10) but not the relative one (100 <= 112.5)
    assert pick_with([100, 100, 100, 0], balance_abs_threshold=10).branch == "cache_match"
    # ... and with rel 1.3 (100 > 97.5) both: spill to worker 3
    pick = pick_with([100, 100, 100, 0], balance_abs_threshold=10, balance_rel_threshold=1.3)
    assert (pick.worker, pick.branch) == (3, "spill")


def test_spill_target_becomes_a_holder(idle_fleet, request_for):
    workers = idle_fleet(2)
    picker = SMGCacheAwarePicker(balance_abs_threshold=0, balance_rel_threshold=1.0)
    _seed(picker, request_for([1, 2]), workers, [0])
    workers[0].num_requests = 10  # avg 5: 10 > 5 and 10 > 5 + 0
    assert picker.pick(request_for([1, 2]), workers).branch == "spill"
    workers[0].num_requests = 0
    workers[1].num_requests = 1  # both hold it now: the least loaded holder, worker 0
    assert picker.pick(request_for([1, 2]), workers).worker == 0
    workers[0].num_requests = 2
    assert picker.pick(request_for([1, 2]), workers).worker == 1


def test_at_most_eight_holders_are_candidates(idle_fleet, request_for):
    workers = idle_fleet(10)
    picker = SMGCacheAwarePicker()
    _seed(picker, request_for([1, 2]), workers, range(10))
    for i, w in enumerate(workers):
        w.num_requests = 5 if i < 8 else 0  # avg 4: no spill for a load of 5
    picks = {picker.pick(request_for([1, 2]), workers).worker for _ in range(30)}
    assert picks <= set(range(8))

"""capped: the LMetric picker under its own label; the cap lives in the trace tools."""

from __future__ import annotations

from policies.capped import MAX_TURNS, CappedPicker
from policies.lmetric import LMetricPicker


def test_capped_picks_exactly_like_lmetric(worker, request_for):
    workers = [worker(1, cached={1}), worker(), worker(2, cached={1, 2, 3}), worker()]
    capped, lmetric = CappedPicker(), LMetricPicker()
    for blocks in ([1, 2], [5], [1, 2, 3, 4], [7], [8]):
        assert capped.pick(request_for(blocks), workers) == lmetric.pick(
            request_for(blocks), workers
        )


def test_capped_is_lmetric_with_its_own_name():
    picker = CappedPicker(tie_break="first")
    assert isinstance(picker, LMetricPicker)
    assert (picker.name, picker.tie_break) == ("capped", "first")
    assert MAX_TURNS == 8

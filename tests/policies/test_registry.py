"""The registry, and properties every registered picker must have."""

from __future__ import annotations

import random

import pytest

from policies.base import NoHealthyWorker
from policies.lmetric import LMetricPicker
from policies.registry import PICKER_NAMES, make_picker, picker_params
from policies.unified import UnifiedPicker


def test_names():
    assert set(PICKER_NAMES) == {
        "ttft",
        "lmetric",
        "load_only",
        "sticky",
        "unified",
        "capped",
        "round_robin",
        "random",
        "power_of_two",
        "sglang_cache_aware",
        "decode_load",
        "llmd",
        "llmd_precise",
        "dynamo",
        "smg",
        "aibrix",
        "tiered",
        "vllm_router",
    }


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown picker 'lmetrik'.*lmetric.*sglang_cache_aware"):
        make_picker("lmetrik")


def test_unknown_parameter_lists_accepted_ones():
    with pytest.raises(ValueError, match=r"overload_factr.*overload_factor"):
        make_picker("unified", overload_factr=3.0)


def test_parameters_are_forwarded():
    picker = make_picker("unified", overload_factor=3.0, tie_break="first", max_sessions=5)
    assert isinstance(picker, UnifiedPicker)
    assert (picker.overload_factor, picker.tie_break, picker.sessions.max_sessions) == (
        3.0,
        "first",
        5,
    )
    assert picker_params("lmetric") == {"tie_break": "multikey"}


def test_capped_builds_the_lmetric_picker():
    picker = make_picker("capped")
    assert isinstance(picker, LMetricPicker)
    assert picker.name == "capped"


def test_each_call_has_its_own_state():
    a, b = make_picker("sticky"), make_picker("sticky")
    assert a.sessions is not b.sessions


@pytest.mark.parametrize("name", PICKER_NAMES)
def test_name_matches(name):
    assert make_picker(name).name == name


@pytest.mark.parametrize("name", PICKER_NAMES)
def test_no_healthy_worker(name, worker, request_for):
    with pytest.raises(NoHealthyWorker):
        make_picker(name).pick(request_for(session="s"), [worker(healthy=False)] * 3)


@pytest.mark.parametrize("name", PICKER_NAMES)
def test_random_traffic_properties(name, worker, request_for):
    """Never an unhealthy worker, never a view mutated, hit report consistent."""
    rng = random.Random(name)
    picker = make_picker(name)
    workers = [worker() for _ in range(5)]
    for _ in range(300):
        for w in workers:
            w.num_requests = rng.randrange(0, 6)
            w.pending_prefill_tokens = rng.randrange(0, 4096)
            w.healthy = rng.random() > 0.3
            w.cached = {b for b in range(8) if rng.random() < 0.5}
        if not any(w.healthy for w in workers):
            workers[rng.randrange(5)].healthy = True
        blocks = list(range(rng.randrange(1, 8)))
        session = rng.choice([None, "a", "b", "c"])
        request = request_for(blocks, session=session)
        before = [
            (w.num_requests, w.pending_prefill_tokens, w.healthy, set(w.cached)) for w in workers
        ]
        calls = [w.estimate_calls for w in workers]
        pick = picker.pick(request, workers)
        # once per healthy worker, never for an unhealthy one
        assert [w.estimate_calls - c for w, c in zip(workers, calls, strict=True)] == [
            int(w.healthy) for w in workers
        ]
        after = [(w.num_requests, w.pending_prefill_tokens, w.healthy, w.cached) for w in workers]
        assert before == after
        assert workers[pick.worker].healthy
        hits = [w.estimate_cache_hit(blocks) for w in workers]
        assert pick.hit_tokens == hits[pick.worker]
        assert pick.best_hit_tokens == max(
            h for h, w in zip(hits, workers, strict=True) if w.healthy
        )
        assert isinstance(pick.branch, str) and pick.branch

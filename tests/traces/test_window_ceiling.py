"""bench/pickers/window_ceiling.py: a trace's load ceiling per window of its time."""

from __future__ import annotations

import pytest

from traces.sim.worker_model import WorkerModelConfig
from traces.trace.record import TraceRequest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("pickers/window_ceiling")


def test_the_busiest_window_sets_the_ceiling(bench) -> None:
    arrivals = [0.0, 1.0, 10.0, 11.0]
    work = [1.0, 1.0, 4.0, 4.0]
    # windows of 5 s from 0, 5, 10: work 2, 0, 8; two workers fill 10 worker-seconds
    assert bench.ceilings(arrivals, work, 2, 5.0) == (pytest.approx(1.25), 10.0)
    # the whole span (11 s) against all the work
    assert bench.ceilings(arrivals, work, 2, 1e9) == (pytest.approx(2.2), 0.0)
    # a trace that starts later: the same windows, shifted (the grid runs to its last arrival)
    later = [t + 100.0 for t in arrivals]
    assert bench.ceilings(later, work, 2, 5.0) == (pytest.approx(1.25), 110.0)


def test_work_counts_the_prefix_an_earlier_prompt_shared(bench) -> None:
    first = TraceRequest(0.0, "a", 1, 1024, 4, (1, 2))
    second = TraceRequest(1.0, "a", 2, 1536, 4, (1, 2, 3))
    flat = WorkerModelConfig(profile=None)
    prefill, decode = bench.request_work([first, second], flat)
    per_token = 1 / flat.prefill_tokens_per_s + flat.step_overhead_s / flat.chunk_tokens
    assert prefill == pytest.approx([1024 * per_token, 512 * per_token])
    assert decode == pytest.approx([4 * flat.decode_s_per_seq] * 2)
    measured = WorkerModelConfig()  # the default profile: the decode's context term
    _, decode = bench.request_work([first], measured)
    per_context = measured.profile.decode_per_context_token
    assert decode == pytest.approx([per_context * (1024 + 1025 + 1026 + 1027)])

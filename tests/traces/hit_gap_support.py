"""Hand-made fleets for the hit-gap tests: a picker that follows a script, and the timeline
that shows each cause once (tests/traces/test_miss_causes.py and test_hit_gap.py)."""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.record import TraceRequest
from traces.trace.run import PolicyRun


class Scripted:
    """Picks the given workers in order, one per request."""

    name = "scripted"
    needs = ()  # reads no optional capability

    def __init__(self, workers: Sequence[int]) -> None:
        self.workers = list(workers)

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        return Pick(self.workers.pop(0), "scripted")


def req(
    at: float,
    blocks: Sequence[int],
    length: int,
    output: int = 1,
    session: str = "",
    priority: int = 0,
) -> TraceRequest:
    return TraceRequest(at, session, 0, length, output, tuple(blocks), priority=priority)


def run(
    trace: list[TraceRequest],
    picks: Sequence[int],
    workers: int,
    kv_tokens: int = 262_144,
    cpu_tokens: int = 0,
    **more,
) -> PolicyRun:
    """``trace`` on ``workers`` default worker models of ``kv_tokens`` KV (and a CPU tier of
    ``cpu_tokens``), ``picks`` routing, the ledger on."""
    worker = WorkerModelConfig(
        profile=None, kv_capacity_tokens=kv_tokens, cpu_kv_capacity_tokens=cpu_tokens
    )  # the flat model: the timelines below are its arithmetic
    config = SimConfig(workers=workers, worker=worker, hit_gap=True, **more)
    return simulate(trace, Scripted(picks), config)


# Two workers of the default model (15,000 prefill tokens/s, 12 ms a step, 8,192-token
# chunks). Times are when each request is admitted.
TIMELINE = [
    req(0.0, range(1, 5), 2_048),  # 0 -> w0, prefilled by 0.149
    req(1.0, range(1, 7), 3_072),  # 1 -> w1 at 1.0: blocks 1-4 sit on w0 (elsewhere)
    req(2.0, range(10, 26), 8_192),  # 2 -> w0, prefilling until 2.558
    req(2.1, range(10, 27), 8_704),  # 3 -> w1 at 2.1: 10-25 still prefilling on w0
    req(3.0, range(1000, 1064), 32_768),  # 4 -> w0, its first chunk until 3.558
    req(3.1, range(40, 44), 2_048),  # 5 -> w0: waits for 3.558's boundary
    req(3.2, range(40, 45), 2_560),  # 6 -> w1 at 3.2: 40-43 only in 5, queued on w0
]
TIMELINE_PICKS = [0, 1, 0, 1, 0, 0, 1]

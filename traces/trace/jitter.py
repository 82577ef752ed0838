"""Replays of one trace with jittered arrivals: the same requests and offered load, each
arrival moved a little.

Near a fleet's knee a tail percentile turns on how a recording's bursts happen to land: one
load holds and a load 1% higher or lower fails (bench/results/capacity_dense-h100.md). A
reading pooled over a few replays whose arrivals differ by a fraction of a gap measures the
policy at that load, not that one recording's luck (``capacity --replays``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from traces.trace.record import TraceRequest


def jittered(trace: Sequence[TraceRequest], seed: int, fraction: float) -> list[TraceRequest]:
    """``trace`` (in arrival order) with each arrival moved by up to ``fraction`` of the mean
    gap between arrivals, either way (uniform, from ``seed``; never before 0), back in
    arrival order with ``request_id`` renumbered. A session's turns keep their order: they
    take their jittered times sorted, so a turn never comes before the one it extends."""
    n = len(trace)
    if n < 2 or fraction <= 0:
        return list(trace)
    gap = (trace[-1].arrival - trace[0].arrival) / (n - 1)
    rng = np.random.default_rng(seed)
    times = np.array([r.arrival for r in trace]) + rng.uniform(-1.0, 1.0, n) * fraction * gap
    np.maximum(times, 0.0, out=times)
    turns: dict[str, list[int]] = {}
    for i, req in enumerate(trace):
        if req.session_id:
            turns.setdefault(req.session_id, []).append(i)
    for indices in turns.values():
        times[indices] = np.sort(times[indices])
    order = np.argsort(times, kind="stable")
    return [replace(trace[i], arrival=float(times[i]), request_id=k) for k, i in enumerate(order)]

"""SLO ceiling: a speedup above which no router keeps a TTFT percentile within its SLO.

    python bench/pickers/slo_ceiling.py --trace ../shared/traces/synthetic_trace.jsonl \
        --workers 8 [--slo 2] [--quantile 0.9] [--speedups 3.0 3.2 ...] \
        [--gpu-profile h100-llama8b|flat|FILE]

window_ceiling.py finds where a window's work fills the fleet, which is not yet a bound on
capacity at an SLO: the requests allowed over it (10% at p90) can absorb an overload. This
counts how many requests MUST miss the SLO at a speedup, for any router:

- a request on time (TTFT <= ``--slo``) had its prefill done on one worker within
  ``[arrival, arrival + slo]``, spending at least its share of that worker's time
  (``bench/pickers/window_ceiling.request_work``'s prefill: its tokens after the prefix any
  earlier prompt shared, infinite caches, with its tokens' part of each chunked step's fixed
  cost; decode left out, so the bound is loose by that much);
- in a window ``[a, b]`` of modelled time the fleet has ``workers * (b - a)`` worker-seconds,
  so the requests that arrive in ``[a, b - slo]`` and are on time carry at most that much
  work: if they carry ``E`` more, those late among them carry at least ``E``, so at least as
  many as the fewest (largest) of them that sum to ``E`` are late;
- windows that do not overlap count separately (each request's on-time interval lies in at
  most one), so the late count is at least the best sum over non-overlapping windows (a
  dynamic program over a grid of ``--grid-s`` modelled seconds, windows up to
  ``--max-window-s``); requests whose TTFT floor alone (traces/sim/bounds.ttft_floors) is
  over the SLO are late too and are counted outside the windows.

The percentile (numpy's linear interpolation, as the reports compute it) is over the SLO
when more requests are late than the ``1 - quantile`` tail holds. Only windows on a grid are
tried, so the count is a lower bound, and the speedup at which it first exceeds the tail an
upper bound on every router's capacity at the SLO (relaxations: infinite caches, the fleet's
time pooled within a window, decode free).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.pickers.window_ceiling import request_work  # noqa: E402
from traces.sim.bounds import ttft_floors  # noqa: E402
from traces.sim.worker_model import WorkerModelConfig, add_profile_option, profile_arg  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402


def allowed_late(n: int, quantile: float) -> int:
    """The most requests over the SLO with the ``quantile`` percentile (linear
    interpolation) still within it."""
    x = quantile * (n - 1)
    top = math.ceil(x) if x != int(x) else int(x)  # the highest order statistic it reads
    return n - 1 - top


def late_lower_bound(
    arrivals: np.ndarray,
    work: np.ndarray,
    workers: int,
    slo: float,
    grid_s: float = 0.5,
    max_window_s: float = 120.0,
) -> int:
    """At least this many of the requests (``arrivals`` sorted, modelled s; ``work``
    worker-seconds each) are late on ``workers`` workers (module docstring)."""
    start = arrivals[0]
    points = np.arange(start, arrivals[-1] + slo + grid_s, grid_s)
    cumulative = np.concatenate(([0.0], np.cumsum(work)))
    first = np.searchsorted(arrivals, points, side="left")  # requests from point p on
    best = np.zeros(len(points), dtype=np.int64)  # most late over windows ending by point
    span = round(max_window_s / grid_s)
    lag = math.ceil(slo / grid_s)
    for j in range(1, len(points)):
        top = best[j - 1]
        b = points[j]
        last = np.searchsorted(arrivals, b - slo, side="right")  # arrivals <= b - slo
        for i in range(max(0, j - span), j - lag + 1):
            i0 = first[i]
            if last <= i0:
                continue
            excess = cumulative[last] - cumulative[i0] - workers * (b - points[i])
            if excess <= 0:
                continue
            largest = np.sort(work[i0:last])[::-1]
            late = int(np.searchsorted(np.cumsum(largest), excess, side="left")) + 1
            top = max(top, best[i] + min(late, last - i0))
        best[j] = top
    return int(best[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--slo", type=float, default=2.0, help="TTFT SLO, modelled s")
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument("--speedups", type=float, nargs="+", default=[3.0, 3.4, 3.8, 4.2])
    p.add_argument("--grid-s", type=float, default=0.5, help="window ends, modelled s")
    p.add_argument("--max-window-s", type=float, default=120.0)
    add_profile_option(p)
    args = p.parse_args(argv)
    trace = load_trace(args.trace)
    config = WorkerModelConfig(profile=args.gpu_profile)
    prefill, _ = request_work(trace, config)
    forced = ttft_floors(trace, config) > args.slo
    forced_late = int(forced.sum())
    arrivals = np.fromiter((r.arrival for r in trace), dtype=np.float64, count=len(trace))
    tail = allowed_late(len(trace), args.quantile)
    print(
        f"{args.trace}: {len(trace)} requests, {args.workers} workers, "
        f"{profile_arg(args.gpu_profile)}; TTFT p{args.quantile * 100:g} <= {args.slo:g} s "
        f"allows {tail} late; {forced_late} late at any load (floor over the SLO)"
    )
    print("| speedup | late at least | allowed | the SLO reachable |")
    print("|---:|---:|---:|---|")
    rest = ~forced
    for speedup in args.speedups:
        late = forced_late + late_lower_bound(
            arrivals[rest] / speedup, prefill[rest], args.workers, args.slo,
            args.grid_s, args.max_window_s,
        )  # fmt: skip
        verdict = "no router" if late > tail else "not ruled out"
        print(f"| {speedup:g} | {late} | {tail} | {verdict} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

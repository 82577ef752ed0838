"""Windowed load ceilings: the trace speedup at which the work arriving in a window of trace
time fills every worker of the fleet for the window's (sped-up) length.

    python bench/pickers/window_ceiling.py --trace ../shared/traces/synthetic_trace.jsonl \
        [--workers 4 8 16] [--gpu-profile h100-llama8b|flat|FILE] [--windows 100 200 400]

The project's load ceiling (traces/sim/bounds.py) spreads the whole trace's prefill over
its whole span; a trace that front-loads its work overloads the fleet well below it. Here,
per window length ``L`` (trace seconds), the window ``[t0, t0 + L)`` (``t0`` on a 5 s grid)
whose work is largest sets the ceiling ``workers * L / work``. Work per request, a lower
bound on what any router's workers spend on it (traces/sim/worker_model.py):

- prefill: its tokens after the prefix any earlier prompt shared (infinite caches: the
  bound's TTFT floors' prefix), with its share of the chunked steps' fixed cost
  (``bounds.shared_step_seconds``);
- ``+decode``: also its decode's least cost: under a profile the context term every step
  charges per running sequence (``per_context_token x (prompt + i)`` for output token
  ``i``); under the flat model ``decode_s_per_seq`` per output token. The steps' base cost
  is left out.

Above a window's ceiling the fleet falls behind during that window whatever the router
does; below it, it need not. Not a bound on capacity at a TTFT SLO (the SLO's slack and
the requests allowed over it carry some overload), but where a capacity bar sits above the
ceilings of windows tens of seconds long, meeting it means riding out that overload.
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_left

import numpy as np

from traces.sim.bounds import hit_tokens, infinite_cache_hits, shared_step_seconds
from traces.sim.worker_model import WorkerModelConfig, add_profile_option
from traces.trace.formats import load_trace


def request_work(trace: list, config: WorkerModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(prefill, decode) seconds per request, at infinite-cache hits (module docstring)."""
    inputs = np.fromiter((r.input_length for r in trace), dtype=np.float64, count=len(trace))
    outputs = np.fromiter((r.output_length for r in trace), dtype=np.float64, count=len(trace))
    shared = hit_tokens(trace, infinite_cache_hits(trace)).astype(np.float64)
    prefill = shared_step_seconds(inputs - shared, config, shared)
    if config.profile is None:
        decode = outputs * config.decode_s_per_seq
    else:
        per_token = config.profile.decode_per_context_token
        decode = per_token * outputs * (inputs + (outputs - 1) / 2)
    return prefill, decode


def ceilings(
    arrivals: list[float], work: np.ndarray, workers: int, window: float
) -> tuple[float, float]:
    """(ceiling, t0): the least ``workers * window / work in window`` over windows of trace
    time starting on a 5 s grid (the whole span when ``window`` covers it)."""
    cumulative = np.concatenate(([0.0], np.cumsum(work)))
    span = arrivals[-1] - arrivals[0]
    last = arrivals[-1] - window + 5  # the last start whose window still ends in the trace
    starts = [arrivals[0]] if window >= span else np.arange(arrivals[0], last, 5)
    best = (float("inf"), 0.0)
    for t0 in starts:
        i0 = bisect_left(arrivals, t0)
        i1 = len(arrivals) if window >= span else bisect_left(arrivals, t0 + window)
        total = cumulative[i1] - cumulative[i0]
        if total > 0:
            best = min(best, (workers * min(window, span) / total, float(t0)))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    add_profile_option(parser)
    parser.add_argument("--windows", type=float, nargs="+", default=[50, 100, 200, 400, 1e9])
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    config = WorkerModelConfig(profile=args.gpu_profile)
    prefill, decode = request_work(trace, config)
    arrivals = [r.arrival for r in trace]
    name = "flat" if args.gpu_profile is None else args.gpu_profile.name
    print(f"{args.trace}: {len(trace)} requests, {name}; ceiling (x the trace) per window")
    print("| workers | window (trace s) | prefill | from t0 | +decode | from t0 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for workers in args.workers:
        for window in args.windows:
            only, t_only = ceilings(arrivals, prefill, workers, window)
            both, t_both = ceilings(arrivals, prefill + decode, workers, window)
            shown = "whole" if window >= arrivals[-1] - arrivals[0] else f"{window:g}"
            print(f"| {workers} | {shown} | {only:.2f} | {t_only:g} | {both:.2f} | {t_both:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

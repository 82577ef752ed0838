"""How many requests/s the replay client sends on schedule (open loop).

    python bench/micro/bench_replay.py [--rate 600] [--seconds 5]

Starts one near-instant simulated worker on 127.0.0.1, replays a synthetic trace of short
prompts arriving at ``--rate`` requests/s straight to it (no router), and reports how late
requests left against their schedule (p50 / p99 / max) and how many completed.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from traces.live.fleet import sim_workers
from traces.live.replay import ReplayConfig, replay
from traces.trace.record import TraceRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=600.0, help="arrivals per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the trace")
    args = parser.parse_args()
    n = int(args.rate * args.seconds)
    trace = [
        TraceRequest(i / args.rate, f"s{i % 50}", 0, 600, 2, (i % 50,), request_id=i)
        for i in range(n)
    ]
    fast = ["--time-scale", "1000", "--gpu-profile", "flat", "--prefill-tokens-per-s", "1e9",
            "--step-overhead-ms", "0"]  # fmt: skip
    with sim_workers(1, fast) as (worker,):
        outcome = asyncio.run(replay(trace, ReplayConfig(url=worker.url, vocab_size=4096), "rate"))
    lag = outcome.send_lag * 1000
    print(
        f"rate {args.rate:.0f}/s for {args.seconds:.0f} s: {outcome.run.requests}/{n} completed, "
        f"{outcome.errors} errors; send lag ms p50 {np.percentile(lag, 50):.1f} "
        f"p99 {np.percentile(lag, 99):.1f} max {lag.max():.1f}"
    )


if __name__ == "__main__":
    main()

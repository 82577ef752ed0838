"""Scale-out routing, replayed: does a fleet of router replicas route like one router?

On the bundled Mooncake conversation sample (its first ``--window-s`` seconds), against 4 sim
workers (real radix caches, ``--speedup`` times faster than real time), each configuration in
turn, repeated ``--reps`` times interleaved (the machine's noise hits all alike):

- ``one router``: one ``cache-router serve``;
- ``two replicas, shared``: two, sharing state through a redis-server, behind haproxy (TCP,
  round-robin, the L4 balancer a deployment would have);
- ``--processes 2``: one ``serve --processes 2`` (its private redis-server);
- ``two replicas, not shared``: the same two without ``--state-url`` (the ablation, once).

Reported per configuration: the workers' own hit rate (their prefix-cache counters), client
TTFT p50/p90 (in the trace's seconds), errors; the summary is the mean over repetitions. For
the shared replicas also how far each one's view of the other's load is from the other's own
count, per worker, sampled every 50 ms during the replay (``load_error``: mean, p99, max, in
requests).

    python bench/scale_out/scale_replay.py --reps 3 --out bench/results/scale_replay.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

import traces
from router.service.supervisor import PrivateRedis
from traces.live.fleet import (
    HOST,
    Haproxy,
    Service,
    free_port,
    reset_caches,
    sim_workers,
    start_service,
)
from traces.live.replay import ReplayConfig, ReplayOutcome, replay
from traces.trace.formats import load_trace

CONVERSATION = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"
ONE = "one router"
SHARED = "two replicas, shared"
PROCESSES = "--processes 2"
ALONE = "two replicas, not shared"
CONFIGS = (ONE, SHARED, PROCESSES)


def router(workers: Sequence[str], *extra: str, name: str = "router") -> Service:
    port = free_port()
    args = ["serve", "--host", HOST, "--port", str(port), "--worker", *workers,
            "--log-level", "warning", *extra]  # fmt: skip
    return start_service(name, args, port)


def figures(outcome: ReplayOutcome, speedup: float) -> dict:
    run = outcome.run
    ttft = (run.first_token - run.arrival) * speedup  # in the trace's seconds
    return {
        "requests": run.requests,
        "errors": outcome.errors,
        "hit_rate": round(outcome.worker_hit_rate or 0.0, 4),
        "ttft_p50": round(float(np.percentile(ttft, 50)), 3),
        "ttft_p90": round(float(np.percentile(ttft, 90)), 3),
    }


def sample_load_error(urls: Sequence[str], stop: threading.Event, out: list[int]) -> None:
    """Until ``stop``: per worker, |one replica's remote load - the other's own load|."""
    with httpx.Client(timeout=2) as client:
        while not stop.wait(0.05):
            try:
                views = [client.get(u + "/workers").json() for u in urls]
            except (httpx.HTTPError, ValueError):
                continue
            own = [
                {w["url"]: w["num_requests"] - w["remote_num_requests"] for w in v} for v in views
            ]
            for i, view in enumerate(views):
                for w in view:
                    out.append(abs(w["remote_num_requests"] - own[1 - i].get(w["url"], 0)))


class Bench:
    """The sim workers, a Redis, and one replay per configuration on demand."""

    def __init__(self, workers: Sequence[str], redis: PrivateRedis, folder: Path,
                 window_s: float, speedup: float) -> None:  # fmt: skip
        self.workers = list(workers)
        self.redis = redis
        self.folder = folder
        self.speedup = speedup
        self.trace = [r for r in load_trace(CONVERSATION) if r.arrival <= window_s]
        self.runs = 0

    def replay(self, url: str, name: str) -> dict:
        self.runs += 1
        reset_caches(self.workers)
        cfg = ReplayConfig(url=url, speedup=self.speedup, prompt_mode="text", salt=self.runs,
                           max_output_tokens=64, worker_urls=tuple(self.workers))  # fmt: skip
        return figures(asyncio.run(replay(self.trace, cfg, name)), self.speedup)

    def run(self, config: str) -> dict:
        if config == ONE:
            services = [router(self.workers)]
            url = services[0].url
        elif config == PROCESSES:
            services = [router(self.workers, "--processes", "2", name="processes")]
            url = services[0].url
        else:
            shared = ["--state-url", self.redis.url, "--state-prefix", f"run{self.runs}"]
            extra = shared if config == SHARED else []
            services = [router(self.workers, *extra, name=n) for n in ("a", "b")]
            lb = Haproxy(
                self.folder, free_port(), [s.url.removeprefix("http://") for s in services]
            )
            url = lb.start().url
        load_errors: list[int] = []
        stop = threading.Event()
        sampler = threading.Thread(
            target=sample_load_error,
            args=([s.url for s in services], stop, load_errors),
            daemon=True,
        )
        if config == SHARED:
            sampler.start()
        try:
            result = self.replay(url, config)
        finally:
            stop.set()
            if sampler.is_alive():
                sampler.join(5)
            if config in (SHARED, ALONE):
                lb.stop()
            for s in services:
                s.stop()
        if load_errors:
            e = np.array(load_errors)
            result["load_error"] = [
                round(float(e.mean()), 3),
                float(np.percentile(e, 99)),
                int(e.max()),
            ]
        return result


def measure(reps: int, configs: Sequence[str] = CONFIGS, once: Sequence[str] = (ALONE,),
            window_s: float = 180.0, speedup: float = 4.0) -> dict:  # fmt: skip
    """Every config ``reps`` times interleaved (``once``: in the first round only)."""
    folder = Path(tempfile.mkdtemp(prefix="scale-replay-"))
    redis = PrivateRedis(folder)
    redis.start()
    runs: dict[str, list[dict]] = {}
    try:
        sim_args = ["--time-scale", str(speedup), "--kv-capacity-tokens", "1000000"]
        with sim_workers(4, sim_args) as sims:
            bench = Bench([s.url for s in sims], redis, folder, window_s, speedup)
            for rep in range(reps):
                for config in [*configs, *(once if rep == 0 else ())]:
                    runs.setdefault(config, []).append(bench.run(config))
    finally:
        redis.stop()
    summary = {
        name: {
            key: round(float(np.mean([r[key] for r in rows])), 4)
            for key in ("hit_rate", "ttft_p50", "ttft_p90")
        }
        | {"errors": sum(r["errors"] for r in rows), "runs": len(rows)}
        for name, rows in runs.items()
    }
    for name, rows in runs.items():
        errors = [r["load_error"] for r in rows if "load_error" in r]
        if errors:  # mean of the means, the worst p99 and max
            summary[name]["load_error"] = [
                round(float(np.mean([e[0] for e in errors])), 3),
                max(e[1] for e in errors),
                max(e[2] for e in errors),
            ]
    return {"window_s": window_s, "speedup": speedup, "runs": runs, "summary": summary}


def table(result: dict) -> str:
    one = result["summary"][ONE]
    lines = [
        "| configuration | runs | hit rate | x one | TTFT p50 (s) | TTFT p90 (s) | p90 x one "
        "| errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["summary"].items():
        lines.append(
            f"| {name} | {s['runs']} | {s['hit_rate']:.3f} | {s['hit_rate'] / one['hit_rate']:.2f}"
            f" | {s['ttft_p50']:.2f} | {s['ttft_p90']:.2f} | {s['ttft_p90'] / one['ttft_p90']:.2f}"
            f" | {s['errors']} |"
        )
    for name, s in result["summary"].items():
        if "load_error" in s:
            mean, p99, worst = s["load_error"]
            lines.append(
                f"\n{name}: a replica's view of the other's load per worker is off by {mean:.2f}"
                f" requests on average (p99 {p99:g}, max {worst:g}), sampled every 50 ms"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--window-s", type=float, default=180.0)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--out", type=Path, help="write the runs and the summary as JSON")
    args = p.parse_args()
    result = measure(args.reps, window_s=args.window_s, speedup=args.speedup)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

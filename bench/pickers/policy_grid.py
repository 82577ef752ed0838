"""Policies x load levels x traces x worker counts in the simulator, against the oracle.

    .venv/bin/python bench/pickers/policy_grid.py [--out bench/results/policy_grid.json] \
        [--md out/policy_grid.md]

For each trace and worker count the arrival speedups of the four load levels are chosen so
that round_robin's TTFT p90 is about 3 s (light), 5 s (medium) and 10 s (heavy); overload is
a speedup at which round_robin's queues grow without bound (its p90 is at least
``--overload-p90`` seconds, 60 by default). The speedups are found by bisection on
round_robin alone and recorded in the output, so a rerun with ``--speedups FILE`` reuses them.
Then every policy runs at every level, each on a fresh fleet (``traces.commands.run_simulate``), and
the table gives each policy's TTFT p50/p90/p99 and its ratio to the oracle's
(``traces.sim.oracle``). The Weka rows (``--weka DIR``) run at the trace's own rate and 4x with
262k-token KV caches.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from traces.commands.options import make_sim_picker
from traces.commands.run_simulate import run_policies
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.formats import load_trace

RESULT = Path(__file__).resolve().parents[1] / "results" / "policy_grid.json"

LEVELS = {"light": 3.0, "medium": 5.0, "heavy": 10.0}
POLICIES = "ttft,oracle,lmetric,load_only,sticky,unified,round_robin"
SEED_PICKERS = ("lmetric", "load_only", "sticky", "unified", "capped")


def rr_p90(trace, workers: int, speedup: float) -> float:
    config = SimConfig(workers=workers, speedup=speedup)
    run = simulate(trace, make_sim_picker("round_robin"), config)
    return run.summary()["ttft_p90"]


def calibrate(trace, workers: int, target: float, lo: float = 0.05, hi: float = 64.0) -> float:
    """Speedup at which round_robin's TTFT p90 is ``target`` s (within 5%), by bisection."""
    a, b = math.log(lo), math.log(hi)
    best = math.exp((a + b) / 2)
    for _ in range(14):
        mid = (a + b) / 2
        speedup = math.exp(mid)
        p90 = rr_p90(trace, workers, speedup)
        best = speedup
        if abs(p90 / target - 1) <= 0.05:
            break
        if p90 < target:
            a = mid
        else:
            b = mid
    return round(best, 3)


def speedups_for(trace, workers: int, overload_p90: float) -> dict[str, float]:
    # bursts of simultaneous arrivals put a floor under the p90 however slow the arrivals:
    # a level below it becomes the floor (+5%)
    floor = rr_p90(trace, workers, 0.05) * 1.05
    levels = {name: calibrate(trace, workers, max(p90, floor)) for name, p90 in LEVELS.items()}
    speedup = levels["heavy"]
    while rr_p90(trace, workers, speedup) < overload_p90:
        speedup *= 1.15
    levels["overload"] = round(speedup, 3)
    return levels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--traces", default="../shared/traces/conversation_trace.jsonl,"
                   "../shared/traces/synthetic_trace.jsonl")  # fmt: skip
    p.add_argument("--workers", default="8,4")
    p.add_argument("--policies", default=POLICIES)
    p.add_argument("--speedups", help="reuse the speedups recorded in this results file")
    p.add_argument("--overload-p90", type=float, default=60.0)
    p.add_argument("--weka", default="../shared/traces/weka_kv_cache_tester")
    p.add_argument("--weka-speedups", default="1,4")
    p.add_argument("--out", default=str(RESULT))
    p.add_argument("--md", default=None, help="also write the markdown table here")
    args = p.parse_args()
    policies = args.policies.split(",")
    known = json.loads(Path(args.speedups).read_text())["speedups"] if args.speedups else {}
    doc: dict = {"policies": policies, "speedups": {}, "rows": []}
    started = time.perf_counter()
    for path in filter(None, args.traces.split(",")):
        trace = load_trace(path)
        name = Path(path).name
        for workers in (int(w) for w in args.workers.split(",")):
            key = f"{name}@{workers}"
            levels = known.get(key) or speedups_for(trace, workers, args.overload_p90)
            doc["speedups"][key] = levels
            print(f"{key}: speedups {levels}", file=sys.stderr)
            for level, speedup in levels.items():
                config = SimConfig(workers=workers, speedup=speedup)
                runs = run_policies(trace, policies, config)
                doc["rows"].append(_row(name, workers, level, speedup, runs))
                print(_brief(doc["rows"][-1]), file=sys.stderr)
    if args.weka:
        trace = load_trace(args.weka)
        for speedup in (float(s) for s in args.weka_speedups.split(",")):
            config = SimConfig(workers=8, speedup=speedup,
                               worker=WorkerModelConfig(kv_capacity_tokens=262_144))  # fmt: skip
            runs = run_policies(trace, policies, config)
            doc["rows"].append(_row("weka", 8, f"{speedup:g}x", speedup, runs))
            print(_brief(doc["rows"][-1]), file=sys.stderr)
    doc["wall_seconds"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    if args.md:
        Path(args.md).write_text(table + "\n")
    print(table)
    return 0


def _row(trace: str, workers: int, level: str, speedup: float, runs) -> dict:
    summaries = {r.name: r.summary() for r in runs}
    keep = ("hit_rate", "ttft_p50", "ttft_p90", "ttft_p99", "imbalance", "pick_us_p99")
    return {
        "trace": trace,
        "workers": workers,
        "level": level,
        "speedup": speedup,
        "policies": {n: {k: s[k] for k in keep} for n, s in summaries.items()},
    }


def _brief(row: dict) -> str:
    cells = [f"{n} {s['ttft_p90']:.2f}/{s['hit_rate']:.0%}" for n, s in row["policies"].items()]
    return f"  {row['trace']}@{row['workers']} {row['level']}: " + "  ".join(cells)


def markdown(doc: dict) -> str:
    """One line per (trace, workers, level, policy): TTFT p50/p90/p99 and x oracle."""
    out = [
        "| trace | workers | level (speedup) | policy | hit rate | TTFT p50 s | x oracle "
        "| TTFT p90 s | x oracle | TTFT p99 s | x oracle | imbalance |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in doc["rows"]:
        oracle = row["policies"].get("oracle")
        for name, s in row["policies"].items():
            cells = [f"{s['hit_rate']:.1%}"]
            for q in ("ttft_p50", "ttft_p90", "ttft_p99"):
                cells.append(f"{s[q]:.3f}")
                cells.append(f"{s[q] / oracle[q]:.2f}" if oracle and oracle[q] > 0 else "")
            cells.append(f"{s['imbalance']:.2f}")
            out.append(
                f"| {row['trace']} | {row['workers']} | {row['level']} ({row['speedup']:g}x) "
                f"| {name} | " + " | ".join(cells) + " |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

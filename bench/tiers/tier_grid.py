"""Tiered KV caches offline: the tier-aware default against the tier-blind one, the peers'
fixed-credit rule and a router that reads every tier exactly, on the same tiered workers.

    python bench/tiers/tier_grid.py [--jobs 2] [--quick] [--gpu-profile h100-llama8b|flat|FILE] \
        [--out bench/results/tier_grid.json] [--md out/tier_grid.md]

Every worker has a CPU tier of ``--cpu-x`` (4) times its GPU KV (262,144 tokens, the worker
model's default). Workers and the router's cost model are priced with ``--gpu-profile`` (the
worker model's default, the measured H100 8B profile; a CPU-tier load at the profile's
measured copy rate); ``flat``: the flat model, loads at ``--kv-load-gbps`` (20 GB/s, PCIe
class; 128 KiB a token). Rows:

- ``ttft`` with ``--router-tiers off`` (tier-blind: GPU shadows only, as before tiers),
  ``on`` (a shadow per tier, a CPU hit priced at its load time) and ``exact`` (both tiers
  read from the worker models: what is possible);
- ``tiered`` (vllm-router 0.1.17's kv_aware / Dynamo's credits, 0.8 a CPU block) with tiers on;
- ``unified`` and ``lmetric`` with tiers on (they read the GPU shadow only) for reference.

Cells (traces, fleet sizes, loads): the bundled Weka agentic sample (session pacing) on 4
and 8 workers at 1x and 2x; Mooncake's conversation_trace on 8 workers at 1x, 2x and 3x and
on 4 workers at 1x; the synthetic_trace on 8 workers at 1x (../shared/traces). ``--quick``:
the first cell of each trace only.

Per cell: TTFT p50/p90/p99, hit rate (both tiers) and the CPU tier's share, and the bar's
ratios: on/off p90, the share of exact's p90 gain over off that on keeps, on against tiered.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from traces.commands.options import make_sim_picker  # noqa: E402
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import WorkerModelConfig, add_profile_option, profile_arg  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402

DATA = ROOT / "traces" / "data"
SHARED = ROOT.parent / "shared" / "traces"
ROWS = (
    ("ttft", "off"),
    ("ttft", "on"),
    ("ttft", "exact"),
    ("tiered", "on"),
    ("unified", "on"),
    ("lmetric", "on"),
)
CELLS = (
    ("weka", DATA / "weka_agentic_sample.jsonl", "session", 4, 1.0),
    ("weka", DATA / "weka_agentic_sample.jsonl", "session", 4, 2.0),
    ("weka", DATA / "weka_agentic_sample.jsonl", "session", 8, 1.0),
    ("weka", DATA / "weka_agentic_sample.jsonl", "session", 8, 2.0),
    ("conversation", SHARED / "conversation_trace.jsonl", "open", 8, 1.0),
    ("conversation", SHARED / "conversation_trace.jsonl", "open", 8, 2.0),
    ("conversation", SHARED / "conversation_trace.jsonl", "open", 8, 3.0),
    ("conversation", SHARED / "conversation_trace.jsonl", "open", 4, 1.0),
    ("synthetic", SHARED / "synthetic_trace.jsonl", "open", 8, 1.0),
)


def run_cell(cell: tuple, worker: WorkerModelConfig, shadow: str = "blocks") -> dict:
    name, path, pacing, workers, speedup = cell
    trace = load_trace(str(path))
    # the router's cost model follows the workers' profile (simulate's default)
    base = SimConfig(
        workers=workers,
        worker=worker,
        pacing=pacing,
        speedup=speedup,
        shadow=shadow,
        cost_profile=worker.profile,
    )
    rows = {}
    for policy, tiers in ROWS:
        config = replace(base, router_tiers=tiers)
        run = simulate(trace, make_sim_picker(policy), config)
        s = run.summary()
        rows[f"{policy}/{tiers}"] = {
            k: s[k]
            for k in ("ttft_p50", "ttft_p90", "ttft_p99", "hit_rate", "cpu_hit_rate")
            if k in s
        }
    off, on, exact = (rows[f"ttft/{t}"]["ttft_p90"] for t in ("off", "on", "exact"))
    gain_exact = off - exact
    return {
        "trace": name,
        "workers": workers,
        "speedup": speedup,
        "pacing": pacing,
        "shadow": shadow,
        "rows": rows,
        "on_over_off_p90": on / off if off else None,
        "share_of_exact_gain": (off - on) / gain_exact if gain_exact > 0 else None,
        "on_over_tiered_p90": on / rows["tiered/on"]["ttft_p90"],
    }


def markdown(cells: list[dict]) -> str:
    lines = [
        "| trace | workers | load | "
        + " | ".join(f"{p}/{t} p90 (hit, cpu)" for p, t in ROWS)
        + " | on/off | share of exact's gain | on/tiered |",
        "|---|---:|---:|" + "---:|" * (len(ROWS) + 3),
    ]
    for c in cells:
        cols = []
        for p, t in ROWS:
            r = c["rows"][f"{p}/{t}"]
            hit, cpu = r["hit_rate"], r.get("cpu_hit_rate", 0.0)
            cols.append(f"{r['ttft_p90']:.3f} ({hit:.1%}, {cpu:.1%})")
        share = c["share_of_exact_gain"]
        lines.append(
            f"| {c['trace']} | {c['workers']} | {c['speedup']:g}x | "
            + " | ".join(cols)
            + f" | {c['on_over_off_p90']:.3f} | {'-' if share is None else f'{share:.0%}'}"
            + f" | {c['on_over_tiered_p90']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="one cell per trace")
    p.add_argument("--cpu-x", type=float, default=4.0, help="CPU tier / GPU KV")
    p.add_argument("--kv-load-gbps", type=float, default=20.0, help="CPU-tier loads (flat only)")
    add_profile_option(p)
    p.add_argument(
        "--shadow", choices=("blocks", "radix"), default="blocks",
        help="the router's GPU shadow (radix: evicts whole leaves, as the worker model does)",
    )  # fmt: skip
    p.add_argument("--out", default="bench/results/tier_grid.json")
    p.add_argument("--md", default="out/tier_grid.md")
    args = p.parse_args(argv)
    gpu = WorkerModelConfig().kv_capacity_tokens
    worker = WorkerModelConfig(
        cpu_kv_capacity_tokens=int(gpu * args.cpu_x),
        kv_load_gbps=args.kv_load_gbps,
        profile=args.gpu_profile,
    )
    cells = list(CELLS)
    if args.quick:
        seen: set[str] = set()
        cells = [c for c in cells if not (c[0] in seen or seen.add(c[0]))]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_cell, cells, [worker] * len(cells), [args.shadow] * len(cells)))
    out = {
        "cpu_x": args.cpu_x,
        "kv_load_gbps": args.kv_load_gbps,
        "gpu_profile": profile_arg(args.gpu_profile),
        "shadow": args.shadow,
        "cells": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    md = markdown(results)
    Path(args.md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.md).write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

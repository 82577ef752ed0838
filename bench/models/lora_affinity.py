"""LoRA affinity: adapter swaps and hit rate per picker, with fewer slots than adapters.

    python bench/models/lora_affinity.py [--workers 4] [--max-loras 2] [--adapters 8 16] \
        [--live | --live-only] [--gpu-profile h100-llama8b|flat|FILE]

Each trace's sessions are given one adapter each (``lora-0 .. lora-{N-1}``, by a hash of the
session id: :mod:`traces.trace.assign`), so every request runs an adapter. The offline simulator
(:mod:`traces.sim.simulator`: worker models with ``--max-loras`` slots, ``lora_load_s`` per
load) replays each trace at each load (``--speedups``) through each picker on a fresh fleet;
the workers' loads (swaps) and their true hit rate are reported; workers and the router's cost
model priced with ``--gpu-profile`` (the worker model's default; ``flat``: the flat model).
``--live`` also replays the bundled samples (``--live-traces``) through ``cache-router serve``
in front of sim workers (``sim-worker --lora ... --max-loras N --gpu-profile P``), the router
priced with the same profile in the workers' time (``sweep``'s
:func:`traces.live.fleet.time_scaled_router_args`), swaps read from the workers'
``sim:lora_swaps_total``, TTFT in the workers' model seconds (wall times ``--time-scale``);
``--live-only`` skips the offline runs.
The figures go to bench/results/lora_affinity.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from traces.commands.options import make_sim_picker  # noqa: E402
from traces.live.fleet import router, scrape, sim_workers, time_scaled_router_args  # noqa: E402
from traces.live.replay import ReplayConfig, replay  # noqa: E402
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import (  # noqa: E402
    WorkerModelConfig,
    add_profile_option,
    profile_arg,
)
from traces.trace.assign import assign_models  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402
from traces.trace.record import TraceRequest  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
TRACES = {
    "conversation_sample": ROOT / "traces" / "data" / "conversation_sample.jsonl",
    "weka_agentic_sample": ROOT / "traces" / "data" / "weka_agentic_sample.jsonl",
    "mooncake_synthetic": SHARED / "synthetic_trace.jsonl",
}
POLICIES = ("ttft", "round_robin", "unified")


def with_adapters(trace: Sequence[TraceRequest], adapters: int) -> list[TraceRequest]:
    return assign_models(trace, [(f"lora-{i}", 1.0) for i in range(adapters)])


def offline(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name, path in TRACES.items():
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        base = load_trace(str(path))[: args.requests]
        for adapters in args.adapters:
            trace = with_adapters(base, adapters)
            for speedup in args.speedups:
                profile = args.gpu_profile
                worker = WorkerModelConfig(max_loras=args.max_loras, profile=profile)
                config = SimConfig(
                    workers=args.workers, worker=worker, speedup=speedup, cost_profile=profile
                )
                for policy in POLICIES:
                    s = simulate(trace, make_sim_picker(policy), config).summary()
                    rows.append(
                        {
                            "mode": "offline",
                            "trace": name,
                            "requests": len(trace),
                            "adapters": adapters,
                            "speedup": speedup,
                            "policy": policy,
                            "lora_swaps": s["lora_swaps"],
                            "hit_rate": round(s["hit_rate"], 4),
                            "ttft_p50": round(s["ttft_p50"], 3),
                            "ttft_p90": round(s["ttft_p90"], 3),
                        }
                    )
                    print(_line(rows[-1]), flush=True)
    return rows


def _swaps(urls: Sequence[str]) -> float:
    return sum(s.value for url in urls for s in scrape(url) if s.name == "sim:lora_swaps_total")


def live(args: argparse.Namespace) -> list[dict]:
    """``--live-traces`` through a router per picker, sim workers restarted each time
    (fresh caches and slots)."""
    rows = []
    profile = profile_arg(args.gpu_profile)
    for name, adapters, speedup in itertools.product(
        args.live_traces, args.live_adapters, args.live_speedups
    ):
        base = load_trace(str(TRACES[name]))[: args.live_requests]
        trace = with_adapters(base, adapters)
        loras = ["--lora", *sorted({r.model for r in trace}), "--max-loras", str(args.max_loras)]
        for policy in POLICIES:
            worker_args = ["--time-scale", str(args.time_scale), "--log-level", "warning", *loras]
            worker_args += ["--gpu-profile", profile]
            router_args = ["--log-level", "warning", "--cost-profile", profile]
            router_args += time_scaled_router_args(policy, args.time_scale)
            with sim_workers(args.workers, worker_args) as workers:
                urls = [w.url for w in workers]
                with router(urls, policy, router_args) as r:
                    cfg = ReplayConfig(url=r.url, speedup=speedup * args.time_scale)
                    t0 = time.monotonic()
                    out = asyncio.run(replay(trace, cfg, policy))
                    summary = out.run.summary()
                    rows.append(
                        {
                            "mode": "live",
                            "trace": name,
                            "requests": len(trace),
                            "adapters": adapters,
                            "speedup": speedup,
                            "time_scale": args.time_scale,
                            "policy": policy,
                            "errors": out.errors,
                            "lora_swaps": _swaps(urls),
                            "hit_rate": round(out.worker_hit_rate or 0.0, 4),
                            # the sim workers' clock runs time_scale times fast: model seconds
                            "ttft_p50": round(summary["ttft_p50"] * args.time_scale, 3),
                            "ttft_p90": round(summary["ttft_p90"] * args.time_scale, 3),
                            "wall_s": round(time.monotonic() - t0, 1),
                        }
                    )
                    print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in row.items())


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (mode, trace, adapters, load): ttft's swaps / round_robin's and hit rates."""
    out = []
    keys = sorted({(r["mode"], r["trace"], r["adapters"], r["speedup"]) for r in rows})
    for key in keys:
        by = {
            r["policy"]: r
            for r in rows
            if (r["mode"], r["trace"], r["adapters"], r["speedup"]) == key
        }
        if "ttft" not in by or "round_robin" not in by:
            continue
        t, rr = by["ttft"], by["round_robin"]
        ratio = t["lora_swaps"] / rr["lora_swaps"] if rr["lora_swaps"] else float("nan")
        out.append(
            {
                "mode": key[0],
                "trace": key[1],
                "adapters": key[2],
                "speedup": key[3],
                "swaps_ratio": round(ratio, 3),
                "hit_rate_ttft_minus_rr": round(t["hit_rate"] - rr["hit_rate"], 4),
                "meets_bar": ratio <= 0.5 and t["hit_rate"] >= rr["hit_rate"],
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--adapters", type=int, nargs="+", default=[8, 16])
    p.add_argument("--speedups", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--requests", type=int, default=None, help="first N requests of each trace")
    p.add_argument("--live", action="store_true", help="also replay live through the router")
    p.add_argument("--live-only", action="store_true", help="--live without the offline runs")
    p.add_argument("--live-requests", type=int, default=400)
    p.add_argument("--live-speedups", type=float, nargs="+", default=[0.25, 0.5])
    p.add_argument(
        "--live-traces",
        nargs="+",
        default=["conversation_sample", "weka_agentic_sample"],
        choices=TRACES,
    )
    p.add_argument("--live-adapters", type=int, nargs="+", default=[8])
    p.add_argument("--time-scale", type=float, default=10.0, help="sim workers' clock (live)")
    add_profile_option(p)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lora_affinity.json")
    args = p.parse_args(argv)
    rows = [] if args.live_only else offline(args)
    if args.live or args.live_only:
        rows += live(args)
    summary = verdicts(rows)
    for v in summary:
        print(_line(v))
    config = {k: v for k, v in vars(args).items() if k not in ("out", "gpu_profile_named")}
    config["gpu_profile"] = profile_arg(args.gpu_profile)
    args.out.write_text(json.dumps({"config": config, "rows": rows, "verdicts": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Aggregated against disaggregated prefill/decode fleets of the same size, offline.

    nice -n 10 .venv/bin/python bench/pd/pd_compare.py [--requests N] [--kv-capacity-tokens T] \
        [--gpu-profile h100-llama8b|flat|FILE] [--out F.json] [--md F.md]

For each bundled trace (traces/data: the Mooncake conversation sample, 2,000 requests, and
the Weka agentic-coding sample, 240 requests in 45 sessions), each fleet size N (4 and 8) and
two loads, the offline simulator (:mod:`traces.sim.simulator`) runs N aggregated workers, N/2
prefill + N/2 decode workers and 3N/4 prefill + N/4 decode workers, each with the default
picker (``ttft``) and with ``round_robin`` (on the prefill workers of a disaggregated fleet;
the decode workers are always picked by ``decode_load``), each on a fresh fleet. KV
transfers take the simulator's defaults (2 ms + 128 KiB per token at 25 GB/s).

Loads are arrival speedups proportional to N (the same load per worker at both sizes): the
conversation sample at 0.5x and 1x for N=4 (where 4 aggregated round-robin workers' TTFT p90
is about 4 s and 21 s), the Weka sample at 0.25x and 0.5x. Every worker has
``--kv-capacity-tokens`` of KV cache, 1M by default as ``cache-router demo`` (a GPU plus a
CPU tier; the Weka sample's prompts average 52k tokens); the bar figures are also given at
the worker model's default of 262,144 tokens. Workers (both roles) and the router's cost model
are priced with ``--gpu-profile`` (the worker model's default; ``flat``: the flat model).

The bar: conversation sample, 2 prefill + 2 decode workers: the default picker's prefill hit
rate over round_robin's (target >= 1.5x) and the decode workers' max/mean requests (target
<= 1.2). Writes bench/results/pd_compare.json and bench/results/pd_compare.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from traces.commands.options import make_sim_picker  # noqa: E402
from traces.sim.gpu_profile import GpuProfile  # noqa: E402
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import (  # noqa: E402
    WorkerModelConfig,
    add_profile_option,
    profile_arg,
)
from traces.trace.formats import load_trace  # noqa: E402

DATA = ROOT / "traces" / "data"
TRACES = {
    "conversation_sample": DATA / "conversation_sample.jsonl",
    "weka_agentic_sample": DATA / "weka_agentic_sample.jsonl",
}
# arrival speedups at N=4 (low, high); N workers run N/4 times as fast
LOADS = {"conversation_sample": (0.5, 1.0), "weka_agentic_sample": (0.25, 0.5)}
POLICIES = ("ttft", "round_robin")
SIZES = (4, 8)
BAR_TRACE, BAR_FLEET = "conversation_sample", (2, 2)
KEYS = (
    "hit_rate", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "imbalance",
    "decode_imbalance", "transfer_p50", "transfer_p90", "transfer_saved",
)  # fmt: skip


def fleets(n: int) -> list[tuple[int, int]]:
    """(prefill, decode) workers; (0, 0): n aggregated workers."""
    return [(0, 0), (n // 2, n - n // 2), (3 * n // 4, n - 3 * n // 4)]


def fleet_name(n: int, prefill: int, decode: int) -> str:
    return f"{prefill}P+{decode}D" if prefill else f"{n} agg"


def run_one(trace: Sequence, config: SimConfig, policy: str) -> dict:
    s = simulate(trace, make_sim_picker(policy), config).summary()
    return {k: round(float(s[k]), 5) for k in KEYS if k in s}


def rows_for(name: str, trace: Sequence, kv: int, profile: GpuProfile | None) -> list[dict]:
    rows = []
    worker = WorkerModelConfig(kv_capacity_tokens=kv, profile=profile)
    for n in SIZES:
        for level, base in zip(("low", "high"), LOADS[name], strict=True):
            speedup = base * n / 4
            for prefill, decode in fleets(n):
                config = SimConfig(
                    workers=n,
                    worker=worker,
                    speedup=speedup,
                    prefill_workers=prefill,
                    decode_workers=decode,
                    cost_profile=profile,
                )
                for policy in POLICIES:
                    row = {
                        "trace": name,
                        "requests": len(trace),
                        "workers": n,
                        "fleet": fleet_name(n, prefill, decode),
                        "prefill_workers": prefill,
                        "decode_workers": decode,
                        "load": level,
                        "speedup": speedup,
                        "policy": policy,
                        **run_one(trace, config, policy),
                    }
                    rows.append(row)
                    print(_brief(row), file=sys.stderr, flush=True)
    return rows


def bar(
    rows: list[dict], trace: Sequence, kv_default: int, profile: GpuProfile | None
) -> list[dict]:
    """The bar figures from ``rows``, and again at the worker model's default KV capacity."""
    out = []
    prefill, decode = BAR_FLEET
    for level, base in zip(("low", "high"), LOADS[BAR_TRACE], strict=True):
        by = {
            r["policy"]: r
            for r in rows
            if r["trace"] == BAR_TRACE
            and (r["prefill_workers"], r["decode_workers"]) == BAR_FLEET
            and r["load"] == level
        }
        figures = [("bench KV", by)]
        if trace is not None:
            config = SimConfig(
                speedup=base,
                prefill_workers=prefill,
                decode_workers=decode,
                worker=replace(WorkerModelConfig(profile=profile), kv_capacity_tokens=kv_default),
                cost_profile=profile,
            )
            figures.append(("default KV", {p: run_one(trace, config, p) for p in POLICIES}))
        for kv_label, got in figures:
            ttft, rr = got["ttft"], got["round_robin"]
            ratio = ttft["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else float("nan")
            worst = max(ttft["decode_imbalance"], rr["decode_imbalance"])
            out.append(
                {
                    "trace": BAR_TRACE,
                    "fleet": fleet_name(prefill + decode, prefill, decode),
                    "load": level,
                    "speedup": base,
                    "kv": kv_label,
                    "kv_capacity_tokens": None if kv_label == "bench KV" else kv_default,
                    "hit_ttft": ttft["hit_rate"],
                    "hit_round_robin": rr["hit_rate"],
                    "hit_ratio": round(ratio, 3),
                    "decode_max_mean_ttft": ttft["decode_imbalance"],
                    "decode_max_mean_round_robin": rr["decode_imbalance"],
                    "meets_hit_bar": ratio >= 1.5,
                    "meets_decode_bar": worst <= 1.2,
                }
            )
    return out


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.1f}"


def markdown(doc: dict) -> str:
    out = [
        "| trace | N | load (speedup) | fleet | policy | TTFT p50 s | TTFT p90 s | TPOT p50 ms "
        "| TPOT p90 ms | hit rate (prefill) | decode max/mean | transfer p90 ms |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        decode = r.get("decode_imbalance")
        out.append(
            f"| {r['trace']} | {r['workers']} | {r['load']} ({r['speedup']:g}x) | {r['fleet']} "
            f"| {r['policy']} | {r['ttft_p50']:.3f} | {r['ttft_p90']:.3f} "
            f"| {_ms(r['tpot_p50'])} | {_ms(r['tpot_p90'])} | {r['hit_rate']:.1%} "
            f"| {'' if decode is None else f'{decode:.2f}'} | {_ms(r.get('transfer_p90'))} |"
        )
    out += [
        "",
        "Bar: conversation sample, 2 prefill + 2 decode workers; prefill hit rate of ttft over "
        "round_robin (target >= 1.5x), decode max/mean requests (target <= 1.2).",
        "",
        "| load (speedup) | KV per worker | ttft hit | round_robin hit | ratio "
        "| decode max/mean ttft | decode max/mean rr | hit bar | decode bar |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for b in doc["bar"]:
        kv = b["kv_capacity_tokens"] or doc["config"]["kv_capacity_tokens"]
        out.append(
            f"| {b['load']} ({b['speedup']:g}x) | {kv:,} | {b['hit_ttft']:.1%} "
            f"| {b['hit_round_robin']:.1%} | {b['hit_ratio']:.2f}x "
            f"| {b['decode_max_mean_ttft']:.2f} | {b['decode_max_mean_round_robin']:.2f} "
            f"| {'pass' if b['meets_hit_bar'] else 'miss'} "
            f"| {'pass' if b['meets_decode_bar'] else 'miss'} |"
        )
    return "\n".join(out)


def _brief(row: dict) -> str:
    return (
        f"  {row['trace']} N={row['workers']} {row['load']} {row['fleet']:>6} "
        f"{row['policy']:<11} hit {row['hit_rate']:.1%} TTFT p90 {row['ttft_p90']:.2f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None, help="first N requests of each trace")
    p.add_argument("--kv-capacity-tokens", type=int, default=1_000_000, help="per worker")
    add_profile_option(p)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pd_compare.json")
    p.add_argument("--md", type=Path, default=ROOT / "bench" / "results" / "pd_compare.md")
    args = p.parse_args(argv)
    profile = args.gpu_profile
    profile_name = profile_arg(profile)
    started = time.perf_counter()
    rows: list[dict] = []
    bar_trace = None
    for name, path in TRACES.items():
        trace = load_trace(str(path))[: args.requests]
        rows += rows_for(name, trace, args.kv_capacity_tokens, profile)
        if name == BAR_TRACE:
            bar_trace = trace
    default_kv = WorkerModelConfig().kv_capacity_tokens
    doc = {
        "config": {
            "requests": args.requests,
            "kv_capacity_tokens": args.kv_capacity_tokens,
            "gpu_profile": profile_name,
            "loads_at_4_workers": LOADS,
            "policies": POLICIES,
            "decode_policy": SimConfig().decode_policy,
            "kv_transfer_latency_s": SimConfig().kv_transfer_latency_s,
            "kv_transfer_gbps": SimConfig().kv_transfer_gbps,
            "kv_bytes_per_token": SimConfig().kv_bytes_per_token,
        },
        "rows": rows,
        "bar": bar(rows, bar_trace, default_kv, profile),
    }
    doc["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    args.md.write_text(
        "# Aggregated vs disaggregated prefill/decode (offline simulator)\n\n"
        "`nice -n 10 .venv/bin/python bench/pd/pd_compare.py`; see its docstring for the setup. "
        f"KV {args.kv_capacity_tokens:,} tokens per worker; GPU profile {profile_name} "
        f"(workers and the router's cost model); {doc['wall_seconds']} s.\n\n"
        f"{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

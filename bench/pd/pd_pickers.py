"""Which pickers a disaggregated fleet should default to, offline: each role's candidates.

    nice -n 10 .venv/bin/python bench/pd/pd_pickers.py [--gpu-profile h100-llama8b|flat|FILE] \
        [--out bench/results/pd_pickers.json] [--md bench/results/pd_pickers.md]

On both bundled traces, at the loads and KV capacity of bench/pd/pd_compare.py, three
disaggregated fleets (2P+2D and 3P+1D of 4 workers, 4P+4D of 8): the prefill picker among
``ttft`` (the default), ``unified``, ``lmetric`` and ``round_robin`` with the default decode
picker, then the decode picker among ``decode_load`` (the default), ``load_only`` and
``round_robin`` with the default prefill picker. Workers and the router's cost model are priced
with ``--gpu-profile`` (the worker model's default; ``flat``: the flat model). Writes
bench/results/pd_pickers.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pd_compare import KEYS, LOADS, ROOT, TRACES

from traces.commands.options import make_sim_picker
from traces.sim.config import SimConfig
from traces.sim.simulator import simulate
from traces.sim.worker_model import WorkerModelConfig, add_profile_option, profile_arg
from traces.trace.formats import load_trace

KV = 1_000_000
FLEETS = ((2, 2), (3, 1), (4, 4))
PREFILL = ("ttft", "unified", "lmetric", "round_robin")
DECODE = ("decode_load", "load_only", "round_robin")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_profile_option(p)
    results = ROOT / "bench" / "results"
    p.add_argument("--out", type=Path, default=results / "pd_pickers.json")
    p.add_argument("--md", type=Path, default=results / "pd_pickers.md")
    args = p.parse_args(argv)
    profile = args.gpu_profile
    profile_name = profile_arg(profile)
    started = time.perf_counter()
    rows = []
    for name, path in TRACES.items():
        trace = load_trace(str(path))
        for prefill, decode in FLEETS:
            n = prefill + decode
            for level, base in zip(("low", "high"), LOADS[name], strict=True):
                runs = [(p, "decode_load") for p in PREFILL]
                runs += [("ttft", d) for d in DECODE if d != "decode_load"]
                for policy, decode_policy in runs:
                    config = SimConfig(
                        worker=WorkerModelConfig(kv_capacity_tokens=KV, profile=profile),
                        cost_profile=profile,
                        speedup=base * n / 4,
                        prefill_workers=prefill,
                        decode_workers=decode,
                        decode_policy=decode_policy,
                    )
                    s = simulate(trace, make_sim_picker(policy), config).summary()
                    row = {"trace": name, "fleet": f"{prefill}P+{decode}D", "load": level,
                           "prefill": policy, "decode": decode_policy,
                           **{k: round(float(s[k]), 4) for k in KEYS if k in s}}  # fmt: skip
                    rows.append(row)
                    print(row, file=sys.stderr, flush=True)
    head = ("| trace | fleet | load | prefill picker | decode picker | TTFT p50 s | TTFT p90 s "
            "| TPOT p90 ms | prefill hit | decode max/mean |\n|---|---|---|---|---|---:|---:|"
            "---:|---:|---:|")  # fmt: skip
    lines = [
        f"| {r['trace']} | {r['fleet']} | {r['load']} | {r['prefill']} | {r['decode']} "
        f"| {r['ttft_p50']:.2f} | {r['ttft_p90']:.2f} | {r['tpot_p90'] * 1000:.1f} "
        f"| {r['hit_rate']:.1%} | {r['decode_imbalance']:.2f} |"
        for r in rows
    ]
    wall = round(time.perf_counter() - started, 1)
    doc = {"kv": KV, "gpu_profile": profile_name, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1))
    text = "\n".join([head, *lines])
    args.md.write_text(
        "# Pickers of a disaggregated fleet, each role (offline simulator)\n\n"
        f"`nice -n 10 .venv/bin/python bench/pd/pd_pickers.py`; KV {KV:,} per worker; GPU profile "
        f"{profile_name} (workers and the router's cost model); {wall} s.\n\n"
        f"{text}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

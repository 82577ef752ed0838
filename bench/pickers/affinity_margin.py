"""ttft's affinity margin over many offline configurations: TTFT and hit rate against the
other pickers, per margin.

    python bench/pickers/affinity_margin.py [--margins 0.1 0.5 ...] \
        [--out bench/results/affinity_margin.json]

A session stays on its worker while that worker's predicted cost is within
``affinity_margin`` (relative) of the best (policies/ttft.py); every move recomputes the
session's prefix elsewhere. Each configuration is simulated with unified, sticky and lmetric
and with ttft at each margin (outputs capped at 64 tokens, 1M KV tokens a worker, the
router's reading of bodies as measured by bench/live_vs_offline/ingest_window.py where it applies):

- the Weka agentic sample, session pacing, on 3, 4, 6 and 8 workers, picked in send order
  and in the order the router reads a burst (100 MB/s, 128 KB window, at the live check's
  20x);
- the conversation sample and Mooncake's conversation_trace and synthetic_trace (in
  ../shared/traces) on 4 and 8 workers at loads 0.5, 1 and 1.5 (arrivals sped up by load x
  workers / 4).

Per margin it counts the configurations where ttft's hit rate is within 2 points of the best
other picker's, where its TTFT p90 is at most the best other's, and both, and gives its TTFT
p50 and p90 against the first margin's (geometric mean and worst cell).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from policies.ttft import TTFTPicker  # noqa: E402
from traces.commands.options import cap_output, make_sim_picker  # noqa: E402
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import WorkerModelConfig  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402

DATA = ROOT / "traces" / "data"
SHARED = ROOT.parent / "shared" / "traces"
OTHERS = ("unified", "sticky", "lmetric")
KV = WorkerModelConfig(kv_capacity_tokens=1_000_000)
READ = {"ingest_bytes_per_s": 100e6 / 20, "ingest_window_bytes": 128 * 1024}


def configurations() -> list[tuple[str, list, SimConfig]]:
    cells = []
    weka = cap_output(load_trace(str(DATA / "weka_agentic_sample.jsonl")), 64)
    for workers in (3, 4, 6, 8):
        for order, read in (("send order", {}), ("read order", READ)):
            config = SimConfig(workers=workers, worker=KV, pacing="session", **read)
            cells.append((f"weka {workers} workers, {order}", weka, config))
    for name, path in (
        ("conversation sample", DATA / "conversation_sample.jsonl"),
        ("conversation_trace", SHARED / "conversation_trace.jsonl"),
        ("synthetic_trace", SHARED / "synthetic_trace.jsonl"),
    ):
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        trace = cap_output(load_trace(str(path)), 64)
        for workers in (4, 8):
            for load in (0.5, 1.0, 1.5):
                speedup = load * workers / 4
                config = SimConfig(workers=workers, worker=KV, speedup=speedup, **READ)
                cells.append((f"{name} {workers} workers, load {load}", trace, config))
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0, 2.0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for name, trace, config in configurations():
        others = [simulate(trace, make_sim_picker(p), config).summary() for p in OTHERS]
        row = {
            "configuration": name,
            "best_other_hit_rate": max(o["hit_rate"] for o in others),
            "best_other_ttft_p90": min(o["ttft_p90"] for o in others),
            "ttft": {},
        }
        for margin in args.margins:
            s = simulate(trace, TTFTPicker(affinity_margin=margin), config).summary()
            row["ttft"][str(margin)] = {k: s[k] for k in ("hit_rate", "ttft_p50", "ttft_p90")}
        rows.append(row)
        print(name, json.dumps(row["ttft"]), flush=True)
    first = str(args.margins[0])
    summary = []
    for margin in map(str, args.margins):
        hit_ok = p90_ok = both = 0
        logs50, logs90, worst, gaps = [], [], 0.0, []
        for row in rows:
            s, base = row["ttft"][margin], row["ttft"][first]
            gap = s["hit_rate"] - row["best_other_hit_rate"]
            good_hit, good_p90 = gap >= -0.02, s["ttft_p90"] <= row["best_other_ttft_p90"]
            hit_ok += good_hit
            p90_ok += good_p90
            both += good_hit and good_p90
            logs50.append(math.log(s["ttft_p50"] / base["ttft_p50"]))
            logs90.append(math.log(s["ttft_p90"] / base["ttft_p90"]))
            worst = max(worst, s["ttft_p90"] / base["ttft_p90"])
            gaps.append(gap)
        summary.append({
            "margin": float(margin), "configurations": len(rows), "hit_within_2_points": hit_ok,
            "p90_at_most_best_other": p90_ok, "both": both,
            "p90_vs_first_geomean": round(math.exp(sum(logs90) / len(rows)), 3),
            "p90_vs_first_worst": round(worst, 3),
            "p50_vs_first_geomean": round(math.exp(sum(logs50) / len(rows)), 3),
            "mean_hit_gap_points": round(100 * sum(gaps) / len(rows), 2),
        })  # fmt: skip
        print(json.dumps(summary[-1]))
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

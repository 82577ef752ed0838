"""Issue 52's capacity bars, cell by cell, in one run: ttft's capacity at the cell's TTFT SLO
against the best peer re-implementation's, and ttft's p90 from its capacity up to twice it.

    python bench/pickers/capacity_bars.py [--cells synthetic8 conversation8 ...] \
        [--extra=--kv-events] [--out bench/results/capacity_bars.json] [--md FILE]

Each cell is one ``cache-router capacity`` run (ttft and the peers) and five ``simulate`` runs
at ttft's capacity x 1, 1.25, 1.5, 1.75 and 2. The bars (issue 52): ttft's capacity >= 1.25x
the best peer's, and at each of those loads ttft's TTFT p90 <= 1.25x the lowest peer p90 at
that load. ``--extra`` adds flags to every run: ``--kv-events`` (precise mode: the router reads
the workers' KV events, the configuration llm-d's precise scorer is defined by) or
``--gpu-profile flat --cost-profile flat`` (the old flat model). Runs go under ``--work``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

PEERS = ("llmd", "llmd_precise", "dynamo", "smg", "aibrix")
CURVE = (1.0, 1.25, 1.5, 1.75, 2.0)
CAPACITY_BAR = 1.25
CURVE_BAR = 1.25
SHARED = Path("../shared/traces")
# Weka sessions with a request longer than 262,144 tokens (they cannot run on that KV).
WEKA_TOO_LONG = {"trace_0037.json", "trace_0038.json", "trace_0040.json", "trace_0041.json"}

CELLS: dict[str, tuple[str, int, int, str]] = {  # trace, workers, KV tokens, SLO
    "synthetic8": (str(SHARED / "synthetic_trace.jsonl"), 8, 1_000_000, "ttft_p90=2"),
    "conversation8": (str(SHARED / "conversation_trace.jsonl"), 8, 1_000_000, "ttft_p90=2"),
    "agentic4_15s": ("traces/data/weka_agentic_sample.jsonl", 4, 1_000_000, "ttft_p90=15"),
    "weka8_262k_fit": ("WEKA_FIT", 8, 262_144, "ttft_p90=5"),
    "weka8_512k": (str(SHARED / "weka_kv_cache_tester"), 8, 524_288, "ttft_p90=5"),
}


def weka_fit_dir(work: Path) -> Path:
    """A directory of links to the Weka sessions whose every request fits 262,144 tokens."""
    target = work / "weka_fit262k"
    target.mkdir(parents=True, exist_ok=True)
    for source in sorted((SHARED / "weka_kv_cache_tester").resolve().glob("trace_*.json")):
        link = target / source.name
        if source.name not in WEKA_TOO_LONG and not link.exists():
            link.symlink_to(source)
    return target


def curve_bar(p90: dict[str, float]) -> tuple[str, float]:
    """(best peer, ttft's p90 over the best peer's) at one load; a peer without a p90 (no
    request answered) does not count."""
    peers = {name: value for name, value in p90.items() if name in PEERS and value is not None}
    best = min(peers, key=peers.__getitem__)
    return best, p90["ttft"] / peers[best]


def capacity_bar(capacity: dict[str, float | None]) -> tuple[str, float]:
    """(best peer, ttft's capacity over the best peer's); a peer that fails at every load
    tried (``None``) counts as 0."""
    peers = {name: capacity.get(name) or 0.0 for name in PEERS}
    best = max(peers, key=peers.__getitem__)
    return best, (capacity["ttft"] or 0.0) / peers[best] if peers[best] else float("inf")


def _run(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"cache-router {' '.join(argv)}: exit {done.returncode}\n{done.stderr}")


def run_cell(
    name: str, work: Path, extra: list[str], jobs: int, capacity_extra: Sequence[str] = ()
) -> dict:
    trace, workers, kv, slo = CELLS[name]
    if trace == "WEKA_FIT":
        trace = str(weka_fit_dir(work))
    policies = ",".join(("ttft", *PEERS))
    fleet = ["--trace", trace, "--workers", str(workers), "--kv-capacity-tokens", str(kv)]
    quiet = ["--no-plots", "--no-hit-gap", *extra]
    out = work / name
    _run(["capacity", *fleet, "--slo", slo, "--policies", policies, "--jobs", str(jobs),
          *quiet, *capacity_extra, "--out", str(out / "capacity")])  # fmt: skip
    doc = json.loads((out / "capacity" / "capacity.json").read_text())
    capacity = {p: doc["policies"][p]["capacity"] for p in ("ttft", *PEERS)}
    best, ratio = capacity_bar(capacity)
    cell = {
        "trace": trace, "workers": workers, "kv_capacity_tokens": kv, "slo": slo,
        "extra": extra, "capacity_extra": list(capacity_extra), "capacity": capacity,
        "best_peer": best,
        "ttft_over_best_peer": ratio, "capacity_bar_met": ratio >= CAPACITY_BAR, "curve": [],
    }  # fmt: skip
    base = capacity["ttft"]
    for factor in CURVE if base else ():
        speedup = round(base * factor, 3)
        run = out / f"x{factor}"
        _run(["simulate", *fleet, "--policies", policies, "--speedup", str(speedup),
              *quiet, "--out", str(run)])  # fmt: skip
        results = json.loads((run / "results.json").read_text())["policies"]
        p90 = {p: results[p]["ttft_p90"] for p in results}
        peer, over = curve_bar(p90)
        cell["curve"].append({
            "x_ttft_capacity": factor, "speedup": speedup, "ttft_p90": p90,
            "hit_rate": {p: results[p]["hit_rate"] for p in results},
            "ttft_pred_mdape": results["ttft"].get("ttft_pred_mdape"),
            "best_peer": peer, "ttft_over_best_peer_p90": over, "bar_met": over <= CURVE_BAR,
        })  # fmt: skip
    cell["curve_bar_met"] = bool(cell["curve"]) and all(p["bar_met"] for p in cell["curve"])
    return cell


def markdown(cells: dict[str, dict]) -> str:
    rows = [
        "| cell | SLO | ttft | best peer | ttft / best peer | capacity bar | p90 ttft / best peer, 1-2x | curve bar |",  # noqa: E501
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for name, c in cells.items():
        best = c["best_peer"]
        curve = " / ".join(f"{p['ttft_over_best_peer_p90']:.2f}" for p in c["curve"])
        rows.append(
            f"| {name} | {c['slo']} | {c['capacity']['ttft'] or 0:.3f} | {best} "
            f"{c['capacity'][best] or 0:.3f} | {c['ttft_over_best_peer']:.2f} | "
            f"{'met' if c['capacity_bar_met'] else 'not met'} | {curve} | "
            f"{'met' if c['curve_bar_met'] else 'not met'} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=list(CELLS)[:4])
    parser.add_argument("--extra", default="", help="flags for every run: --extra=--kv-events")
    parser.add_argument(
        "--capacity-extra",
        default="",
        help="flags for the capacity runs only (the curve's simulate runs do not take "
        "them): --capacity-extra='--replays 3'",
    )
    parser.add_argument("--work", type=Path, default=Path("out/capacity_bars"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the cells' JSON here")
    parser.add_argument("--md", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    extra = shlex.split(args.extra)
    cells = {}
    for name in args.cells:
        cells[name] = run_cell(name, args.work, extra, args.jobs, shlex.split(args.capacity_extra))
        print(markdown({name: cells[name]}).splitlines()[-1], flush=True)
    table = markdown(cells)
    print(table)
    if args.out:
        args.out.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")
    if args.md:
        args.md.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

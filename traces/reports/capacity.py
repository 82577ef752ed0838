"""``capacity``'s report: capacity.json (a stable interface), capacity.md, a PNG per SLO.

capacity.json:

    {"trace": {...}, "fleet": {"workers", "kv_capacity_tokens", ...}, "slos": ["ttft_p90=2"],
     "grid": {...}, "rate_per_load": {"rps", "prompt_tokens_per_s"}, "bounds": {...},
     "wall_seconds": s,
     "policies": {NAME: {"capacity", "capacity_rps", "capacity_tokens_per_s", "first_fail",
                         "monotone", "holds_again", "censored", "hit_rate_at_capacity",
                         "hit_gap_at_capacity", "x_best_other", "x_round_robin", "x_bound",
                         "evaluations", "wall_seconds",
                         "curve": [{"load", "rps", "tokens_per_s", "holds", "ttft_p50",
                                    "ttft_p90", "ttft_p99", "e2e_p50", ..., "hit_rate"}]}}}

Loads are trace speedups; ``rps`` and ``tokens_per_s`` what a load offers (requests and
prompt tokens over the sped-up span). ``capacity`` is None when no load held (down to the
grid's bottom); ``censored`` when none failed (the capacity is at least the grid's top).
``x_bound`` is the capacity over the load ceiling (``bounds``, traces/sim/bounds.py).
``hit_gap_at_capacity`` (offline, unless ``--no-hit-gap``; else None) is the hit gap's split at
the capacity, ``gap_gap``, ``gap_elsewhere``, ``gap_in_flight``, ``gap_evicted`` as fractions
of prompt tokens (traces/reports/hit_gap.py), and every curve point carries the same keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from traces.sim.bounds import Bounds
from traces.sim.capacity import SLO, Capacity, Grid, Point
from traces.trace.record import TraceRequest

BASELINE = "round_robin"


def capacity_document(
    trace_info: Mapping[str, Any],
    trace: Sequence[TraceRequest],
    bounds: Bounds,
    results: Mapping[str, tuple[Capacity, float]],
    slos: Sequence[SLO],
    grid: Grid,
    fleet: Mapping[str, Any],
    wall_seconds: float,
) -> dict[str, Any]:
    """The capacity.json document of ``results`` (policy -> (capacity, search seconds))."""
    span = trace[-1].arrival - trace[0].arrival
    rps = len(trace) / span
    tps = sum(r.input_length for r in trace) / span
    policies: dict[str, dict[str, Any]] = {}
    for name, (result, seconds) in results.items():
        at = result.at(result.capacity)
        policies[name] = {
            "capacity": result.capacity,
            "capacity_rps": _times(result.capacity, rps),
            "capacity_tokens_per_s": _times(result.capacity, tps),
            "first_fail": result.first_fail,
            "monotone": result.monotone,
            "holds_again": result.holds_again,
            "censored": result.censored,
            "hit_rate_at_capacity": at.metrics.get("hit_rate") if at is not None else None,
            "hit_gap_at_capacity": _gap_at(at),
            "evaluations": len(result.points),
            "wall_seconds": seconds,
            "curve": [_curve_point(p, rps, tps) for p in result.curve()],
        }
    ceiling = bounds.as_dict()["load_ceiling"]
    for name, entry in policies.items():
        others = [e["capacity"] for n, e in policies.items() if n != name]
        best = max((c for c in others if c is not None), default=None)
        base = policies.get(BASELINE, {}).get("capacity") if name != BASELINE else None
        entry["x_best_other"] = _ratio(entry["capacity"], best)
        entry["x_round_robin"] = _ratio(entry["capacity"], base)
        entry["x_bound"] = _ratio(entry["capacity"], ceiling)
    return {
        "trace": dict(trace_info),
        "fleet": dict(fleet),
        "slos": [str(s) for s in slos],
        "slos_below_bound": below_bound(slos, bounds.as_dict()),
        "grid": asdict(grid),
        "rate_per_load": {"rps": rps, "prompt_tokens_per_s": tps},
        "bounds": bounds.as_dict(),
        "wall_seconds": wall_seconds,
        "policies": policies,
    }


def below_bound(slos: Sequence[SLO], bounds: Mapping[str, Any]) -> list[str]:
    """The TTFT SLOs no router can meet at any load: below the percentile of the bound with
    the fleet's parallelism (traces/sim/bounds.py; p50, p90 and p99 only)."""
    out = []
    for slo in slos:
        bound = bounds.get(f"ttft_fleet_p{slo.percentile:g}") if slo.metric == "ttft" else None
        if bound is not None and bound > slo.seconds:
            out.append(f"{slo} (bound {bound:.3f} s)")
    return out


def capacity_table(document: Mapping[str, Any]) -> str:
    """One row per policy, then the bound (the load ceiling and the hit ceiling)."""
    gaps = any(e.get("hit_gap_at_capacity") for e in document["policies"].values())
    gap_headers = "".join(f" {h} |" for h in GAP_HEADERS) if gaps else ""
    rows = [
        "| policy | capacity (x trace) | req/s | prompt tok/s | x best other | x round_robin "
        "| x bound | hit rate at capacity |" + gap_headers + " first fail | monotone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"
        + "---:|" * (len(GAP_HEADERS) * gaps)
        + "---:|---|",
    ]
    for name, e in document["policies"].items():
        capacity = e["capacity"]
        shown = (
            f"< {e['first_fail']:.3g}"
            if capacity is None
            else f">= {capacity:.3f}"
            if e["censored"]
            else f"{capacity:.3f}"
        )
        monotone = "yes" if e["monotone"] else f"no: holds again at {e['holds_again']:.3f}"
        rows.append(
            f"| {name} | {shown} | {_fmt(e['capacity_rps'], '{:.2f}')} "
            f"| {_fmt(e['capacity_tokens_per_s'], '{:,.0f}')} | {_fmt(e['x_best_other'])} "
            f"| {_fmt(e['x_round_robin'])} | {_fmt(e['x_bound'])} "
            f"| {_fmt(e['hit_rate_at_capacity'], '{:.1%}')} |{_gap_cells(e) if gaps else ''}"
            f" {_fmt(e['first_fail'], '{:.3f}')} | {monotone} |"
        )
    b = document["bounds"]
    rows.append(
        f"| bound | {_fmt(b['load_ceiling'], '{:.3f}')} | {_fmt(b['load_ceiling_rps'], '{:.2f}')} "
        f"| {_fmt(b['load_ceiling_tokens_per_s'], '{:,.0f}')} | | | 1.00 "
        f"| {b['hit_ceiling']:.1%} (ceiling) |" + " |" * (len(GAP_HEADERS) * gaps) + " | |"
    )
    return "\n".join(rows)


GAP_HEADERS = ("gap pts", "elsewhere", "in flight", "evicted")
"""The hit gap at capacity, points of prompt tokens (traces/reports/hit_gap.py's GAP_METRICS)."""


def _gap_cells(entry: Mapping[str, Any]) -> str:
    gap = entry.get("hit_gap_at_capacity") or {}
    keys = ("gap_gap", "gap_elsewhere", "gap_in_flight", "gap_evicted")
    return "".join(f" {_fmt(gap.get(k), '{:.2f}', 100)} |" for k in keys)


def describe(document: Mapping[str, Any]) -> str:
    """The run in a paragraph: trace, fleet, SLOs and what the bound row is."""
    t, f, b = document["trace"], document["fleet"], document["bounds"]
    return (
        f"{t['name']}: {t['requests']} requests over {t['span_seconds']:.0f} s; "
        f"{f['workers']} workers, KV {f['kv_capacity_tokens']:,} tokens each, {f['pacing']} "
        f"pacing, {f['mode']}, the router reading {_view(f)}; SLOs "
        f"{', '.join(document['slos'])}. Capacity: the highest trace speedup at which every "
        f"SLO holds (below the first that fails{_filled(document)}){_replays(f)}. bound: the "
        f"load ceiling (the fleet's prefill rate filled at the hit ceiling, Belady on the "
        f"pooled {b['pooled_kv_tokens']:,} KV tokens: {b['hit_ceiling']:.1%}); TTFT floors "
        f"p50/p90/p99 {b['ttft_p50']:.3f}/{b['ttft_p90']:.3f}/{b['ttft_p99']:.3f} s, with "
        f"the fleet's parallelism (simultaneous arrivals share the workers) "
        f"{b['ttft_fleet_p50']:.3f}/{b['ttft_fleet_p90']:.3f}/{b['ttft_fleet_p99']:.3f} s."
        + _below(document.get("slos_below_bound", []))
    )


def _filled(document: Mapping[str, Any]) -> str:
    """How densely the loads below the capacity were tried (the search's fill-in)."""
    grid = document.get("grid", {})
    if not grid.get("verify"):
        return "; bisection only"
    return f"; every load in the grid step below it tried, at most {grid['tolerance']:.0%} apart"


def _replays(fleet: Mapping[str, Any]) -> str:
    """How many runs each load pooled (the trace, then replays with jittered arrivals)."""
    k = fleet.get("replays", 1)
    if k <= 1:
        return ""
    return (
        f"; each load's percentiles pool {k} runs: the trace as recorded and {k - 1} with "
        f"each arrival moved by up to {fleet['jitter']:g} of the mean gap"
    )


def _view(fleet: Mapping[str, Any]) -> str:
    """What the router knows of the workers' caches (documents before the keys: a shadow)."""
    if fleet.get("kv_events"):
        return "the workers' KV events"
    return f"its {fleet.get('shadow', 'blocks')} shadow"


def _below(slos: Sequence[str]) -> str:
    if not slos:
        return ""
    return f" No router meets {', '.join(slos)} at any load: the SLO is below the bound."


def write_capacity(document: Mapping[str, Any], out_dir: Path, plots: bool) -> list[Path]:
    """capacity.json, capacity.md and (``plots``) a PNG per SLO; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "capacity.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    md_path = out_dir / "capacity.md"
    md_path.write_text(
        f"# Capacity: {document['trace']['name']}\n\n{describe(document)}\n\n"
        f"{capacity_table(document)}\n"
    )
    paths = [json_path, md_path]
    if plots:
        paths += write_capacity_plots(document, out_dir)
    return paths


def write_capacity_plots(document: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Per SLO: its metric against load per policy (the SLO, the TTFT floor, the load
    ceiling marked) over the hit rate against load (the hit ceiling marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounds = document["bounds"]
    paths = []
    for slo in document["slos"]:
        key, limit = slo.split("=")
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
        for name, entry in document["policies"].items():
            curve = [p for p in entry["curve"] if p.get(key) is not None]
            loads = [p["load"] for p in curve]
            (line,) = top.plot(loads, [p[key] for p in curve], marker="o", ms=3, label=name)
            bottom.plot(loads, [p["hit_rate"] for p in curve], marker="o", ms=3,
                        color=line.get_color())  # fmt: skip
            if entry["capacity"] is not None:
                top.axvline(entry["capacity"], color=line.get_color(), lw=0.6, ls=":")
        top.axhline(float(limit), color="black", ls="--", lw=1, label=f"SLO {slo}")
        if bounds.get(key) is not None:
            top.axhline(bounds[key], color="grey", ls="-.", lw=1, label=f"{key} floor")
        fleet = bounds.get(key.replace("ttft_", "ttft_fleet_"))
        if key.startswith("ttft_") and fleet is not None:
            top.axhline(fleet, color="grey", ls=":", lw=1, label=f"{key} bound, fleet")
        if bounds["load_ceiling"] is not None:
            for ax in (top, bottom):
                ax.axvline(bounds["load_ceiling"], color="red", ls="--", lw=1)
            top.plot([], [], color="red", ls="--", label="load ceiling")
        bottom.axhline(bounds["hit_ceiling"], color="grey", ls="-.", lw=1, label="hit ceiling")
        top.set_xscale("log")
        top.set_yscale("log")
        top.set_ylabel(f"{key} (s)")
        top.set_title(f"{document['trace']['name']}: {key} against load")
        top.grid(True, which="both", alpha=0.3)
        top.legend(fontsize=7, ncol=2)
        bottom.set_ylabel("hit rate")
        bottom.set_xlabel("load (trace speedup)")
        bottom.grid(True, which="both", alpha=0.3)
        bottom.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"capacity_{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _curve_point(point: Point, rps: float, tps: float) -> dict[str, Any]:
    """One evaluated load in capacity.json: what it offers, whether it held, its metrics."""
    offered = {"load": point.load, "rps": point.load * rps, "tokens_per_s": point.load * tps}
    return offered | {"holds": point.holds} | _finite(point.metrics)


def _finite(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """NaN (no sample) as None, for JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


def _gap_at(point: Point | None) -> dict[str, float] | None:
    """The hit gap's metrics at ``point`` (offline runs with the split), else None."""
    if point is None:
        return None
    gap = {k: v for k, v in point.metrics.items() if k.startswith("gap_")}
    return gap or None


def _times(load: float | None, per_load: float) -> float | None:
    return None if load is None else load * per_load


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b and math.isfinite(b) else None


def _fmt(value: float | None, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    return "" if value is None else fmt.format(value * scale)

"""Policy comparison reports: results.json, a markdown table and PNG plots.

results.json is a stable interface (``simulate`` writes it; ``replay`` and ``sweep`` write the
same shape):

    {"trace": {...}, "workers": N, "wall_seconds": s,
     "policies": {NAME: {"requests", "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50",
                         "e2e_p50", "e2e_p99", "throughput_rps", "hit_rate",
                         "shadow_abs_error", "imbalance", "pick_us_p50", "pick_us_p99",
                         "branches": {...}}}}

Times are seconds unless the key says otherwise; ``hit_rate`` and ``shadow_abs_error`` are
fractions of prompt tokens; ``imbalance`` is max / mean requests per worker. When the
simulator-only ``oracle`` ran too (``traces/sim/oracle.py``), every policy also gets
``ttft_p50_x_oracle``, ``ttft_p90_x_oracle``, ``ttft_p99_x_oracle`` (its TTFT percentile over
the oracle's), and the table a "x oracle" column after each TTFT column.

``simulate`` also writes the trace's ``bounds`` on the fleet (:class:`traces.sim.bounds.Bounds`:
the TTFT floors' percentiles, the hit ceiling, the load ceiling); every policy then gets
``hit_rate_x_bound`` (its hit rate over the ceiling) and ``ttft_p50_x_bound``,
``ttft_p90_x_bound``, ``ttft_p99_x_bound`` (its percentile over the floor's), and the table
an "x bound" column beside each and a last row, ``bound``. ``simulate`` then splits each
policy's gap to the hit ceiling into its causes: ``hit_gap`` per policy and a second table
(traces/reports/hit_gap.py). Requests the simulator refused (flow control's 429s, or a prompt
past a worker's context, the engine's 400) are counted in ``rejected`` (the latter also in
``rejected_too_long``) and left out of the latencies.

The router's own TTFT prediction (its cost model at booking, router/cache/cost_model.py)
against the observed TTFT: ``ttft_pred_mdape`` and ``ttft_pred_mape`` (the median and mean
absolute error as a fraction of the observed), ``ttft_pred_bias`` (predicted seconds over
observed ones) and ``ttft_pred_requests``; the table's "TTFT pred err" column is the median.
``simulate`` scores every request; ``replay`` and ``sweep`` read the routers' /metrics
(``ttft_prediction_error_ratio``: the median from its buckets).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from traces.reports.hit_gap import hit_gap_note, hit_gap_table
from traces.sim.oracle import ORACLE
from traces.trace.run import PolicyRun

ORACLE_RATIOS = ("ttft_p50", "ttft_p90", "ttft_p99")
BOUND_RATIOS = {  # a policy's figure -> the bound it is set against
    "hit_rate": "hit_ceiling",
    "ttft_p50": "ttft_p50",
    "ttft_p90": "ttft_p90",
    "ttft_p99": "ttft_p99",
}
BOUND_ROW = "bound"

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # key, header, format
    ("hit_rate", "hit rate", "{:.1%}"),
    ("hit_rate_x_bound", "x bound", "{:.2f}"),
    ("ttft_p50", "TTFT p50 s", "{:.3f}"),
    ("ttft_p50_x_oracle", "x oracle", "{:.2f}"),
    ("ttft_p50_x_bound", "x bound", "{:.2f}"),
    ("ttft_p90", "TTFT p90 s", "{:.3f}"),
    ("ttft_p90_x_oracle", "x oracle", "{:.2f}"),
    ("ttft_p90_x_bound", "x bound", "{:.2f}"),
    ("ttft_p99", "TTFT p99 s", "{:.3f}"),
    ("ttft_p99_x_oracle", "x oracle", "{:.2f}"),
    ("ttft_p99_x_bound", "x bound", "{:.2f}"),
    ("tpot_p50", "TPOT p50 ms", "ms"),
    ("e2e_p50", "E2E p50 s", "{:.2f}"),
    ("e2e_p99", "E2E p99 s", "{:.2f}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("imbalance", "imbalance", "{:.2f}"),
    ("shadow_abs_error", "shadow err", "{:.1%}"),
    ("ttft_pred_mdape", "TTFT pred err", "{:.1%}"),
    ("pick_us_p99", "pick p99 µs", "{:.1f}"),
)


def results_document(
    trace: Mapping[str, Any], workers: int, wall_seconds: float, runs: Sequence[PolicyRun]
) -> dict[str, Any]:
    """The results.json document for ``runs`` (one per policy)."""
    policies = {}
    for run in runs:
        entry = run.summary()
        entry["branches"] = dict(sorted(run.branches.items()))
        policies[run.name] = entry
    oracle = policies.get(ORACLE)
    if oracle is not None:
        for entry in policies.values():
            for key in ORACLE_RATIOS:
                entry[f"{key}_x_oracle"] = entry[key] / oracle[key] if oracle[key] > 0 else None
    return {
        "trace": dict(trace),
        "workers": workers,
        "wall_seconds": wall_seconds,
        "policies": policies,
    }


def add_bounds(document: dict[str, Any], bounds: Mapping[str, float]) -> None:
    """``bounds`` (:meth:`traces.sim.bounds.Bounds.as_dict`) in ``document``, and each policy's
    ``*_x_bound`` ratios (module docstring)."""
    document["bounds"] = dict(bounds)
    for entry in document["policies"].values():
        for key, bound in BOUND_RATIOS.items():
            value, limit = entry.get(key), bounds[bound]
            entry[f"{key}_x_bound"] = value / limit if value is not None and limit else None


def markdown_table(document: Mapping[str, Any]) -> str:
    """One row per policy, the columns of :data:`TABLE_COLUMNS` ("x oracle" ones if it ran,
    "x bound" ones and a last ``bound`` row if the document has bounds)."""
    with_oracle = ORACLE in document["policies"]
    bounds = document.get("bounds")
    columns = [
        c
        for c in TABLE_COLUMNS
        if (with_oracle or not c[0].endswith("_x_oracle"))
        and (bounds is not None or not c[0].endswith("_x_bound"))
    ]
    header = "| policy | requests | " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|---|---:|" + "---:|" * len(columns)
    rows = [header, rule]
    entries = dict(document["policies"])
    if bounds is not None:
        requests = next(iter(entries.values()), {}).get("requests", "")
        entries[BOUND_ROW] = {"requests": requests} | {
            key: bounds[bound] for key, bound in BOUND_RATIOS.items()
        }
    for name, entry in entries.items():
        cells = []
        for key, _, fmt in columns:
            value = entry.get(key)
            if value is None:
                cells.append("")
            elif fmt == "ms":
                cells.append(f"{value * 1000:.1f}")
            else:
                cells.append(fmt.format(value))
        rows.append(f"| {name} | {entry['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def write_results(document: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """results.json and results.md in ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    md_path = out_dir / "results.md"
    trace = document["trace"]
    md_path.write_text(
        f"# Policy comparison: {trace.get('name', 'trace')}\n\n"
        f"{document['workers']} workers, {trace.get('requests', '?')} requests.\n\n"
        f"{markdown_table(document)}\n"
        + (f"\n{bounds_note(document['bounds'])}\n" if "bounds" in document else "")
        + (f"\n{gap}\n\n{hit_gap_note()}\n" if (gap := hit_gap_table(document)) else "")
    )
    return [json_path, md_path]


def bounds_note(bounds: Mapping[str, float]) -> str:
    """The bounds in a sentence (how the ``bound`` row was made: traces/sim/bounds.py)."""
    load = (
        "none (no prefill work or no span)"
        if bounds["load_ceiling"] is None
        else f"{bounds['load_ceiling']:.2f}x the trace ({bounds['load_ceiling_rps']:.2f} req/s, "
        f"{bounds['load_ceiling_tokens_per_s']:,.0f} prompt tokens/s)"
    )
    fleet = "/".join(
        "-" if bounds.get(f"ttft_fleet_p{q}") is None else f"{bounds[f'ttft_fleet_p{q}']:.3f}"
        for q in (50, 90, 99)
    )
    return (
        f"bound: TTFT floors (infinite caches, no queue; with the fleet's parallelism for "
        f"simultaneous arrivals, p50/p90/p99 {fleet} s), hit ceiling {bounds['hit_ceiling']:.1%} "
        f"(Belady on the pooled {bounds['pooled_kv_tokens']:,} KV tokens; never evicting: "
        f"{bounds['infinite_hit_ceiling']:.1%}), load ceiling {load}"
    )


def write_plots(runs: Sequence[PolicyRun], out_dir: Path) -> list[Path]:
    """TTFT CDF per policy, true hit rate per policy, per-worker in-flight over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ttft = np.sort(run.first_token - run.arrival)
        ax.plot(ttft, np.arange(1, len(ttft) + 1) / max(1, len(ttft)), label=run.name)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(_save(fig, out_dir / "ttft_cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r.name for r in runs]
    rates = [float(r.cached.sum()) / max(1.0, float(r.input_length.sum())) for r in runs]
    ax.bar(names, [100 * x for x in rates], color="tab:blue")
    for i, rate in enumerate(rates):
        ax.annotate(f"{rate:.1%}", (i, 100 * rate), ha="center", va="bottom")
    ax.set_ylabel("prefix cache hit rate (% of prompt tokens)")
    ax.set_title("True hit rate per policy")
    ax.tick_params(axis="x", rotation=20)
    paths.append(_save(fig, out_dir / "hit_rate.png"))

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.8 * len(runs) + 0.6), sharex=True)
    for ax, run in zip(np.atleast_1d(axes), runs, strict=True):
        for w in range(run.inflight.shape[1]):
            ax.plot(run.inflight_t, run.inflight[:, w], linewidth=0.8)
        ax.set_ylabel(run.name, rotation=0, ha="right", va="center")
        ax.grid(True, alpha=0.3)
    np.atleast_1d(axes)[-1].set_xlabel("time (s); one line per worker: requests in flight")
    paths.append(_save(fig, out_dir / "inflight.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

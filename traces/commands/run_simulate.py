"""What ``simulate`` runs (and ``demo`` offline): every policy on a fresh simulated fleet, the
bounds, the hit gap, the report (:func:`run_and_report`); the commands share it from here."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from traces.commands.options import (
    config_from_args,
    fleet_bounds,
    make_sim_picker,
    parse_policies,
    select_requests,
    trace_summary,
    with_tenants,
)
from traces.reports.hit_gap import add_hit_gap, hit_gap_note, hit_gap_table
from traces.reports.requests_out import write_requests
from traces.reports.results import (
    add_bounds,
    bounds_note,
    markdown_table,
    results_document,
    write_plots,
    write_results,
)
from traces.sim.bounds import pooled_blocks
from traces.sim.config import SimConfig
from traces.sim.hit_gap import CeilingHits, HitGap
from traces.sim.simulator import simulate
from traces.sim.worker_model import profile_arg
from traces.trace.cap import DEFAULT_MAX_TURNS, build_capped_trace
from traces.trace.record import TraceRequest, first_too_long
from traces.trace.run import PolicyRun


def policy_traces(
    trace: Sequence[TraceRequest], policies: Sequence[str], max_turns: int = DEFAULT_MAX_TURNS
) -> dict[str, Sequence[TraceRequest]]:
    """The trace each policy runs: ``trace``, or for ``capped`` its capped copy (built once)."""
    capped = build_capped_trace(trace, max_turns) if "capped" in policies else None
    return {name: capped if name == "capped" else trace for name in policies}


def run_policies(
    trace: Sequence[TraceRequest],
    policies: Sequence[str],
    config: SimConfig,
    seed: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
    progress: bool = False,
    traces: Mapping[str, Sequence[TraceRequest]] | None = None,
) -> list[PolicyRun]:
    """One simulation per policy, each on a fresh fleet; seeded pickers get ``seed``; each
    runs its entry of ``traces`` (default :func:`policy_traces`)."""
    traces = traces if traces is not None else policy_traces(trace, policies, max_turns)
    return [
        simulate(traces[name], make_sim_picker(name, seed), config, name, progress)
        for name in policies
    ]


def hit_gaps(
    runs: Sequence[PolicyRun],
    traces: Mapping[str, Sequence[TraceRequest]],
    config: SimConfig,
) -> dict[str, HitGap]:
    """Each run's hit gap against its trace's ceiling on the fleet (traces/sim/hit_gap.py), for
    the runs that recorded their block states (``SimConfig.hit_gap``)."""
    ceilings = CeilingHits(pooled_blocks(config.workers, config.worker))
    return {
        run.name: ceilings.gap(*_looked_up(traces[run.name], run))
        for run in runs
        if run.block_states is not None
    }


def _looked_up(
    trace: Sequence[TraceRequest], run: PolicyRun
) -> tuple[Sequence[TraceRequest], np.ndarray]:
    """The requests a worker looked up and their blocks' states: those refused as too long
    (the engine's 400) leave the hit gap, as they leave the hit rate."""
    if run.too_long is None:
        return trace, run.block_states
    kept = ~run.too_long
    per_block = np.repeat(kept, [len(r.blocks) for r in trace])
    return [r for r, k in zip(trace, kept, strict=True) if k], run.block_states[per_block]


def run_and_report(
    trace_path: str, trace: list[TraceRequest], args: argparse.Namespace, out: Path, plots: bool
) -> dict:
    """Simulate every policy of ``args``, print the table, write results (and plots)."""
    config = config_from_args(args)
    if not config.disaggregated and not getattr(args, "no_hit_gap", False):
        config = replace(config, hit_gap=True)
    policies = parse_policies(args.policies, offline=True)
    trace = with_tenants(select_requests(trace, args), args)
    fleet = (
        f"{config.prefill_workers} prefill + {config.decode_workers} decode workers "
        f"(decode policy {config.decode_policy})"
        if config.disaggregated
        else f"{config.workers} workers"
    )
    print(
        f"{len(trace)} requests, {fleet}, shadow={config.shadow}, "
        f"KV {config.worker.kv_capacity_tokens:,} tokens/worker, GPU profile "
        f"{profile_arg(config.worker.profile)}, router cost profile "
        f"{profile_arg(config.cost_profile)}, {config.worker.scheduling_policy} engines, "
        f"ttft's dispatch hold {config.hold_tokens() or 'off'}"
        + (
            f" + CPU tier {config.worker.cpu_kv_capacity_tokens:,} at "
            f"{config.worker.kv_load_gbps:g} GB/s (router tiers {config.router_tiers})"
            if config.worker.cpu_kv_capacity_tokens
            else ""
        ),
        file=sys.stderr,
    )
    warn_too_long(trace, config.context_tokens)
    started = time.perf_counter()
    traces = policy_traces(trace, policies, args.max_turns)
    runs = run_policies(trace, policies, config, args.seed, progress=True, traces=traces)
    summary = trace_summary(trace_path, trace)
    document = results_document(summary, config.fleet_size, time.perf_counter() - started, runs)
    document["pacing"] = config.pacing
    worker = config.worker
    document["gpu_profile"] = profile_arg(worker.profile)
    document["cost_profile"] = profile_arg(config.cost_profile)
    document["scheduling_policy"] = worker.scheduling_policy
    document["dispatch_hold_tokens"] = config.hold_tokens()  # the ttft router's (0: off)
    document["kv"] = {
        "gpu_tokens": worker.kv_capacity_tokens,
        "cpu_tokens": worker.cpu_kv_capacity_tokens,
        "load_gbps": worker.kv_load_gbps,
        "bytes_per_token": worker.kv_bytes_per_token,
        "router_tiers": config.router_tiers,
    }
    add_bounds(document, fleet_bounds(trace, config).as_dict())
    add_hit_gap(document, hit_gaps(runs, traces, config))
    if config.disaggregated:
        add_disaggregation(document, config, runs)
    written = write_results(document, out)
    if getattr(args, "requests_out", None):
        requests = Path(args.requests_out)
        write_requests(requests, trace, runs, traces)
        written.append(requests)
    if config.disaggregated:
        with (out / "results.md").open("a") as md:
            md.write(f"\nDisaggregated: {fleet}.\n\n{disaggregation_table(document)}\n")
    if plots:
        written += write_plots(runs, out)
    print(markdown_table(document))
    if config.disaggregated:
        print(f"\ndisaggregated, {fleet}:\n{disaggregation_table(document)}")
    print(f"\n{bounds_note(document['bounds'])}")
    gap_table = hit_gap_table(document)
    if gap_table:
        print(f"\n{gap_table}\n\n{hit_gap_note()}")
    print(f"{document['wall_seconds']:.1f} s; wrote {', '.join(str(p) for p in written)}")
    return document


def warn_too_long(trace: Sequence[TraceRequest], context_tokens: int) -> None:
    """One line on stderr when some requests exceed the workers' context: the simulator
    refuses them as the engine would (400), and the report counts them as rejected."""
    first = first_too_long(trace, context_tokens)
    if first is not None:
        count = sum(r.context_tokens > context_tokens for r in trace)
        print(
            f"{count} request(s) longer than a worker's context of {context_tokens:,} tokens "
            f"(prompt + output), refused as the engine refuses them (400), the first at "
            f"{first.where()}: {first.context_tokens:,} tokens",
            file=sys.stderr,
        )


DISAGGREGATION_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # key, header, format ("ms": seconds shown in milliseconds)
    ("prefill_hit_rate", "prefill hit rate", "{:.1%}"),
    ("decode_imbalance", "decode max/mean", "{:.2f}"),
    ("transfer_p50", "transfer p50 ms", "ms"),
    ("transfer_p90", "transfer p90 ms", "ms"),
    ("transfer_saved", "KV on decode", "{:.1%}"),
    ("ttft_p50", "TTFT p50 s", "{:.3f}"),
    ("ttft_p90", "TTFT p90 s", "{:.3f}"),
    ("tpot_p50", "TPOT p50 ms", "ms"),
    ("tpot_p90", "TPOT p90 ms", "ms"),
)


def add_disaggregation(document: dict, config: SimConfig, runs: Sequence[PolicyRun]) -> None:
    """A disaggregated run's fleet, transfer model and decode picks in ``document``."""
    document["disaggregated"] = {
        "prefill_workers": config.prefill_workers,
        "decode_workers": config.decode_workers,
        "decode_policy": config.decode_policy,
        "kv_transfer_latency_s": config.kv_transfer_latency_s,
        "kv_transfer_gbps": config.kv_transfer_gbps,
        "kv_bytes_per_token": config.kv_bytes_per_token,
    }
    for run in runs:
        entry = document["policies"][run.name]
        entry["decode_branches"] = dict(sorted(run.decode_branches.items()))


def disaggregation_table(document: dict) -> str:
    """One row per policy: the prefill side's hit rate, the decode side's balance, the KV
    transfers, TTFT (to the decode worker's first token) and TPOT."""
    header = "| policy | " + " | ".join(h for _, h, _ in DISAGGREGATION_COLUMNS) + " |"
    rows = [header, "|---|" + "---:|" * len(DISAGGREGATION_COLUMNS)]
    for name, entry in document["policies"].items():
        cells = []
        for key, _, fmt in DISAGGREGATION_COLUMNS:
            value = entry.get(key)
            cells.append(
                "" if value is None else f"{value * 1000:.1f}" if fmt == "ms" else fmt.format(value)
            )
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)

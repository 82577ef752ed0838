"""What ``capacity`` runs (and ``demo`` offline): each policy's search over loads, in the
simulator or through a live evaluator the command gives (:func:`run_capacity`)."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from traces.commands.options import (
    DEFAULT_SLO,
    config_from_args,
    fleet_bounds,
    grid_from_args,
    make_sim_picker,
    parse_policies,
    select_requests,
    trace_summary,
)
from traces.reports.capacity import capacity_document, capacity_table, write_capacity
from traces.sim.bounds import pooled_blocks
from traces.sim.capacity import (
    SLO,
    Capacity,
    Grid,
    Metrics,
    Point,
    parse_slo,
    search_capacity,
    slos_hold,
)
from traces.sim.config import SimConfig
from traces.sim.hit_gap import CeilingHits, gap_metrics
from traces.sim.simulator import simulate
from traces.sim.worker_model import profile_arg
from traces.trace.cap import build_capped_trace
from traces.trace.jitter import jittered
from traces.trace.record import TraceRequest, first_too_long
from traces.trace.run import PolicyRun

PERCENTILES = (50, 90, 99)

LiveEvaluator = Callable[..., Callable[[float], Metrics]]
"""``(trace, policy, args=, slos=) -> evaluate(load)``: one policy's metrics at a load, live."""


def run_metrics(run: PolicyRun | Sequence[PolicyRun], slos: Sequence[SLO] = ()) -> dict[str, float]:
    """TTFT, end-to-end and TPOT at p50/p90/p99 (and each SLO's percentile), hit rate; of
    several runs (replays of one load), their requests pooled."""
    runs = [run] if isinstance(run, PolicyRun) else list(run)
    each = [r.latencies() for r in runs]
    series = {m: np.concatenate([e[m] for e in each]) for m in each[0]}
    wanted = [(m, float(q)) for m in series for q in PERCENTILES]
    wanted += [(s.metric, s.percentile) for s in slos]
    out = {
        f"{m}_p{q:g}": float(np.percentile(series[m], q)) if len(series[m]) else float("nan")
        for m, q in wanted
    }
    cached = sum(float(r.cached.sum()) for r in runs)
    out["hit_rate"] = cached / max(1.0, sum(float(r.input_length.sum()) for r in runs))
    out["requests"] = sum(r.requests for r in runs)
    return out


def holds(slos: Sequence[SLO], metrics: Metrics) -> bool:
    """Every SLO holds, and no request failed (live)."""
    return not metrics.get("errors") and slos_hold(slos, metrics)


FLAT = 0.01  # a lower load whose SLO metrics are within 1% of a higher one's: a plateau


def flat(slos: Sequence[SLO], higher: Metrics, lower: Metrics) -> bool:
    """The SLO metrics did not improve by more than :data:`FLAT` from ``higher``'s load to
    ``lower``'s: what fails them at low load is the trace (its bursts, its long prompts),
    not the queue, and lower loads will not meet them either."""
    return all(lower[s.key] >= higher[s.key] * (1 - FLAT) for s in slos)


@dataclass(frozen=True)
class Job:
    """One policy's offline search (picklable: a worker process runs it)."""

    policy: str
    config: SimConfig
    slos: tuple[SLO, ...]
    grid: Grid
    seed: int
    max_turns: int
    replays: int = 1  # runs per load pooled: the trace as recorded, then jittered replays
    jitter: float = 0.0  # how far a replay moves each arrival, as a fraction of the mean gap


def search(
    job: Job, evaluate: Callable[[float], Metrics], on_point: Callable[[Point], None] | None
) -> Capacity:
    """``job``'s search over ``evaluate`` (traces/sim/capacity.py), its SLOs judging each load."""
    return search_capacity(
        evaluate, partial(holds, job.slos), job.grid, on_point, partial(flat, job.slos)
    )


def run_offline(
    job: Job, trace: list[TraceRequest], on_point: Callable[[Point], None] | None = None
) -> Capacity:
    """``job.policy``'s capacity in the simulator: a fresh fleet at each load."""
    if job.policy == "capped":
        trace = build_capped_trace(trace, job.max_turns)

    config = job.config
    ceilings = CeilingHits(pooled_blocks(config.workers, config.worker))
    replays = [trace] + [jittered(trace, job.seed + k, job.jitter) for k in range(1, job.replays)]

    def evaluate(load: float) -> Metrics:
        at = replace(config, speedup=load)
        runs = [simulate(t, make_sim_picker(job.policy, job.seed), at, job.policy) for t in replays]
        metrics = run_metrics(runs, job.slos)
        if runs[0].block_states is not None:  # config.hit_gap: the gap's split at this load
            metrics |= gap_metrics(ceilings.gap(trace, runs[0].block_states))
        return metrics

    return search(job, evaluate, on_point)


_shared: list[TraceRequest] = []  # a worker process's trace, inherited when it forks


def _share(trace: list[TraceRequest]) -> None:
    global _shared
    _shared = trace


def _run_shared(job: Job) -> Capacity:
    return run_offline(job, _shared)


class Progress:
    """One status line on stderr: policies done, the current policy, its latest load."""

    def __init__(self, policies: int, enabled: bool = True) -> None:
        self.total, self.done, self.enabled = policies, 0, enabled
        self.policy, self.runs = "", 0

    def start(self, policy: str) -> None:
        self.policy, self.runs = policy, 0

    def point(self, point: Point) -> None:
        self.runs += 1
        verdict = "holds" if point.holds else "fails"
        self._write(f"{self.policy:<20} run {self.runs:>2} at {point.load:7.3f}x: {verdict}")

    def finished(self, policy: str, result: Capacity, seconds: float) -> None:
        self.done += 1
        capacity = "none" if result.capacity is None else f"{result.capacity:.3f}x"
        self._write(f"{policy:<20} capacity {capacity} ({len(result.points)} runs, "
                    f"{seconds:.0f} s)", end="\n")  # fmt: skip

    def _write(self, text: str, end: str = "") -> None:
        if not self.enabled:
            return
        width = 20
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\r  [{bar}] {self.done}/{self.total}  {text:<60}{end}")
        sys.stderr.flush()


def search_all(
    trace: list[TraceRequest],
    jobs: Sequence[Job],
    processes: int = 1,
    live: Callable[[str], Callable[[float], Metrics]] | None = None,
    progress: bool = True,
) -> dict[str, tuple[Capacity, float]]:
    """Each job's capacity and the seconds its search took, in ``jobs``' order; offline,
    ``processes`` > 1 runs the searches in that many forked processes."""
    bar = Progress(len(jobs), progress)
    results: dict[str, tuple[Capacity, float]] = {}
    if processes > 1 and live is None:
        started = time.perf_counter()
        with ProcessPoolExecutor(
            processes,
            mp_context=multiprocessing.get_context("fork"),  # the trace is inherited
            initializer=_share,
            initargs=(trace,),
        ) as pool:
            futures = {pool.submit(_run_shared, job): job.policy for job in jobs}
            for future in as_completed(futures):
                policy = futures[future]
                results[policy] = (future.result(), time.perf_counter() - started)
                bar.finished(policy, *results[policy])
        return {job.policy: results[job.policy] for job in jobs}
    for job in jobs:
        bar.start(job.policy)
        started = time.perf_counter()
        if live is None:
            result = run_offline(job, trace, bar.point)
        else:
            result = search(job, live(job.policy), bar.point)
        results[job.policy] = (result, time.perf_counter() - started)
        bar.finished(job.policy, *results[job.policy])
    return results


def run_capacity(trace_path: str, trace: list[TraceRequest], args: argparse.Namespace,
                 out: Path, plots: bool, live_evaluator: LiveEvaluator | None = None,
                 ) -> dict:  # fmt: skip
    """Search every policy of ``args``, print the table, write capacity.json/.md (and the
    plots); returns the document. ``--live`` evaluates each load with ``live_evaluator``
    (``capacity``'s: through ``sweep``'s runner)."""
    slos = tuple(args.slo or [parse_slo(DEFAULT_SLO)])
    trace = select_requests(trace, args)
    if len(trace) < 2:
        raise ValueError("a capacity search needs a trace of at least 2 requests")
    if trace[-1].arrival <= trace[0].arrival:
        raise ValueError(
            f"all {len(trace)} requests arrive at one instant: a speedup does not change a "
            "single burst, so there is no load to search (simulate it instead)"
        )
    config = config_from_args(args)
    if args.live and args.worker:  # the given workers are the fleet
        config = replace(config, workers=len(args.worker))
    too_long = None if args.live and args.worker else first_too_long(trace, config.context_tokens)
    if too_long is not None:
        raise ValueError(
            f"{too_long.where()}: {too_long.context_tokens:,} tokens (prompt + output) exceed "
            f"a worker's context of {config.context_tokens:,}: the engine refuses it (400) at "
            "every load; drop it or raise --kv-capacity-tokens"
        )
    if args.replays > 1 and args.live:
        raise ValueError("--replays is offline only: a live evaluation runs the trace once")
    if args.replays > 1 and not args.jitter:
        raise ValueError("--replays > 1 needs --jitter > 0: else every replay is the trace")
    if not config.disaggregated and not args.live and not args.no_hit_gap and args.replays == 1:
        config = replace(config, hit_gap=True)  # (pooled replays: no one run's split)
    if config.pacing != "open":
        raise ValueError(
            "capacity needs --pacing open: session-paced, a fleet that falls behind slows its "
            "sessions instead of queueing them, so a speedup is not the load it is offered"
        )
    policies = parse_policies(args.policies, offline=not args.live)
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    bounds = fleet_bounds(trace, config)
    grid = grid_from_args(args, bounds)
    mode = "live" if args.live else "offline"
    kv = (
        "KV as they have it"
        if args.live and args.worker
        else f"KV {config.worker.kv_capacity_tokens:,} tokens/worker"
    )
    print(
        f"capacity ({mode}) of {len(policies)} policies at {', '.join(map(str, slos))}: "
        f"{len(trace)} requests, {config.fleet_size} workers, {kv}; loads {grid.min_load:.3g}x to "
        f"{grid.max_load:.3g}x the trace, from {grid.start:g}x in steps of {grid.factor:g}x",
        file=sys.stderr,
    )
    started = time.perf_counter()
    jobs = [
        Job(p, config, slos, grid, args.seed, args.max_turns, args.replays, args.jitter)
        for p in policies
    ]
    live = None
    if args.live:
        if live_evaluator is None:
            raise ValueError("--live needs a live evaluator (cache-router capacity --live)")
        live = partial(live_evaluator, trace, args=args, slos=slos)
    results = search_all(trace, jobs, args.jobs, live)
    document = capacity_document(
        trace_summary(trace_path, trace), trace, bounds, results, slos, grid,
        {"workers": config.fleet_size, "kv_capacity_tokens": config.worker.kv_capacity_tokens,
         "prefill_tokens_per_s": config.worker.prefill_tokens_per_s, "pacing": config.pacing,
         "mode": mode, "jobs": args.jobs, "gpu_profile": profile_arg(config.worker.profile),
         "cost_profile": profile_arg(config.cost_profile), "shadow": config.shadow,
         "kv_events": config.kv_events, "replays": args.replays,
         "jitter": args.jitter if args.replays > 1 else 0.0,
         "scheduling_policy": config.worker.scheduling_policy,
         "dispatch_hold_tokens": config.hold_tokens()},
        time.perf_counter() - started,
    )  # fmt: skip
    written = write_capacity(document, out, plots)
    print(capacity_table(document))
    print(f"{document['wall_seconds']:.1f} s; wrote {', '.join(str(p) for p in written)}")
    return document

"""``cache-router capacity``: how much load each policy carries within latency SLOs.

Operators size a fleet by the traffic it carries within its SLO, so policies are compared by
that: for each, the highest trace speedup (and the requests/s and prompt tokens/s it means)
at which every ``--slo`` holds, searched in the simulator over a geometric grid then by
bisection near the knee (traces/capacity.py). One parsed trace serves every load; each load
is a fresh fleet, as ``simulate`` runs it, with ``simulate``'s worker-model and fleet options.
The report sets each policy against the best other one, against ``round_robin`` and against
the trace's bounds on that fleet (traces/bounds.py), and writes every evaluated load's
TTFT percentiles and hit rate (capacity.json) and one plot per SLO. Offline, each load's hit
gap is split into its causes too (traces/hit_gap.py; ``--no-hit-gap`` skips it), and the
table shows the split at each policy's capacity.

``--live`` evaluates each load as ``sweep`` does instead: one router per (policy, load) in
front of sim workers started for it (``--workers`` of them, the worker-model options, running
``--live-time-scale`` times faster than real time, so they see ``load`` times the trace's
load) or of running ``--worker`` URLs (real time: arrivals at ``load`` times the trace's
rate). Each evaluation takes the trace's span over ``load x time scale`` real seconds, and
at high time scales the harness's own milliseconds read as modelled ones (docs/simulation.md).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from router.validation import COUNT_OR_OFF, MAX_WORKERS, POSITIVE, integer, number, refuse
from traces import sweep
from traces.bounds import Bounds, pooled_blocks
from traces.cap import build_capped_trace
from traces.capacity import (
    SLO,
    Capacity,
    Grid,
    Metrics,
    Point,
    parse_slo,
    search_capacity,
    slos_hold,
)
from traces.capacity_report import capacity_document, capacity_table, write_capacity
from traces.formats import load_trace
from traces.hit_gap import CeilingHits
from traces.hit_gap_report import gap_metrics
from traces.record import TraceRequest, first_too_long
from traces.simulate import (
    add_simulation_options,
    config_from_args,
    cost_args,
    fleet_bounds,
    make_sim_picker,
    parse_policies,
    select_requests,
    trace_summary,
)
from traces.simulator import PolicyRun, SimConfig, simulate
from traces.worker_model import model_argv, profile_arg

DEFAULT_SLO = "ttft_p90=2"
GRID_FACTOR = number(1, 1000, above=True)
"""The grid's step: past 1, or the grid would not grow (0 divided its bottom by 0), and at
most 1000 (its eighth power sets the bottom)."""
JOBS = integer(1, MAX_WORKERS)
PERCENTILES = (50, 90, 99)
LIVE_TIME_SCALE = 20.0


def run_metrics(run: PolicyRun, slos: Sequence[SLO] = ()) -> dict[str, float]:
    """TTFT, end-to-end and TPOT at p50/p90/p99 (and each SLO's percentile), hit rate."""
    series = run.latencies()
    wanted = [(m, float(q)) for m in series for q in PERCENTILES]
    wanted += [(s.metric, s.percentile) for s in slos]
    out = {
        f"{m}_p{q:g}": float(np.percentile(series[m], q)) if len(series[m]) else float("nan")
        for m, q in wanted
    }
    out["hit_rate"] = float(run.cached.sum()) / max(1.0, float(run.input_length.sum()))
    out["requests"] = run.requests
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


def search(
    job: Job, evaluate: Callable[[float], Metrics], on_point: Callable[[Point], None] | None
) -> Capacity:
    """``job``'s search over ``evaluate`` (traces/capacity.py), its SLOs judging each load."""
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

    def evaluate(load: float) -> Metrics:
        picker = make_sim_picker(job.policy, job.seed)
        run = simulate(trace, picker, replace(config, speedup=load), job.policy)
        metrics = run_metrics(run, job.slos)
        if run.block_states is not None:  # config.hit_gap: the gap's split at this load
            metrics |= gap_metrics(ceilings.gap(trace, run.block_states))
        return metrics

    return search(job, evaluate, on_point)


_shared: list[TraceRequest] = []  # a worker process's trace, inherited when it forks


def _share(trace: list[TraceRequest]) -> None:
    global _shared
    _shared = trace


def _run_shared(job: Job) -> Capacity:
    return run_offline(job, _shared)


def live_evaluator(
    trace: list[TraceRequest], policy: str, args: argparse.Namespace, slos: Sequence[SLO]
) -> Callable[[float], Metrics]:
    """``evaluate(load)`` through ``sweep``: a router for ``policy`` in front of sim workers
    started for this load (or ``--worker`` URLs), the workers' true hit rate."""
    parser = argparse.ArgumentParser(prog="cache-router")
    sweep.add_parser(parser.add_subparsers())
    config = config_from_args(args)
    evaluations = itertools.count()

    def evaluate(load: float) -> Metrics:
        salt = args.seed + 104_729 * next(evaluations)  # no run hits an earlier run's prompts
        argv = ["sweep", "--trace", args.trace, "--policies", policy, "--pacing", args.pacing,
                "--salt", str(salt), "--max-turns", str(args.max_turns),
                "--router-args", f"{shlex.join(cost_args(config))} {args.router_args}"]  # fmt: skip
        if args.max_output_tokens is not None:
            argv += ["--max-output-tokens", str(args.max_output_tokens)]
        if args.worker:
            argv += ["--worker", *args.worker, "--speedup", repr(load)]
        else:
            scale = args.live_time_scale
            argv += ["--sim-workers", str(args.workers), "--speedup", repr(load * scale),
                     "--sim-time-scale", repr(scale),
                     "--sim-worker-args", shlex.join(model_argv(config.worker))]  # fmt: skip
            if args.kv_events:
                argv.append("--sim-kv-events")
        _, outcomes = sweep.run_sweep(trace, parser.parse_args(argv))
        outcome = outcomes[0]
        metrics = run_metrics(outcome.run, slos)
        metrics["hit_rate"] = outcome.worker_hit_rate
        metrics["errors"] = outcome.errors
        return metrics

    return evaluate


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


def grid_from_args(args: argparse.Namespace, bounds: Bounds) -> Grid:
    """The search grid; the top defaults to twice the load ceiling (no policy carries more
    than the ceiling for long), the bottom to ``start / factor**8``."""
    top = args.max_load
    if top is None:
        ceiling = bounds.load_ceiling
        top = max(args.start_load, 2 * ceiling) if np.isfinite(ceiling) else 64 * args.start_load
    bottom = args.min_load if args.min_load is not None else args.start_load / args.grid_factor**8
    return Grid(args.start_load, args.grid_factor, bottom, top, args.tolerance, args.above)


def run_capacity(trace_path: str, trace: list[TraceRequest], args: argparse.Namespace,
                 out: Path, plots: bool) -> dict:  # fmt: skip
    """Search every policy of ``args``, print the table, write capacity.json/.md (and the
    plots); returns the document."""
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
    if not config.disaggregated and not args.live and not args.no_hit_gap:
        config = replace(config, hit_gap=True)
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
    jobs = [Job(p, config, slos, grid, args.seed, args.max_turns) for p in policies]
    live = partial(live_evaluator, trace, args=args, slos=slos) if args.live else None
    results = search_all(trace, jobs, args.jobs, live)
    document = capacity_document(
        trace_summary(trace_path, trace), trace, bounds, results, slos, grid,
        {"workers": config.fleet_size, "kv_capacity_tokens": config.worker.kv_capacity_tokens,
         "prefill_tokens_per_s": config.worker.prefill_tokens_per_s, "pacing": config.pacing,
         "mode": mode, "jobs": args.jobs, "gpu_profile": profile_arg(config.worker.profile),
         "cost_profile": profile_arg(config.cost_profile)},
        time.perf_counter() - started,
    )  # fmt: skip
    written = write_capacity(document, out, plots)
    print(capacity_table(document))
    print(f"{document['wall_seconds']:.1f} s; wrote {', '.join(str(p) for p in written)}")
    return document


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="each policy's highest load within latency SLOs (simulated, or --live)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_simulation_options(p, speedup=False)
    p.add_argument("--trace", required=True, help="trace file or Weka directory")
    p.add_argument("--format", default="auto", help="trace format (auto-detected by default)")
    p.add_argument(
        "--slo",
        action="append",
        type=_slo,
        default=None,
        metavar="METRIC_pQ=S",
        help=f"a latency SLO (repeat for several; all must hold): METRIC ttft, e2e "
        f"or tpot, Q a percentile, S seconds (default: {DEFAULT_SLO})",
    )
    g = p.add_argument_group("search (loads are trace speedups)")
    g.add_argument("--start-load", type=POSITIVE, default=1.0, help="the grid's first load")
    g.add_argument(
        "--grid-factor", type=GRID_FACTOR, default=Grid.factor, help="the grid's step (> 1)"
    )
    g.add_argument(
        "--min-load",
        type=POSITIVE,
        default=None,
        help="lowest load tried (default: start / factor^8)",
    )
    g.add_argument(
        "--max-load",
        type=POSITIVE,
        default=None,
        help="highest load tried (default: twice the load ceiling)",
    )
    g.add_argument(
        "--tolerance",
        type=POSITIVE,
        default=Grid.tolerance,
        help="bisect until the first failure is this close to the capacity",
    )
    g.add_argument(
        "--above",
        type=COUNT_OR_OFF,
        default=Grid.above,
        help="grid points tried above the first failure (monotonicity)",
    )
    g.add_argument(
        "--jobs", type=JOBS, default=1, help="policies searched in parallel processes (offline)"
    )
    lv = p.add_argument_group("live (through sweep's routers and replay)")
    lv.add_argument(
        "--live",
        action="store_true",
        help="evaluate each load live: --workers sim workers or --worker URLs",
    )
    lv.add_argument(
        "--worker",
        nargs="+",
        action="extend",
        default=[],
        help="running workers' base URLs instead of sim workers",
    )
    lv.add_argument("--router-args", default="", help="extra `cache-router serve` options")
    lv.add_argument(
        "--live-time-scale",
        type=POSITIVE,
        default=LIVE_TIME_SCALE,
        help="sim workers run this many times faster than real time",
    )
    p.add_argument("--out", default="out/capacity", help="directory for results and plots")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--no-hit-gap",
        action="store_true",
        help="offline: skip the hit gap's split at each load (traces/hit_gap.py), about a "
        "quarter of each simulation",
    )
    p.set_defaults(func=_main)


def _slo(text: str) -> SLO:
    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _main(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace, args.format)
        run_capacity(args.trace, trace, args, Path(args.out), not args.no_plots)
    except (OSError, ValueError, RuntimeError) as exc:
        return refuse("capacity", exc)
    return 0

"""``cache-router capacity``: how much load each policy carries within latency SLOs.

Operators size a fleet by the traffic it carries within its SLO, so policies are compared by
that: for each, the highest trace speedup (and the requests/s and prompt tokens/s it means)
at which every ``--slo`` holds, searched in the simulator over a geometric grid then by
bisection near the knee (traces/sim/capacity.py). One parsed trace serves every load; each load
is a fresh fleet, as ``simulate`` runs it, with ``simulate``'s worker-model and fleet options.
The report sets each policy against the best other one, against ``round_robin`` and against
the trace's bounds on that fleet (traces/sim/bounds.py), and writes every evaluated load's
TTFT percentiles and hit rate (capacity.json) and one plot per SLO. Offline, each load's hit
gap is split into its causes too (traces/sim/hit_gap.py; ``--no-hit-gap`` skips it), and the
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
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from router.validation import refuse
from traces.commands.options import (
    add_capacity_options,
    config_from_args,
    cost_args,
    job_parser,
)
from traces.commands.run_capacity import run_capacity, run_metrics
from traces.commands.run_sweep import run_sweep
from traces.sim.capacity import SLO, Metrics
from traces.sim.worker_model import model_argv
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest


def live_evaluator(
    trace: list[TraceRequest], policy: str, args: argparse.Namespace, slos: Sequence[SLO]
) -> Callable[[float], Metrics]:
    """``evaluate(load)`` through ``sweep``: a router for ``policy`` in front of sim workers
    started for this load (or ``--worker`` URLs), the workers' true hit rate."""
    parser = job_parser()
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
        _, outcomes = run_sweep(trace, parser.parse_args(argv))
        outcome = outcomes[0]
        metrics = run_metrics(outcome.run, slos)
        metrics["hit_rate"] = outcome.worker_hit_rate
        metrics["errors"] = outcome.errors
        return metrics

    return evaluate


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="each policy's highest load within latency SLOs (simulated, or --live)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_capacity_options(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace, args.format)
        run_capacity(args.trace, trace, args, Path(args.out), not args.no_plots, live_evaluator)
    except (OSError, ValueError, RuntimeError) as exc:
        return refuse("capacity", exc)
    return 0

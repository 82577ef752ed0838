"""``cache-router demo``: the main job on the embedded default, with no arguments.

First, offline, each policy's capacity (``cache-router capacity``): the highest load at
which the fleet of 4 simulated workers keeps TTFT p90 within the demo's SLO, with the trace's
bounds, written to ``out/demo/capacity`` (table, curves, plot). Then, live, it starts 4
simulated workers (``cache-router sim-worker``) and, for each of six policies (the default
ttft and the seed's five), a router in front of them (``cache-router serve``), replays the
bundled sample of a real trace through it (``cache-router sweep``), prints the comparison
and writes results and plots to ``out/demo/live``, at a load below every policy's knee (the
capacity found offline), where one run is a stable reading; then the same requests through
the offline simulator at the same load (``out/demo/offline``), whose hit rates the live run
should match. ``--overloaded`` adds a second live reading at the trace's own load, above the
knee (``out/demo/live_overloaded``), where a queue's timing decides much of the latency.
``--offline`` runs only the offline parts.

The sample is the first 240 requests of the Weka agentic-coding traces (45 sessions, prompts
of about 50k tokens that mostly extend the previous turn), where routing decides most of the
prefill work. 42 sessions start at once at its first second, a burst that no load below it
drains quickly, so the demo's SLO is looser than a conversational trace's. The capacity is
open loop (a fixed offered load); the live runs are session-paced (``--pacing session``):
each turn is sent after its session's previous answer plus the recorded think time, as an
agent (and the traces' own replayer) sends them, which below the knee is the same schedule.
The live simulated workers run ``TIME_SCALE`` times faster than real time (the arrivals too,
times the load), with outputs capped at 64 tokens; on a busy machine the live latencies read
high (every real millisecond is that many modelled ones), the hit rates do not. Hence 20x and
not more: the router's and the sim workers' own CPU time per request counts ``TIME_SCALE``
times over, and at 40x the opening burst queued for modelled seconds at the router
(docs/bench-history.md, issue 52). ``--time-scale`` changes it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from router.validation import POSITIVE, refuse
from traces.commands.options import job_parser, select
from traces.commands.run_capacity import run_capacity
from traces.commands.run_simulate import run_and_report
from traces.commands.run_sweep import report_outcomes, run_sweep
from traces.sim.worker_model import WorkerModelConfig, add_profile_option, profile_arg
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest

POLICIES = "ttft,lmetric,load_only,sticky,unified,capped"
BASELINE = "round_robin"  # in the capacity table only: what affinity buys
WORKERS = 4
KV_TOKENS = 1_000_000  # per worker: a GPU plus a CPU KV tier; lower it to see eviction
SLO = "ttft_p90=15"  # the opening burst (module docstring) puts p90 near 10 s at any load
TIME_SCALE = 20  # the live sim workers' speed over real time (module docstring)
BELOW_KNEE = 0.8  # the live load, as a fraction of the lowest capacity of the live policies
MAX_OUTPUT = 64
OVERLOADED = (
    "\nsecond reading, overloaded: the trace's own load, above the knee of most policies (one "
    "run reads where the queues tipped, not a stable figure)"
)


def sample_trace_path() -> Path:
    """The bundled trace sample (package data of ``traces``)."""
    return Path(str(resources.files("traces") / "data" / "weka_agentic_sample.jsonl"))


def offered_load(trace: Sequence[TraceRequest], worker: WorkerModelConfig | None = None) -> str:
    """How loaded the fleet is: the prompt tokens the trace offers per second at its own
    times, against the fleet's prefill work if nothing were cached (and if everything that
    can be cached were: the trace's infinite-cache ceiling), priced by ``worker``."""
    import numpy as np

    from traces.sim.bounds import hit_tokens, infinite_cache_hits

    worker = worker or WorkerModelConfig()
    inputs = np.array([r.input_length for r in trace])
    shared = hit_tokens(trace, infinite_cache_hits(trace))
    ceiling = shared.sum() / max(1, inputs.sum())
    span = max(1e-9, trace[-1].arrival - trace[0].arrival)
    offered = inputs.sum() / span
    cold = float(worker.prefill_work_s(inputs).sum()) / span / WORKERS
    warm = float(worker.prefill_work_s(inputs - shared, shared).sum()) / span / WORKERS
    return (
        f"load: {offered:,.0f} prompt tokens/s at the trace's own times ({span:,.0f} s), "
        f"{cold:.1f}x the {WORKERS} workers' prefill rate if nothing were "
        f"cached, {warm:.2f}x if every reusable prefix were "
        f"(the infinite-cache ceiling, {ceiling:.0%}); session pacing slows sessions that "
        "wait for their answers"
    )


def opening_burst(trace: Sequence[TraceRequest], worker: WorkerModelConfig | None = None) -> str:
    """The requests sent together at the trace's start: what no lower load spreads out."""
    worker = worker or WorkerModelConfig()
    burst = [r for r in trace if r.arrival <= trace[0].arrival + 1e-3]
    tokens = sum(r.input_length for r in burst)
    work = sum(worker.prefill_work_s(r.input_length) for r in burst)
    seconds = work / WORKERS
    return (
        f"{len(burst)} requests ({tokens:,} prompt tokens) arrive together at the start: "
        f"{seconds:.0f} s of the {WORKERS} workers' prefill with nothing cached, at any load; "
        f"hence the SLO {SLO}"
    )


def live_load(document: Mapping[str, Any], policies: Sequence[str]) -> tuple[float, str]:
    """A load below every live policy's knee (their offline capacities), and why."""
    capacities = {
        p: document["policies"][p]["capacity"]
        for p in policies
        if document["policies"][p]["capacity"] is not None
    }
    if not capacities:
        return 0.25, "live at 0.25x the trace's load: no policy met the SLO offline"
    lowest = min(capacities, key=capacities.__getitem__)
    load = _floor2(BELOW_KNEE * capacities[lowest])
    return load, (
        f"live at {load:g}x the trace's load, {BELOW_KNEE:.0%} of the lowest capacity offline "
        f"({lowest}'s, {capacities[lowest]:.3g}x at {SLO}): below every policy's knee TTFT "
        "moves little with load, so one live run reads the policy, not where a queue tipped"
    )


def _floor2(x: float) -> float:
    """``x`` rounded down to two significant digits."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.floor(x / scale) * scale


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="each policy's capacity, then the policies live on simulated workers (no setup)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="out/demo", help="directory for results and plots")
    p.add_argument("--offline", action="store_true", help="only the offline parts")
    p.add_argument(
        "--overloaded",
        action="store_true",
        help="a second live reading at the trace's own load, above the knee",
    )
    p.add_argument(
        "--time-scale",
        type=POSITIVE,
        default=TIME_SCALE,
        help="the live sim workers' (and arrivals') speed over real time",
    )
    add_profile_option(p, "the workers, offline and live: ")
    p.set_defaults(func=_main)


def _live(parser: argparse.ArgumentParser, trace: list[TraceRequest], common: list[str],
          load: float, out: Path, time_scale: float) -> None:  # fmt: skip
    """One live reading of the policies at ``load`` times the trace's load."""
    print(
        f"live: {WORKERS} simulated workers (KV {KV_TOKENS:,} tokens each) at {time_scale:g}x "
        f"real time, one router per policy, {len(trace)} requests at {load:g}x the trace's "
        "load",
        file=sys.stderr,
    )
    live = parser.parse_args(
        ["sweep", *common, "--sim-workers", str(WORKERS), "--speedup", repr(load * time_scale),
         "--sim-time-scale", repr(time_scale), "--prompt-mode", "text", "--out", str(out),
         "--sim-worker-args", f"--kv-capacity-tokens {KV_TOKENS}"]
    )  # fmt: skip
    document, outcomes = run_sweep(select(trace, live), live)
    report_outcomes(document, outcomes, out)


def _main(args: argparse.Namespace) -> int:
    parser = job_parser()
    trace_path = str(sample_trace_path())
    out = Path(args.out)
    profile = ["--gpu-profile", profile_arg(args.gpu_profile)]
    sized = ["--workers", str(WORKERS), "--kv-capacity-tokens", str(KV_TOKENS), *profile]
    started = time.perf_counter()
    try:
        trace = load_trace(trace_path)
        worker = WorkerModelConfig(profile=args.gpu_profile)
        print(offered_load(trace, worker), file=sys.stderr)
        print(opening_burst(trace, worker), file=sys.stderr)
        capacity = parser.parse_args(
            ["capacity", "--trace", trace_path, "--policies", f"{POLICIES},{BASELINE}", *sized,
             "--max-output-tokens", str(MAX_OUTPUT), "--slo", SLO, "--out", str(out / "capacity")]
        )  # fmt: skip
        print("\ncapacity, offline (open loop):", file=sys.stderr)
        document = run_capacity(trace_path, trace, capacity, out / "capacity", True)
        load, why = live_load(document, POLICIES.split(","))
        print(f"\n{why}", file=sys.stderr)
        # an agent sends its next turn after the previous answer: session pacing, as the Weka
        # traces' own replayer (open loop would send turns before their predecessors' answers)
        common = ["--trace", trace_path, "--policies", POLICIES, "--pacing", "session",
                  "--max-output-tokens", str(MAX_OUTPUT), *profile]  # fmt: skip
        if not args.offline:
            _live(parser, trace, common, load, out / "live", args.time_scale)
            if args.overloaded:
                print(OVERLOADED, file=sys.stderr)
                _live(parser, trace, common, 1.0, out / "live_overloaded", args.time_scale)
            print("\noffline simulation of the same requests:", file=sys.stderr)
        offline = parser.parse_args(
            ["simulate", *common, *sized, "--speedup", repr(load), "--out", str(out / "offline")]
        )
        print(f"offline at {load:g}x the trace's load, session-paced", file=sys.stderr)
        run_and_report(trace_path, trace, offline, out / "offline", plots=True)
    except (OSError, ValueError, RuntimeError) as exc:
        return refuse("demo", exc)
    print(f"demo done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0

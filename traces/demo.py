"""``cache-router demo``: the main job on the embedded default, with no arguments.

Starts 4 simulated workers (``cache-router sim-worker``) and, for each of six policies (the
default ttft and the seed's five), a router in front of them (``cache-router serve``),
replays the bundled sample of a real trace through it (``cache-router sweep``), prints the
comparison and writes results and plots to ``out/demo/live``. Then it runs the same
requests through the offline simulator (``out/demo/offline``), whose hit rates the live run
should match; ``--offline`` runs only that.

The sample is the first 240 requests of the Weka agentic-coding traces (45 sessions, prompts
of about 50k tokens that mostly extend the previous turn), where routing decides most of the
prefill work. Turns are session-paced (``--pacing session``): each is sent after its
session's previous answer plus the recorded think time, as an agent (and the traces' own
replayer) sends them; the demo says how much prefill work that offers the fleet. The live
run is 20x faster than the trace (the simulated workers too), with outputs capped at 64
tokens, so it takes about a minute; on a busy machine the live latencies read high (every
real millisecond is 20 modelled ones), the hit rates do not.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path

from traces import simulate, sweep
from traces.formats import load_trace

POLICIES = "ttft,lmetric,load_only,sticky,unified,capped"
WORKERS = 4
KV_TOKENS = 1_000_000  # per worker: a GPU plus a CPU KV tier; lower it to see eviction
SPEEDUP = 20
MAX_OUTPUT = 64


def sample_trace_path() -> Path:
    """The bundled trace sample (package data of ``traces``)."""
    return Path(str(resources.files("traces") / "data" / "weka_agentic_sample.jsonl"))


def offered_load(trace) -> str:
    """How loaded the fleet is: the prompt tokens the trace offers per second at its own
    times, against the fleet's prefill rate if nothing were cached (and if everything that
    can be cached were: the trace's infinite-cache ceiling)."""
    from traces.stats import hit_ceiling
    from traces.worker_model import WorkerModelConfig

    ceiling = hit_ceiling(trace).token_ratio or 0.0
    span = max(1e-9, trace[-1].arrival - trace[0].arrival)
    offered = sum(r.input_length for r in trace) / span
    capacity = WORKERS * WorkerModelConfig().prefill_tokens_per_s
    return (
        f"load: {offered:,.0f} prompt tokens/s at the trace's own times ({span:,.0f} s), "
        f"{offered / capacity:.1f}x the {WORKERS} workers' prefill rate if nothing were "
        f"cached, {offered * (1 - ceiling) / capacity:.2f}x if every reusable prefix were "
        f"(the infinite-cache ceiling, {ceiling:.0%}); session pacing slows sessions that "
        "wait for their answers"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="compare the routing policies live on simulated workers (no setup needed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="out/demo", help="directory for results and plots")
    p.add_argument("--offline", action="store_true", help="only the offline simulation")
    p.set_defaults(func=_main)


def _job_parser() -> argparse.ArgumentParser:
    """The ``simulate`` and ``sweep`` sub-commands' own parsers, for their defaults."""
    parser = argparse.ArgumentParser(prog="cache-router")
    sub = parser.add_subparsers(dest="command")
    simulate.add_parser(sub)
    sweep.add_parser(sub)
    return parser


def _main(args: argparse.Namespace) -> int:
    parser = _job_parser()
    trace_path = str(sample_trace_path())
    out = Path(args.out)
    # an agent sends its next turn after the previous answer: session pacing, as the Weka
    # traces' own replayer (open loop would send turns before their predecessors' answers)
    common = ["--trace", trace_path, "--policies", POLICIES, "--pacing", "session"]
    started = time.perf_counter()
    try:
        trace = load_trace(trace_path)
        print(offered_load(trace), file=sys.stderr)
        if not args.offline:
            print(
                f"live: {WORKERS} simulated workers (KV {KV_TOKENS:,} tokens each), one router "
                f"per policy, {len(trace)} requests at {SPEEDUP}x",
                file=sys.stderr,
            )
            live = parser.parse_args(
                ["sweep", *common, "--sim-workers", str(WORKERS), "--speedup", str(SPEEDUP),
                 "--max-output-tokens", str(MAX_OUTPUT),
                 "--prompt-mode", "text", "--out", str(out / "live"),
                 "--sim-worker-args", f"--kv-capacity-tokens {KV_TOKENS}"]
            )  # fmt: skip
            document, outcomes = sweep.run_sweep(sweep.select(trace, live), live)
            sweep.report_outcomes(document, outcomes, out / "live")
            print("\noffline simulation of the same requests:", file=sys.stderr)
        offline = parser.parse_args(
            ["simulate", *common, "--workers", str(WORKERS), "--kv-capacity-tokens",
             str(KV_TOKENS), "--max-output-tokens", str(MAX_OUTPUT),
             "--out", str(out / "offline")]
        )  # fmt: skip
        simulate.run_and_report(trace_path, trace, offline, out / "offline", plots=True)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cache-router demo: {exc}", file=sys.stderr)
        return 2
    print(f"demo done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0

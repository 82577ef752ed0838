"""``cache-router demo``: the main job on the embedded default, with no arguments.

Runs the policy comparison on the bundled sample of a real trace (Mooncake conversation,
2,000 requests) against simulated workers, prints the table and writes results and plots.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

DEMO_POLICIES = "lmetric,load_only,sticky,unified,capped,round_robin,sglang_cache_aware"


def sample_trace_path() -> Path:
    """The bundled trace sample (package data of ``traces``)."""
    return Path(str(resources.files("traces") / "data" / "conversation_sample.jsonl"))


def add_parser(sub: argparse._SubParsersAction) -> None:
    from traces.simulate import add_simulation_options

    p = sub.add_parser(
        "demo",
        help="compare the routing policies on a bundled real trace sample (no setup needed)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_simulation_options(p)
    p.set_defaults(policies=DEMO_POLICIES, workers=4, kv_capacity_tokens=1_000_000)
    p.add_argument("--out", default="out/demo", help="directory for results and plots")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from traces.formats import load_trace
    from traces.simulate import run_and_report

    path = sample_trace_path()
    print(
        f"cache-router demo: {path.name}, simulated workers (KV {args.kv_capacity_tokens:,} "
        "tokens each: a GPU plus a CPU KV tier; change with --kv-capacity-tokens)",
        file=sys.stderr,
    )
    try:
        run_and_report(str(path), load_trace(path), args, Path(args.out), plots=True)
    except (OSError, ValueError) as exc:
        print(f"cache-router demo: {exc}", file=sys.stderr)
        return 2
    return 0

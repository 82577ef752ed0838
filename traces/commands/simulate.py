"""``cache-router simulate``: compare policies on a trace in virtual time.

Every policy sees the same trace and a fresh fleet (fresh worker models and shadows); the
``capped`` policy sees the trace capped to its sessions' first turns (seed 002).

``--prefill-workers P --decode-workers D`` simulates a disaggregated fleet of P + D workers
instead of ``--workers``: each policy picks the prefill worker, ``--decode-policy`` the
decode worker, and the prompt's KV crosses in ``--kv-transfer-latency-ms`` plus its bytes
(``--kv-bytes-per-token``) at ``--kv-transfer-gbps`` (traces/sim/simulator.py).

Every report also sets the policies against the trace's bounds on the fleet that prefills
(traces/sim/bounds.py: TTFT floors, hit ceiling, load ceiling); ``capped``'s are the full trace's.
Then each policy's gap to the hit ceiling is split into its causes (traces/sim/hit_gap.py: the
prefix on another worker, still in flight, evicted; ``capped``'s against its own trace's
ceiling; not for a disaggregated fleet; ``--no-hit-gap`` skips it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from router.validation import refuse
from traces.commands.options import add_simulate_options
from traces.commands.run_simulate import run_and_report
from traces.trace.formats import load_trace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare routing policies on a trace, offline, in virtual time",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_simulate_options(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace, args.format)
        run_and_report(args.trace, trace, args, Path(args.out), not args.no_plots)
    except (OSError, ValueError) as exc:
        return refuse("simulate", exc)
    return 0

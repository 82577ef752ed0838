"""``cache-router replay`` and ``cache-router sweep``: live policy comparisons.

``replay`` sends a trace through one running router. ``sweep`` does it once per policy: for
each, a fresh router with that policy in front of the same workers, the workers' caches reset
in between (``POST /reset_prefix_cache``; where a worker refuses, each policy gets its own
prompt salt so no run hits the previous run's prompts), and ``capped`` replays the capped
trace. Workers are either given (``--worker``, real vLLM / SGLang) or started here
(``--sim-workers N``). Both write the same results.json as ``simulate``.

With ``--sim-workers`` the simulated workers run ``--speedup`` times faster than real time,
like the arrivals, so the fleet sees the trace's load; client-measured times are then
multiplied by the speedup, so they read in the modelled deployment's seconds
(``time_scale`` in results.json says by how much). ``--sim-time-scale T`` runs them T times
faster instead, so the fleet sees ``speedup / T`` times the trace's load (``capacity
--live``). ``--sim-kv-events``: the sim workers publish their KV events and each router runs
in precise mode (``--kv-events --kv-events-connect``).

The shadows' fidelity is the router's own: before each router stops, its
``cache_router_shadow_error_ratio{shadow}`` is read into ``shadow_abs_error_blocks``,
``_radix`` and ``_kv`` (the KV-event index), the names ``simulate`` uses for the same figures
(``shadow_abs_error``: the one that answered the estimates); in precise mode the KV-event
batches' lag (publish to receipt, ``/workers``) too, in modelled seconds.

``--requests-out FILE`` writes each request's live outcome, one JSON line per request and
policy, in ``simulate --requests-out``'s format, so a live run and the simulator can be
compared request by request.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from router.validation import refuse
from traces.commands.options import add_replay_options, add_sweep_options, select, trace_summary
from traces.commands.run_sweep import (
    outcome_document,
    replay_config,
    report_outcomes,
    router_prediction_errors,
    run_sweep,
)
from traces.live.replay import ReplayOutcome, replay
from traces.reports.requests_out import write_live_requests
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest


def _load(args: argparse.Namespace, command: str) -> list[TraceRequest] | None:
    """The selected trace, or None after one line on stderr (a bad trace line, no file)."""
    try:
        return select(load_trace(args.trace), args)
    except (OSError, ValueError) as exc:
        refuse(command, exc)
        return None


def _replay_main(args: argparse.Namespace) -> int:
    trace = _load(args, "replay")
    if trace is None:
        return 2
    cfg = replay_config(args, args.url, args.salt, args.worker_metrics or ())
    started = time.perf_counter()
    outcome = asyncio.run(replay(trace, cfg, args.name))
    predictions = {outcome.run.name: router_prediction_errors(args.url)}
    document = outcome_document(
        trace_summary(args.trace, trace), [outcome], len(outcome.workers),
        time.perf_counter() - started, 1.0, predictions=predictions,
    )  # fmt: skip
    document["pacing"] = args.pacing
    report_outcomes(document, [outcome], Path(args.out))
    write_requests_out(args, trace, [outcome])
    return 1 if outcome.run.requests == 0 else 0


def _sweep_main(args: argparse.Namespace) -> int:
    trace = _load(args, "sweep")
    if trace is None:
        return 2
    try:
        document, outcomes = run_sweep(trace, args)
    except ValueError as exc:  # no workers, or a given worker unreachable
        return refuse("sweep", exc)
    report_outcomes(document, outcomes, Path(args.out))
    write_requests_out(args, trace, outcomes)
    return 0 if all(o.run.requests > 0 for o in outcomes) else 1


def write_requests_out(
    args: argparse.Namespace, trace: list[TraceRequest], outcomes: list[ReplayOutcome]
) -> None:
    """``--requests-out FILE``: each request's live outcome (traces/reports/requests_out.py)."""
    if args.requests_out:
        lines = write_live_requests(Path(args.requests_out), trace, outcomes)
        print(f"wrote {lines} request lines to {args.requests_out}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("replay", help="replay a trace through a running router", description=
                       __doc__, formatter_class=fmt)  # fmt: skip
    add_replay_options(p)
    p.add_argument("--url", required=True, help="router (or worker) base URL")
    p.add_argument("--worker-metrics", nargs="+", default=None,
                   help="worker URLs whose /metrics give the true hit rate "
                   "(default: the router's GET /workers)")  # fmt: skip
    p.add_argument("--name", default="replay", help="name of this run in the report")
    p.set_defaults(func=_replay_main)

    s = sub.add_parser("sweep", help="replay a trace once per policy, live", description=__doc__,
                       formatter_class=fmt)  # fmt: skip
    add_sweep_options(s)
    s.set_defaults(func=_sweep_main)

"""Every trace command's options, in one place: ``simulate``, ``capacity``, ``replay``,
``sweep`` and ``demo`` add them from here, and turn them into the simulator's configuration
(:func:`config_from_args`), the policies (:func:`parse_policies`) and the requests run
(:func:`select_requests`, :func:`select`). :func:`job_parser` parses a job as its command
would (``demo``'s jobs, ``capacity --live``'s sweeps) without importing that command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from policies.base import Picker
from policies.registry import PICKER_NAMES, make_picker, picker_params
from router.cache import cost_profile
from router.cache.cost_profile import GpuProfile
from router.cache.worker_state import SHADOW_KINDS
from router.config import DISPATCH_HOLD_TOKENS, field_rule
from router.validation import (
    COUNT,
    COUNT_OR_OFF,
    FRACTION,
    MAX_WORKERS,
    MILLISECONDS_OR_OFF,
    POSITIVE,
    SECONDS,
    SEED,
    TOKENS,
    WORKERS,
    WORKERS_OR_NONE,
    integer,
    number,
)
from traces.sim import kv_transfer
from traces.sim.bounds import Bounds, trace_bounds
from traces.sim.capacity import SLO, Grid, parse_slo
from traces.sim.config import ROUTER_TIERS, SimConfig
from traces.sim.oracle import ORACLE, OraclePicker
from traces.sim.worker_model import (
    add_model_options,
    add_profile_option,
    args_profile,
    as_profile,
    model_config_from_args,
    parse_profile,
    profile_arg,
)
from traces.trace.assign import assign_tenants, parse_tenant_weights
from traces.trace.cap import DEFAULT_MAX_TURNS
from traces.trace.pacing import PACINGS
from traces.trace.record import TraceRequest
from traces.trace.stats import hit_ceiling

DEFAULT_POLICIES = "ttft,lmetric,load_only,sticky,unified,capped"


def parse_policies(text: str, offline: bool = False) -> list[str]:
    """Picker names from a comma-separated list; ``offline`` also accepts ``oracle``."""
    valid = PICKER_NAMES + ((ORACLE,) if offline else ())
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in valid]
    if unknown or not names:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(valid)}")
    return names


def make_sim_picker(name: str, seed: int = 0) -> Picker:
    """A fresh picker for one simulation: the registry's, or the simulator-only oracle."""
    if name == ORACLE:
        return OraclePicker()
    params = {"seed": seed} if "seed" in picker_params(name) else {}
    return make_picker(name, **params)


def cap_output(trace: Sequence[TraceRequest], max_tokens: int) -> list[TraceRequest]:
    """The trace with output lengths capped (as replay's --max-output-tokens caps them)."""
    return [replace(r, output_length=min(r.output_length, max_tokens)) for r in trace]


def select_requests(trace: list[TraceRequest], args: argparse.Namespace) -> list[TraceRequest]:
    """``--max-requests`` and ``--max-output-tokens`` applied to ``trace``."""
    if args.max_requests is not None:
        trace = trace[: args.max_requests]
    if args.max_output_tokens is not None:
        trace = cap_output(trace, args.max_output_tokens)
    return trace


def trace_summary(path: str, trace: Sequence[TraceRequest]) -> dict:
    ceiling = hit_ceiling(trace)
    return {
        "name": Path(path).name,
        "path": str(path),
        "requests": len(trace),
        "span_seconds": trace[-1].arrival if trace else 0.0,
        "prompt_tokens": int(sum(r.input_length for r in trace)),
        "hit_ceiling": ceiling.token_ratio,
        "hit_ceiling_blocks": ceiling.block_ratio,
    }


def add_flow_options(p: argparse.ArgumentParser) -> None:
    """Flow control and the tenants / priorities it orders (docs/flow-control.md)."""
    d = SimConfig()
    g = p.add_argument_group("flow control (issue 44)")
    g.add_argument("--flow-control", action="store_true", help="model serve's --flow-control queue")
    # serve's rules for serve's flags (router/config.py), not a copy of them
    g.add_argument(
        "--flow-target-ttft-s", type=field_rule("flow_target_ttft_s"),
        default=d.flow_target_ttft_s, help="the predicted TTFT past which requests wait",
    )  # fmt: skip
    g.add_argument(
        "--flow-queue-ttl-s", type=field_rule("flow_queue_ttl_s"), default=d.flow_queue_ttl_s,
        help="the longest wait in the queue (then 429)",
    )  # fmt: skip
    g.add_argument(
        "--flow-queue-max", type=field_rule("flow_queue_max"), default=d.flow_queue_max,
        help="queued requests per priority band (429 past it)",
    )  # fmt: skip
    g.add_argument(
        "--flow-kv-reserve", type=field_rule("flow_kv_reserve"), default=d.flow_kv_reserve,
        help="the share of each worker's KV that requests below the highest priority seen "
        "leave free for it (0: off)",
    )  # fmt: skip
    g.add_argument(
        "--tenants", default=None,
        help="give sessions tenants in these proportions, e.g. 4:1 (then goodput per tenant)",
    )  # fmt: skip
    g.add_argument(
        "--interactive-share", type=FRACTION, default=0.0,
        help="the share of sessions given priority 1 (the rest 0)",
    )  # fmt: skip
    g.add_argument(
        "--slo-ttft-s", type=SECONDS, default=d.slo_ttft_s,
        help="the TTFT a request must meet to count in goodput",
    )  # fmt: skip


def with_tenants(trace: list[TraceRequest], args: argparse.Namespace) -> list[TraceRequest]:
    """``trace`` with ``--tenants`` / ``--interactive-share`` assigned (as given otherwise)."""
    tenants = getattr(args, "tenants", None)
    share = getattr(args, "interactive_share", 0.0)
    if tenants is None and not share:
        return trace
    weights = parse_tenant_weights(tenants) if tenants is not None else [1.0]
    return assign_tenants(trace, weights, share)


CORRECTIONS: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
"""``--correct-shadow`` choices as ``SimConfig.correct_shadow`` values."""


def add_simulation_options(p: argparse.ArgumentParser, speedup: bool = True) -> None:
    """Options shared by ``simulate``, ``demo`` and ``capacity`` (which searches the speedup:
    ``speedup=False`` leaves that flag out)."""
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated picker names")
    p.add_argument("--workers", type=WORKERS, default=8, help="simulated workers")
    add_disaggregation_options(p)
    p.add_argument("--shadow", choices=SHADOW_KINDS, default="blocks", help="router shadow")
    add_model_options(p, "each worker's KV cache in tokens (the shadows get the same)")
    add_cost_profile_option(p)
    p.add_argument(
        "--dispatch-hold-tokens", type=field_rule("dispatch_hold_tokens"),
        default=None,
        help="model serve's --dispatch-hold-tokens: hold requests at the router while their "
        "worker's sent prefill is above this many tokens, released in ttft's priority order "
        f"(default {DISPATCH_HOLD_TOKENS} on FCFS engines, off with --scheduling-policy "
        "priority, as serve's; 0: off)",
    )  # fmt: skip
    p.add_argument(
        "--router-tiers",
        choices=ROUTER_TIERS,
        default="on",
        help="with --cpu-kv-capacity-tokens: 'on' the router keeps a shadow of each worker's "
        "CPU tier and the ttft picker prices a CPU hit at its load time; 'off' it ignores the "
        "tier (GPU shadows only); 'exact' it reads both tiers from the worker models (a "
        "yardstick no live router has)",
    )
    if speedup:
        p.add_argument("--speedup", type=POSITIVE, default=1.0, help="divide arrival times by this")
    add_pacing_option(p)
    p.add_argument("--max-requests", type=COUNT, default=None, help="first N requests only")
    p.add_argument("--max-turns", type=COUNT, default=DEFAULT_MAX_TURNS, help="cap for 'capped'")
    p.add_argument("--seed", type=SEED, default=0, help="seed for random pickers")
    p.add_argument("--max-output-tokens", type=TOKENS, default=None, help="cap output lengths")
    p.add_argument(
        "--kv-events",
        action="store_true",
        help="precise mode: the workers' KV events feed the router's KV-event index",
    )
    p.add_argument(
        "--kv-event-delay-ms", type=MILLISECONDS_OR_OFF, default=50.0, help="event batch latency"
    )
    p.add_argument("--kv-event-loss", type=FRACTION, default=0.0, help="fraction of batches lost")
    p.add_argument(
        "--shadow-capacity-tokens",
        type=TOKENS,
        default=None,
        help="the router's belief of each worker's KV capacity (default: the workers' own)",
    )
    p.add_argument(
        "--correct-shadow",
        choices=CORRECTIONS,
        default="auto",
        help="adapt the shadows' capacity to the cached tokens the workers report "
        "(router/cache/feedback.py); auto: as the proxy, while the capacity is a guess "
        "(--shadow-capacity-tokens given)",
    )


def add_cost_profile_option(p: argparse.ArgumentParser) -> None:
    """``--cost-profile``: the router's TTFT cost model (serve's flag of the same name)."""
    names = ", ".join(cost_profile.profile_names())
    p.add_argument(
        "--cost-profile",
        type=_profile_text,
        default=None,
        metavar="NAME|FILE",
        help="the GPU profile the router predicts TTFT with (router/cache/cost_model.py; the "
        f"ttft picker prices with it): one of {names}, or a profile JSON file; 'flat': the "
        "workers' --prefill-tokens-per-s and the picker's own step costs. Default: the "
        "workers' --gpu-profile (the router told the GPU it routes to, as `sweep` tells its "
        "routers)",
    )


def add_disaggregation_options(p: argparse.ArgumentParser) -> None:
    """A disaggregated prefill/decode fleet and its KV transfers (``SimConfig``'s fields)."""
    d = SimConfig()
    p.add_argument(
        "--prefill-workers",
        type=WORKERS_OR_NONE,
        default=d.prefill_workers,
        help="with --decode-workers: a disaggregated fleet of that many prefill workers "
        "(--workers is then ignored); the policies pick among them",
    )
    p.add_argument(
        "--decode-workers",
        type=WORKERS_OR_NONE,
        default=d.decode_workers,
        help="decode workers of a disaggregated fleet (with --prefill-workers)",
    )
    p.add_argument(
        "--decode-policy",
        choices=PICKER_NAMES,
        default=d.decode_policy,
        help="picker of the decode worker in a disaggregated fleet",
    )
    kv_transfer.add_options(p, d)


def add_pacing_option(p: argparse.ArgumentParser) -> None:
    """``--pacing``, shared by ``simulate``, ``demo``, ``replay`` and ``sweep``."""
    p.add_argument(
        "--pacing",
        choices=PACINGS,
        default="open",
        help="open: every request at its arrival; session: a turn is also sent no earlier than "
        "its session's previous answer plus the recorded think time (traces/trace/pacing.py)",
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    speedup = getattr(args, "speedup", 1.0)
    if args.workers < 1 or speedup <= 0 or args.kv_capacity_tokens < 512:
        raise ValueError("need --workers >= 1, --speedup > 0, --kv-capacity-tokens >= 512")
    prefill, decode = getattr(args, "prefill_workers", 0), getattr(args, "decode_workers", 0)
    if (prefill > 0) != (decode > 0) or prefill < 0 or decode < 0:
        raise ValueError("a disaggregated fleet needs both --prefill-workers and --decode-workers")
    worker = model_config_from_args(args)
    defaults = SimConfig()
    return SimConfig(
        workers=args.workers,
        worker=worker,
        shadow=args.shadow,
        speedup=speedup,
        pacing=args.pacing,
        kv_events=getattr(args, "kv_events", False),
        kv_event_delay_s=getattr(args, "kv_event_delay_ms", 50.0) / 1000,
        kv_event_loss=getattr(args, "kv_event_loss", 0.0),
        seed=args.seed,
        shadow_capacity_tokens=args.shadow_capacity_tokens,
        correct_shadow=CORRECTIONS[args.correct_shadow],
        prefill_workers=prefill,
        decode_workers=decode,
        decode_policy=getattr(args, "decode_policy", defaults.decode_policy),
        router_tiers=getattr(args, "router_tiers", defaults.router_tiers),
        dispatch_hold_tokens=getattr(args, "dispatch_hold_tokens", defaults.dispatch_hold_tokens),
        flow_control=getattr(args, "flow_control", False),
        flow_target_ttft_s=getattr(args, "flow_target_ttft_s", defaults.flow_target_ttft_s),
        flow_queue_ttl_s=getattr(args, "flow_queue_ttl_s", defaults.flow_queue_ttl_s),
        flow_queue_max=getattr(args, "flow_queue_max", defaults.flow_queue_max),
        flow_kv_reserve=getattr(args, "flow_kv_reserve", defaults.flow_kv_reserve),
        slo_ttft_s=getattr(args, "slo_ttft_s", defaults.slo_ttft_s),
        cost_profile=_args_cost_profile(args),
        **kv_transfer.from_args(args, defaults),
    )


def cost_args(config: SimConfig) -> list[str]:
    """``serve``'s flags for ``config``'s router cost profile and dispatch hold (a live run
    to match it)."""
    argv = ["--cost-profile", profile_arg(config.cost_profile)]
    if config.dispatch_hold_tokens is not None:  # else serve's default, which is the same
        argv += ["--dispatch-hold-tokens", str(config.dispatch_hold_tokens)]
    return argv


def _profile_text(text: str) -> str:
    """``--cost-profile``'s value checked (:func:`parse_profile`) but kept as given: parsed,
    ``flat`` is None, which :func:`_args_cost_profile` would read as not given."""
    parse_profile(text)
    return text


def _args_cost_profile(args: argparse.Namespace) -> GpuProfile | None:
    """``args.cost_profile`` (a name or file, or a profile set on a namespace by hand); not
    given: the workers' profile."""
    value = getattr(args, "cost_profile", None)
    return args_profile(args) if value is None else as_profile(value)


def fleet_bounds(trace: Sequence[TraceRequest], config: SimConfig) -> Bounds:
    """The trace's bounds on the fleet that prefills (a disaggregated fleet's prefill
    workers): traces/sim/bounds.py."""
    workers = config.prefill_workers if config.disaggregated else config.workers
    served = [r for r in trace if r.context_tokens <= config.context_tokens]  # the rest: 400
    return trace_bounds(served, workers, config.worker)


SWEEP_POLICIES = "ttft,lmetric,load_only,sticky,unified,capped"


VOCAB = integer(101, 2**32)
"""Token ids are uint32, and the prompts' start at 100 (traces/trace/prompts.py's first_id)."""


def select(trace: list[TraceRequest], args: argparse.Namespace) -> list[TraceRequest]:
    if args.duration is not None:
        trace = [r for r in trace if r.arrival / args.speedup <= args.duration]
    if args.max_requests is not None:
        trace = trace[: args.max_requests]
    return trace


def add_replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace file or Weka directory")
    p.add_argument("--speedup", type=POSITIVE, default=1.0, help="divide arrival times by this")
    add_pacing_option(p)
    p.add_argument("--max-requests", type=COUNT, default=None, help="first N requests only")
    p.add_argument("--duration", type=SECONDS, default=None, help="seconds of (sped-up) trace")
    p.add_argument("--prompt-mode", choices=("tokens", "text"), default="tokens")
    p.add_argument("--vocab-size", type=VOCAB, default=32_000, help="token ids are below this")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--max-output-tokens", type=TOKENS, default=None, help="cap output lengths")
    p.add_argument("--salt", type=SEED, default=0, help="changes every prompt block")
    p.add_argument("--retries", type=COUNT_OR_OFF, default=0,
                   help="send a request again after a connection failure before its first "
                        "token, up to N times (the OpenAI SDK's default is 2)")  # fmt: skip
    p.add_argument("--out", default="out/replay", help="directory for results and plots")
    add_requests_out_option(p)


def add_requests_out_option(p: argparse.ArgumentParser) -> None:
    """``--requests-out``, shared by ``simulate``, ``replay`` and ``sweep``."""
    p.add_argument(
        "--requests-out",
        default=None,
        metavar="FILE",
        help="write every request's outcome, one JSON line per request and policy (policy, "
        "index in the trace, ttft_s, cached_tokens, worker...: traces/reports/requests_out.py)",
    )


DEFAULT_SLO = "ttft_p90=2"


GRID_FACTOR = number(1, 1000, above=True)
"""The grid's step: past 1, or the grid would not grow (0 divided its bottom by 0), and at
most 1000 (its eighth power sets the bottom)."""


JOBS = integer(1, MAX_WORKERS)


LIVE_TIME_SCALE = 20.0


def grid_from_args(args: argparse.Namespace, bounds: Bounds) -> Grid:
    """The search grid; the top defaults to twice the load ceiling (no policy carries more
    than the ceiling for long), the bottom to ``start / factor**8``."""
    top = args.max_load
    if top is None:
        ceiling = bounds.load_ceiling
        top = max(args.start_load, 2 * ceiling) if np.isfinite(ceiling) else 64 * args.start_load
    bottom = args.min_load if args.min_load is not None else args.start_load / args.grid_factor**8
    return Grid(
        args.start_load, args.grid_factor, bottom, top, args.tolerance, args.above,
        verify=not args.no_verify,
    )  # fmt: skip


def _slo(text: str) -> SLO:
    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_simulate_options(p: argparse.ArgumentParser) -> None:
    """``simulate``'s options (the trace, the fleet, the router, flow control, the report)."""
    add_simulation_options(p)
    p.add_argument("--trace", required=True, help="trace file or Weka directory")
    p.add_argument("--format", default="auto", help="trace format (auto-detected by default)")
    p.add_argument("--out", default="out/simulate", help="directory for results and plots")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add_requests_out_option(p)
    p.add_argument(
        "--no-hit-gap",
        action="store_true",
        help="skip the hit gap's split into causes (traces/sim/hit_gap.py), which records where "
        "every missed block was and adds about a quarter to each policy's simulation",
    )
    add_flow_options(p)


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """``sweep``'s options: ``replay``'s, the policies, the workers (given or started)."""
    add_replay_options(p)
    p.set_defaults(out="out/sweep")
    p.add_argument("--policies", default=SWEEP_POLICIES,
                   help=f"comma-separated, from {', '.join(PICKER_NAMES)}")  # fmt: skip
    p.add_argument("--worker", nargs="+", action="extend", default=[], help="worker base URLs")
    p.add_argument("--sim-workers", type=WORKERS_OR_NONE, default=0,
                   help="start N simulated workers")  # fmt: skip
    p.add_argument("--sim-worker-args", default="", help="extra sim-worker options")
    add_profile_option(p, "the sim workers (--sim-workers): ")
    p.add_argument("--sim-time-scale", type=POSITIVE, default=None,
                   help="the sim workers run this many times faster than real time (default: "
                   "--speedup, the trace's own load); they see speedup / this times the "
                   "trace's load")  # fmt: skip
    p.add_argument("--router-args", default="", help="extra `cache-router serve` options")
    p.add_argument("--sim-kv-events", action="store_true",
                   help="sim workers publish KV events; routers run --kv-events")  # fmt: skip
    p.add_argument("--max-turns", type=COUNT, default=DEFAULT_MAX_TURNS, help="cap for 'capped'")


def add_capacity_options(p: argparse.ArgumentParser) -> None:
    """``capacity``'s options: ``simulate``'s fleet (no speedup: it searches it), the SLOs,
    the search, live evaluation, the report."""
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
        help="bisect until the first failure is this close to the capacity; the loads "
        "tried in the grid step below it are at most this far apart",
    )
    g.add_argument(
        "--no-verify",
        action="store_true",
        help="bisection only: do not fill in the grid step below the capacity (a load "
        "between two that hold may fail unseen; fewer runs)",
    )
    g.add_argument(
        "--replays",
        type=COUNT,
        default=1,
        help="runs per load, their requests pooled for the percentiles: the trace as "
        "recorded, then replays with jittered arrivals (offline; near a knee one "
        "recording's bursts decide which single loads hold)",
    )
    g.add_argument(
        "--jitter",
        type=FRACTION,
        default=0.5,
        help="how far a replay moves each arrival, either way, as a fraction of the "
        "trace's mean gap between arrivals (a session's turns keep their order)",
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
        help="offline: skip the hit gap's split at each load (traces/sim/hit_gap.py), about a "
        "quarter of each simulation",
    )


JOB_COMMANDS = {
    "simulate": add_simulate_options,
    "sweep": add_sweep_options,
    "capacity": add_capacity_options,
}
"""The commands whose runs other commands start (``demo``, ``capacity --live``), by name."""


def job_parser() -> argparse.ArgumentParser:
    """A parser of ``simulate``, ``sweep`` and ``capacity`` arguments, as those commands parse
    them (their options and defaults), for a run another command starts: the commands
    themselves are not imported (traces/commands/: commands do not import each other)."""
    parser = argparse.ArgumentParser(prog="cache-router")
    sub = parser.add_subparsers(dest="command")
    for name, add_options in JOB_COMMANDS.items():
        add_options(sub.add_parser(name))
    return parser

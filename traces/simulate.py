"""``cache-router simulate``: compare policies on a trace in virtual time.

Every policy sees the same trace and a fresh fleet (fresh worker models and shadows); the
``capped`` policy sees the trace capped to its sessions' first turns (seed 002).

``--prefill-workers P --decode-workers D`` simulates a disaggregated fleet of P + D workers
instead of ``--workers``: each policy picks the prefill worker, ``--decode-policy`` the
decode worker, and the prompt's KV crosses in ``--kv-transfer-latency-ms`` plus its bytes
(``--kv-bytes-per-token``) at ``--kv-transfer-gbps`` (traces/simulator.py).

Every report also sets the policies against the trace's bounds on the fleet that prefills
(traces/bounds.py: TTFT floors, hit ceiling, load ceiling); ``capped``'s are the full trace's.
Then each policy's gap to the hit ceiling is split into its causes (traces/hit_gap.py: the
prefix on another worker, still in flight, evicted; ``capped``'s against its own trace's
ceiling; not for a disaggregated fleet; ``--no-hit-gap`` skips it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from policies.base import Picker
from policies.registry import PICKER_NAMES, make_picker, picker_params
from router.cache import cost_profile
from router.cache.cost_profile import GpuProfile
from router.cache.worker_state import SHADOW_KINDS
from router.config import field_rule
from router.validation import (
    COUNT,
    FRACTION,
    MILLISECONDS_OR_OFF,
    POSITIVE,
    SECONDS,
    SEED,
    TOKENS,
    WORKERS,
    WORKERS_OR_NONE,
    refuse,
)
from traces import kv_transfer
from traces.assign import assign_tenants, parse_tenant_weights
from traces.bounds import Bounds, pooled_blocks, trace_bounds
from traces.cap import DEFAULT_MAX_TURNS, build_capped_trace
from traces.formats import load_trace
from traces.hit_gap import CeilingHits, HitGap
from traces.hit_gap_report import add_hit_gap, hit_gap_note, hit_gap_table
from traces.oracle import ORACLE, OraclePicker
from traces.pacing import PACINGS
from traces.record import TraceRequest, first_too_long
from traces.report import (
    add_bounds,
    bounds_note,
    markdown_table,
    results_document,
    write_plots,
    write_results,
)
from traces.requests_out import write_requests
from traces.simulator import ROUTER_TIERS, PolicyRun, SimConfig, simulate
from traces.stats import hit_ceiling
from traces.worker_model import (
    add_model_options,
    args_profile,
    model_config_from_args,
    parse_profile,
    profile_arg,
)

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
    """Each run's hit gap against its trace's ceiling on the fleet (traces/hit_gap.py), for
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare routing policies on a trace, offline, in virtual time",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_simulation_options(p)
    p.add_argument("--trace", required=True, help="trace file or Weka directory")
    p.add_argument("--format", default="auto", help="trace format (auto-detected by default)")
    p.add_argument("--out", default="out/simulate", help="directory for results and plots")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--requests-out",
        default=None,
        metavar="FILE",
        help="write every request's outcome, one JSON line per request and policy (policy, "
        "index in the trace, ttft_s, cached_tokens, worker...: traces/requests_out.py)",
    )
    p.add_argument(
        "--no-hit-gap",
        action="store_true",
        help="skip the hit gap's split into causes (traces/hit_gap.py), which records where "
        "every missed block was and adds about a quarter to each policy's simulation",
    )
    add_flow_options(p)
    p.set_defaults(func=_main)


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
        type=parse_profile,
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
        "its session's previous answer plus the recorded think time (traces/pacing.py)",
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
        flow_control=getattr(args, "flow_control", False),
        flow_target_ttft_s=getattr(args, "flow_target_ttft_s", defaults.flow_target_ttft_s),
        flow_queue_ttl_s=getattr(args, "flow_queue_ttl_s", defaults.flow_queue_ttl_s),
        flow_queue_max=getattr(args, "flow_queue_max", defaults.flow_queue_max),
        slo_ttft_s=getattr(args, "slo_ttft_s", defaults.slo_ttft_s),
        cost_profile=_args_cost_profile(args),
        **kv_transfer.from_args(args, defaults),
    )


def cost_args(config: SimConfig) -> list[str]:
    """``serve``'s flags for ``config``'s router cost profile (a live run to match it)."""
    return ["--cost-profile", profile_arg(config.cost_profile)]


def _args_cost_profile(args: argparse.Namespace) -> GpuProfile | None:
    """``args.cost_profile`` as parsed (a name or file when set by hand); not given: the
    workers' profile."""
    value = getattr(args, "cost_profile", None)
    if value is None:
        return args_profile(args)
    return cost_profile.resolve(value) if isinstance(value, str) else value


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
        f"{profile_arg(config.cost_profile)}"
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


def fleet_bounds(trace: Sequence[TraceRequest], config: SimConfig) -> Bounds:
    """The trace's bounds on the fleet that prefills (a disaggregated fleet's prefill
    workers): traces/bounds.py."""
    workers = config.prefill_workers if config.disaggregated else config.workers
    served = [r for r in trace if r.context_tokens <= config.context_tokens]  # the rest: 400
    return trace_bounds(served, workers, config.worker)


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


def _main(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace, args.format)
        run_and_report(args.trace, trace, args, Path(args.out), not args.no_plots)
    except (OSError, ValueError) as exc:
        return refuse("simulate", exc)
    return 0

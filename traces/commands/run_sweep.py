"""What ``replay`` and ``sweep`` run (and ``demo`` live, ``capacity --live``): one router per
policy in front of sim workers or given workers, a streaming replay through each, the workers'
true hit rate and each router's shadow and prediction errors (:func:`run_sweep`,
:func:`report_outcomes`)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from traces.commands.options import parse_policies, trace_summary
from traces.live.fleet import (
    check_reachable,
    reset_caches,
    router,
    scrape,
    sim_workers,
    time_scaled_router_args,
)
from traces.live.replay import ReplayConfig, ReplayOutcome, replay
from traces.reports.results import markdown_table, results_document, write_plots, write_results
from traces.sim.worker_model import profile_arg
from traces.trace.cap import build_capped_trace
from traces.trace.record import TraceRequest


def scaled(outcome: ReplayOutcome, time_scale: float) -> ReplayOutcome:
    """Client times in the modelled deployment's seconds (see the module docstring)."""
    run = outcome.run
    if time_scale != 1.0:
        run.arrival = run.arrival * time_scale
        run.first_token = run.first_token * time_scale
        run.finish = run.finish * time_scale
    return outcome


SHADOW_NAMES = {"blocks": "blocks", "radix": "radix", "kv_events": "kv"}
"""The router's ``shadow`` label -> the suffix ``simulate`` gives the same figure."""


def router_shadow_errors(url: str) -> dict[str, float]:
    """``cache_router_shadow_error_ratio{shadow}`` of the router at ``url``, by simulate's
    names (empty if unreadable)."""
    try:
        samples = scrape(url)
    except httpx.HTTPError:
        return {}
    out = {}
    for sample in samples:
        if sample.name == "cache_router_shadow_error_ratio":
            name = SHADOW_NAMES.get(sample.labels.get("shadow", ""))
            if name is not None:
                out[name] = sample.value
    return out


PREDICTION = "cache_router_ttft_prediction_error_ratio"


def router_prediction_errors(url: str) -> dict[str, float]:
    """The router's TTFT prediction against the observed TTFT (its cost model,
    ``cache_router_ttft_prediction_error_ratio`` and the seconds' sums, all workers), by
    simulate's names: ``ttft_pred_requests``, ``ttft_pred_mdape`` (the median, from the
    histogram's buckets), ``ttft_pred_mape``, ``ttft_pred_bias`` (empty if unreadable)."""
    try:
        samples = scrape(url)
    except httpx.HTTPError:
        return {}
    buckets: dict[float, float] = {}
    sums = {"count": 0.0, "sum": 0.0, "predicted": 0.0, "observed": 0.0}
    names = {
        PREDICTION + "_count": "count",
        PREDICTION + "_sum": "sum",
        "cache_router_ttft_predicted_seconds_total": "predicted",
        "cache_router_ttft_observed_seconds_total": "observed",
    }
    for sample in samples:
        if sample.name == PREDICTION + "_bucket":
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + sample.value
        elif sample.name in names:
            sums[names[sample.name]] += sample.value
    count = sums["count"]
    if not count:
        return {"ttft_pred_requests": 0}
    return {
        "ttft_pred_requests": int(count),
        "ttft_pred_mdape": bucket_median(buckets, count),
        "ttft_pred_mape": sums["sum"] / count,
        "ttft_pred_bias": sums["predicted"] / sums["observed"] if sums["observed"] else 0.0,
    }


def bucket_median(buckets: dict[float, float], count: float) -> float:
    """The median of a histogram's cumulative ``buckets`` (upper bound -> count), linear
    within the bucket it falls in (the last finite bound when it falls past them all)."""
    half, lower, below = count / 2.0, 0.0, 0.0
    for le in sorted(buckets):
        cumulative = buckets[le]
        if cumulative >= half:
            if le == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (le - lower) * ((half - below) / inside if inside else 1.0)
        lower, below = le, cumulative
    return lower


def _kv_states(url: str, timeout: float) -> list[dict]:
    """Each worker's ``kv_events`` entry in the router's ``GET /workers`` ({} where none)."""
    return [w.get("kv_events") or {} for w in httpx.get(f"{url}/workers", timeout=timeout).json()]


def router_kv_event_lags(url: str) -> dict[str, float]:
    """The largest of the workers' recent KV-event batch lags (publish to receipt, real
    seconds) at the router at ``url``: ``p50`` and ``max`` (empty if unreadable or none)."""
    try:
        kv = _kv_states(url, timeout=10)
    except (httpx.HTTPError, ValueError):
        return {}
    out = {}
    for key in ("p50", "max"):
        values = [k[f"lag_s_{key}"] for k in kv if k.get(f"lag_s_{key}") is not None]
        if values:
            out[key] = max(values)
    return out


def outcome_document(trace_info: dict, outcomes: Sequence[ReplayOutcome], workers: int,
                     wall: float, time_scale: float,
                     shadows: dict[str, dict[str, float]] | None = None,
                     active: str = "blocks",
                     lags: dict[str, dict[str, float]] | None = None,
                     predictions: dict[str, dict[str, float]] | None = None) -> dict:  # fmt: skip
    """results.json for live runs: ``hit_rate`` is the workers' own metric; ``shadows``:
    each policy's router-measured shadow errors (:func:`router_shadow_errors`); ``lags``: its
    KV-event lags (:func:`router_kv_event_lags`), written in modelled seconds
    (``kv_event_lag_p50_s``, ``_max_s``: real ones times ``time_scale``), to set beside
    ``simulate --kv-event-delay-ms``; ``predictions``: its TTFT prediction error
    (:func:`router_prediction_errors`)."""
    document = results_document(trace_info, workers, wall, [o.run for o in outcomes])
    document["time_scale"] = time_scale
    for outcome in outcomes:
        entry = document["policies"][outcome.run.name]
        entry["hit_rate"] = outcome.worker_hit_rate
        entry["reported_hit_rate"] = outcome.reported_hit_rate
        entry["errors"] = outcome.errors
        entry["retried"] = outcome.retried
        entry["lost_streaming"] = outcome.lost_streaming
        entry["send_lag_p99"] = outcome.send_lag_p99
        for key in ("pick_us_p50", "pick_us_p99"):
            entry[key] = None  # measured inside the router: see its /metrics
        errors = (shadows or {}).get(outcome.run.name, {})
        for name, value in errors.items():
            entry[f"shadow_abs_error_{name}"] = value
        entry["shadow_abs_error"] = errors.get("kv", errors.get(active))
        for key, value in (lags or {}).get(outcome.run.name, {}).items():
            entry[f"kv_event_lag_{key}_s"] = value * time_scale
        entry |= (predictions or {}).get(outcome.run.name, {})
    return document


def replay_config(args: argparse.Namespace, url: str, salt: int, workers=()) -> ReplayConfig:
    return ReplayConfig(
        url=url,
        speedup=args.speedup,
        pacing=args.pacing,
        prompt_mode=args.prompt_mode,
        vocab_size=args.vocab_size,
        salt=salt,
        model=args.model,
        max_output_tokens=args.max_output_tokens,
        worker_urls=tuple(workers),
        progress=True,
        retries=args.retries,
    )


def report_outcomes(document: dict, outcomes: Sequence[ReplayOutcome], out: Path) -> None:
    written = write_results(document, out) + write_plots([o.run for o in outcomes], out)
    print(markdown_table(document))
    for o in outcomes:
        if o.errors:
            print(f"{o.run.name}: {o.errors} errors, e.g. {o.error_samples[0]}", file=sys.stderr)
    print(f"{document['wall_seconds']:.1f} s; wrote {', '.join(str(p) for p in written)}")


def scheduling_policy(sim_worker_args: list[str]) -> str:
    """The ``--scheduling-policy`` the sim workers run with these flags (the last given)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--scheduling-policy", default="fcfs")
    return parser.parse_known_args(sim_worker_args)[0].scheduling_policy


def run_sweep(
    trace: list[TraceRequest], args: argparse.Namespace
) -> tuple[dict, list[ReplayOutcome]]:
    """Replay ``trace`` once per policy in ``args.policies``: results.json and the runs."""
    policies = parse_policies(args.policies)
    extra_router = shlex.split(args.router_args)
    time_scale = sim_time_scale(args) if args.sim_workers else 1.0
    outcomes: list[ReplayOutcome] = []
    shadows: dict[str, dict[str, float]] = {}
    lags: dict[str, dict[str, float]] = {}
    predictions: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    profile = ["--gpu-profile", profile_arg(args.gpu_profile)]  # --sim-worker-args may override
    sim_args = ["--time-scale", str(time_scale), *profile, *shlex.split(args.sim_worker_args)]
    kv_events = "worker-binds" if args.sim_kv_events and args.sim_workers else None
    engine_priority = scheduling_policy(sim_args) == "priority"
    if kv_events is not None:
        extra_router += ["--kv-events", "--kv-events-connect"]
    with sim_workers(args.sim_workers or 0, sim_args, kv_events) as sims:
        workers = [s.url for s in sims] or list(args.worker)
        if not workers:
            raise ValueError("give --worker URL ... or --sim-workers N")
        if not sims:
            check_reachable(workers)
        for k, policy in enumerate(policies):
            clean = reset_caches(workers)
            salt = args.salt if clean else args.salt + 7919 * (k + 1)
            if not clean:
                print(f"  workers refused a cache reset: salt {salt} for {policy}", file=sys.stderr)
            policy_trace = (
                build_capped_trace(trace, args.max_turns) if policy == "capped" else trace
            )
            scaled_args = time_scaled_router_args(policy, time_scale)
            if sims:  # the router told the GPU its sim workers model, as simulate's default
                scaled_args += ["--cost-profile", profile_arg(args.gpu_profile)]
                if engine_priority:  # ... and that they take priorities
                    scaled_args.append("--engine-priority")
            with router(workers, policy, [*scaled_args, *extra_router]) as svc:
                if kv_events is not None:
                    _wait_synced(svc.url, len(workers))
                cfg = replay_config(args, svc.url, salt, workers)
                outcome = asyncio.run(replay(policy_trace, cfg, policy))
                shadows[policy] = router_shadow_errors(svc.url)
                predictions[policy] = router_prediction_errors(svc.url)
                if kv_events is not None:
                    lags[policy] = router_kv_event_lags(svc.url)
            outcomes.append(scaled(outcome, time_scale))
    wall = time.perf_counter() - started
    active = "radix" if "radix" in _option(extra_router, "--shadow") else "blocks"
    document = outcome_document(
        trace_summary(args.trace, trace), outcomes, len(workers), wall, time_scale,
        shadows, active, lags, predictions,
    )  # fmt: skip
    document["pacing"] = args.pacing
    return document, outcomes


def sim_time_scale(args: argparse.Namespace) -> float:
    """How much faster than real time the sim workers run: ``--sim-time-scale``, by default
    ``--speedup`` (the fleet then sees the trace's own load)."""
    return getattr(args, "sim_time_scale", None) or args.speedup


def _option(argv: Sequence[str], name: str) -> str:
    """The value of ``name`` in ``argv`` (``--x v`` or ``--x=v``), or ""."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return ""


def _wait_synced(url: str, n: int, timeout_s: float = 30.0) -> None:
    """Until every worker's KV-event index is connected and synced (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            kv = _kv_states(url, timeout=5)
        except httpx.HTTPError:
            kv = []
        if len(kv) == n and all(k.get("connected") and k.get("synced") for k in kv):
            return
        time.sleep(0.1)
    print(f"  KV-event indexes not synced after {timeout_s:.0f} s", file=sys.stderr)

"""Flow control live (issue 44): overload without collapse, two tenants and two priorities.

    python bench/flow/flow_control.py [--requests 400] [--time-scale 10] [--out FILE]

4 sim workers (``--time-scale`` times faster than real time; every time below is in the
workers' modelled seconds: real seconds times the time scale) and the bundled conversation
sample's first ``--requests`` requests, each session given a tenant (``--tenants 4:1``: the
first tenant sends 4x the second's sessions) and, for ``--interactive-share`` of them,
priority 1 (the rest 0), sent as ``x-llm-d-inference-fairness-id`` and ``x-priority``:

1. capacity: the highest load (a multiple of the trace's rate) in ``--loads`` whose TTFT p90
   is within ``--slo`` seconds with flow control off and no error; its goodput (requests
   answered 200 with TTFT within the SLO, per modelled second of the run);
   (``--via-epp``: every run through Envoy as a GIE-style gateway asking ``cache-router epp``,
   bench/epp's setup, instead of ``serve``);
2. at ``--overload`` times that load: flow control off, flow control on
   (``--flow-target-ttft-s``), and the light tenant's requests alone (flow control on, the
   same send times).

Reported per run: statuses (and whether every 429/503 said Retry-After), TTFT p90 of the
interactive requests, of each tenant and overall (served requests), goodput, and the
router's in-flight gauge after the run. The bar: interactive p90 <= the SLO; the light
tenant's p90 <= 1.5x its p90 alone; goodput >= 0.9x the goodput at capacity; every request
answered 200, or 429/503 with Retry-After; in flight back to 0.

``--load X`` (issue 52's overload): no capacity search; flow control off and on at ``X`` times
the trace's rate, and the bar is flow control's gain there: interactive p90 <= 0.5x and the
light tenant's p90 <= 0.7x what they get with flow control off, every request answered 200 or
429/503 with Retry-After. ``--flow-defaults``: flow control at ``serve``'s defaults (target TTFT
and queue TTL as Settings has them, in modelled seconds); ``--max-output 0``: the trace's own
output lengths; ``--interactive-priority``: the interactive share's ``x-priority``;
``--worker-gpu-profile``: the sim workers' ``--gpu-profile``.

The SLO is 4 s by default, not the issue's 2 s: on 4 default sim workers the sample's first 400
requests have a TTFT p90 of 2.85 s at 0.2x load offline (`cache-router simulate ... --speedup
0.2`; no-queue floor 1.77 s) and about 3 s live, so no load meets 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "epp"))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

from traces.live.fleet import (  # noqa: E402
    free_port,
    reset_caches,
    router,
    sim_workers,
    time_scaled_router_args,
)
from traces.live.replay import ReplayConfig, ReplayOutcome, replay  # noqa: E402
from traces.trace.assign import assign_tenants, parse_tenant_weights, tenant_name  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402
from traces.trace.record import TraceRequest  # noqa: E402

SAMPLE = ROOT / "traces" / "data" / "conversation_sample.jsonl"


def p90(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, 90)) if len(values) else float("nan")


def in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "cache_router_in_flight":
            return family.samples[0].value
    return float("nan")


def summarize(
    trace: Sequence[TraceRequest], outcome: ReplayOutcome, scale: float, slo: float
) -> dict:
    """The figures of one run, times in modelled seconds."""
    status = outcome.status
    ttft = outcome.ttft * scale
    served = status == 200
    ttft = np.where(served, ttft, np.nan)
    good = served & (ttft <= slo)
    span = outcome.run.wall_seconds * scale
    refused = (status == 429) | (status == 503)
    priority = np.array([r.priority for r in trace])
    tenant = np.array([r.tenant or "" for r in trace])
    out = {
        "requests": len(trace),
        "statuses": {str(s): int((status == s).sum()) for s in sorted(set(status.tolist()))},
        "refused_without_retry_after": int((refused & ~outcome.retry_after).sum()),
        "unanswered": int((~served & ~refused).sum()),
        "ttft_p90": p90(ttft),
        "goodput_rps": float(good.sum()) / span if span else 0.0,
        "wall_s": outcome.run.wall_seconds,
    }
    for p in sorted(set(priority.tolist())):
        mask = priority == p
        out[f"priority_{p}"] = {
            "requests": int(mask.sum()),
            "served": int((mask & served).sum()),
            "ttft_p90": p90(ttft[mask]),
            "goodput_rps": float((good & mask).sum()) / span if span else 0.0,
        }
    for t in sorted(set(tenant.tolist())):
        mask = tenant == t
        out[t or "none"] = {
            "requests": int(mask.sum()),
            "served": int((mask & served).sum()),
            "ttft_p90": p90(ttft[mask]),
            "goodput_rps": float((good & mask).sum()) / span if span else 0.0,
        }
    return out


@contextlib.contextmanager
def front_end(
    workers: list[str], router_args: list[str], via_epp: bool
) -> Iterator[tuple[str, str]]:
    """``serve``, or (``via_epp``) Envoy as a GIE-style gateway asking ``cache-router epp``
    (bench/epp's setup); yields the URL to replay to and the router's metrics URL."""
    if not via_epp:
        with router(workers, "ttft", router_args) as r:
            yield r.url, r.url
        return
    from epp_bench import Procs, start_envoy, wait_http

    from router.epp.envoy_config import gateway_config

    procs = Procs()
    with tempfile.TemporaryDirectory() as folder:
        try:
            grpc_port, http_port = free_port(), free_port()
            procs.start(
                [sys.executable, "-m", "router.cli", "epp", "--worker", *workers,
                 "--port", str(grpc_port), "--http-port", str(http_port), "--plaintext",
                 *router_args],
                Path(folder) / "epp.log",
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{http_port}/health")
            port, admin = free_port(), free_port()
            start_envoy(procs, Path(folder), gateway_config(port, admin, grpc_port), "envoy")
            yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"
        finally:
            procs.stop()


def one_run(
    trace: Sequence[TraceRequest],
    workers: list[str],
    load: float,
    args: argparse.Namespace,
    flow: bool,
) -> dict:
    scale = args.time_scale
    router_args = ["--log-level", "warning", *time_scaled_router_args("ttft", scale)]
    if flow:
        target, ttl = args.flow_target_ttft_s, args.flow_ttl_s
        if args.flow_defaults:
            from router.config import Settings

            defaults = Settings.model_fields
            target = defaults["flow_target_ttft_s"].default
            ttl = defaults["flow_queue_ttl_s"].default
        from router.core.flow_queue import DECODE_STEP_S, DECODE_TOKEN_S

        router_args += [
            "--flow-control",
            "--flow-target-ttft-s", repr(target / scale),
            "--flow-queue-ttl-s", repr(ttl / scale),
            "--flow-decode-step-s", repr(DECODE_STEP_S / scale),
            "--flow-decode-token-s", repr(DECODE_TOKEN_S / scale),
        ]  # fmt: skip
    if not reset_caches(workers):
        raise RuntimeError("a worker refused POST /reset_prefix_cache")
    with front_end(workers, router_args, args.via_epp) as (url, metrics_url):
        cfg = ReplayConfig(
            url=url, speedup=load * scale, max_output_tokens=args.max_output or None,
            prompt_mode=args.prompt_mode, worker_urls=tuple(workers),
        )  # fmt: skip
        outcome = asyncio.run(replay(trace, cfg, "flow" if flow else "plain"))
        time.sleep(0.2)
        result = summarize(trace, outcome, scale, args.slo)
        result["in_flight_after"] = in_flight(metrics_url)
    result["load"] = load
    result["flow_control"] = flow
    print(json.dumps({k: result[k] for k in ("load", "flow_control", "statuses", "ttft_p90",
                                             "goodput_rps")}), file=sys.stderr)  # fmt: skip
    return result


SMG_PRIORITIES = ((1, "interactive"), (0, "default"))  # x-smg-priority by trace priority


def smg_run(
    trace: Sequence[TraceRequest], workers: list[str], load: float, args: argparse.Namespace
) -> dict:
    """SMG 1.13 (``--smg BINARY``) on the same workers and load: its priority scheduler
    (x-smg-priority: interactive / default), tenants from the fairness header, a concurrency
    bound with a queue (``--smg-max-concurrent``, ``--smg-queue-timeout-s`` real seconds:
    its granularity), its cache_aware policy (bench/peers/peer_routers.py starts it)."""
    from peer_routers import peer_router

    if not reset_caches(workers):
        raise RuntimeError("a worker refused POST /reset_prefix_cache")
    extra = [
        "--priority-scheduler-enabled",
        "--priority-scheduler-default-max-class", "interactive",
        "--trust-tenant-header",
        "--tenant-header-name", "x-llm-d-inference-fairness-id",
        "--max-concurrent-requests", str(args.smg_max_concurrent),
        "--queue-size", "1024",
        "--queue-timeout-secs", str(args.smg_queue_timeout_s),
    ]  # fmt: skip
    with (
        tempfile.TemporaryDirectory() as folder,
        peer_router("smg", args.smg, workers, "cache_aware", folder, extra) as smg,
    ):
        cfg = ReplayConfig(
            url=smg.url, speedup=load * args.time_scale, max_output_tokens=args.max_output or None,
            prompt_mode=args.prompt_mode, worker_urls=tuple(workers), model="sim-model",
            priority_header="x-smg-priority", priority_names=SMG_PRIORITIES,
        )  # fmt: skip
        outcome = asyncio.run(replay(trace, cfg, "smg"))
        result = summarize(trace, outcome, args.time_scale, args.slo)
    result["load"] = load
    result["router"] = "smg"
    print(json.dumps({k: result[k] for k in ("load", "statuses", "ttft_p90", "goodput_rps")}),
          file=sys.stderr)  # fmt: skip
    return result


def run(args: argparse.Namespace) -> dict:
    trace = load_trace(str(args.trace))[: args.requests]
    weights = parse_tenant_weights(args.tenants)
    trace = assign_tenants(trace, weights, args.interactive_share, args.interactive_priority)
    worker_args = ["--time-scale", str(args.time_scale), "--log-level", "warning"]
    if args.worker_gpu_profile:
        worker_args += ["--gpu-profile", args.worker_gpu_profile]
    out: dict = {"args": vars(args) | {"trace": str(args.trace)}, "capacity_runs": []}
    light = tenant_name(len(weights) - 1)
    with sim_workers(args.workers, worker_args) as started:
        workers = [w.url for w in started]
        if args.smg:  # only SMG, at --overload times the first of --loads
            out["smg"] = smg_run(trace, workers, args.loads[0] * args.overload, args)
            return out
        if args.load is not None:  # issue 52: flow control's gain at one overload
            out["off"] = one_run(trace, workers, args.load, args, flow=False)
            out["on"] = one_run(trace, workers, args.load, args, flow=True)
            out["bar"] = overload_bar(out, light, args.interactive_priority)
            return out
        capacity = None
        for load in args.loads:
            result = one_run(trace, workers, load, args, flow=False)
            out["capacity_runs"].append(result)
            ok = result["ttft_p90"] <= args.slo and result["statuses"] == {"200": len(trace)}
            if not ok:
                break
            capacity = result
        if capacity is None:
            raise RuntimeError("no load in --loads meets the SLO: try lower ones")
        out["capacity"] = capacity
        overload = capacity["load"] * args.overload
        out["off"] = one_run(trace, workers, overload, args, flow=False)
        out["on"] = one_run(trace, workers, overload, args, flow=True)
        alone = [r for r in trace if r.tenant == light]
        out["light_alone"] = one_run(alone, workers, overload, args, flow=True)
    out["bar"] = bar(out, light, args.slo, args.interactive_priority)
    return out


def overload_bar(out: dict, light: str, priority: int) -> dict:
    """Issue 52's bar: flow control's gain over flow control off at the same load."""
    on, off = out["on"], out["off"]
    nan = {"ttft_p90": float("nan")}
    interactive = on.get(f"priority_{priority}", nan)["ttft_p90"]
    interactive_off = off.get(f"priority_{priority}", nan)["ttft_p90"]
    light_on, light_off = on[light]["ttft_p90"], off[light]["ttft_p90"]
    return {
        "interactive_p90_on": interactive,
        "interactive_p90_off": interactive_off,
        "interactive_ratio": interactive / interactive_off,
        "interactive_ok": interactive <= 0.5 * interactive_off,
        "light_p90_on": light_on,
        "light_p90_off": light_off,
        "light_ratio": light_on / light_off,
        "light_ok": light_on <= 0.7 * light_off,
        "answered_ok": on["unanswered"] == 0 and on["refused_without_retry_after"] == 0,
        "in_flight_ok": on["in_flight_after"] == 0,
    }


def bar(out: dict, light: str, slo: float, priority: int = 1) -> dict:
    on = out["on"]
    interactive = on.get(f"priority_{priority}", {}).get("ttft_p90", float("nan"))
    light_p90 = on[light]["ttft_p90"]
    alone = out["light_alone"][light]["ttft_p90"]
    goodput_ratio = on["goodput_rps"] / out["capacity"]["goodput_rps"]
    return {
        "interactive_p90": interactive,
        "interactive_ok": interactive <= slo,
        "light_p90": light_p90,
        "light_alone_p90": alone,
        "light_ratio": light_p90 / alone if alone else float("nan"),
        "light_ok": light_p90 <= 1.5 * alone,
        "goodput_ratio": goodput_ratio,
        "goodput_ok": goodput_ratio >= 0.9,
        "answered_ok": on["unanswered"] == 0 and on["refused_without_retry_after"] == 0,
        "in_flight_ok": on["in_flight_after"] == 0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(SAMPLE))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument(
        "--loads", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0],
        help="loads tried for the capacity, in order, until one misses the SLO (one load: "
        "taken as the capacity if it meets it)",
    )  # fmt: skip
    p.add_argument("--overload", type=float, default=2.0)
    p.add_argument(
        "--load", type=float, default=None,
        help="no capacity search: flow control off and on at this multiple of the trace's "
        "rate, judged by issue 52's bar (flow control's gain over off)",
    )  # fmt: skip
    p.add_argument("--slo", type=float, default=4.0, help="TTFT p90 SLO, modelled seconds")
    p.add_argument("--flow-target-ttft-s", type=float, default=2.5)
    p.add_argument("--flow-ttl-s", type=float, default=1.0)
    p.add_argument(
        "--flow-defaults", action="store_true",
        help="flow control at serve's defaults (target TTFT, queue TTL) instead of the two above",
    )  # fmt: skip
    p.add_argument("--tenants", default="4:1")
    p.add_argument("--interactive-share", type=float, default=0.2)
    p.add_argument("--interactive-priority", type=int, default=1)
    p.add_argument("--max-output", type=int, default=64, help="0: the trace's own")
    p.add_argument("--worker-gpu-profile", default=None, help="the sim workers' --gpu-profile")
    p.add_argument(
        "--prompt-mode", choices=("tokens", "text"), default="tokens",
        help="prompts as token ids or text (SMG takes text only)",
    )  # fmt: skip
    p.add_argument(
        "--smg", metavar="BINARY", default=None,
        help="only SMG (its smg binary, e.g. /tmp/peers-venv/bin/smg) at --overload times "
        "the first of --loads, side by side with this router's run",
    )  # fmt: skip
    p.add_argument("--smg-max-concurrent", type=int, default=16)
    p.add_argument("--smg-queue-timeout-s", type=int, default=1)
    p.add_argument(
        "--via-epp", action="store_true",
        help="every run through Envoy + cache-router epp instead of serve",
    )  # fmt: skip
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "flow_control.json"))
    args = p.parse_args()
    out = run(args)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(json.dumps(out.get("bar", out.get("smg")), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

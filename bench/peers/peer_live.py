"""Live against the real peer binaries (issue 41, parts 3 and 5): the same sim workers and
requests behind SMG, vllm-router and ``cache-router serve``, one router after another.

    python bench/peers/peer_live.py --loads 0.4 0.6 0.8 [--trace T] [--requests N] \
        [--routers smg:cache_aware,...,serve:ttft] [--repeats 3] [--slo-ttft-p90-s 15] \
        [--out bench/results/peer_live.json]   # and the table beside it, peer_live.md

The peers are bench-only (never in the runtime or test lock), in a venv of their own:

    python -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install -r requirements/bench-peers.txt  # smg, vllm-router

``--workers`` sim workers start once (``--time-scale`` times faster than real time,
``--kv-capacity-tokens`` each; every time reported is in their modelled seconds: real seconds
times the time scale). Then, for each repetition, each load and each router (``KIND:POLICY``;
the order rotated from one load to the next so no router always runs first): the workers'
caches are reset (``POST /reset_prefix_cache``), the router starts on a free loopback port
(``smg launch --policy P``, ``vllm-router --policy P``, ``cache-router serve --policy P``
given the workers' time scale as sweep gives it), the trace (``--requests`` first requests)
is replayed through it at ``load`` times its rate (``--pacing``), text prompts for every
router (the peers route on prompt text and SMG refuses token ids), and the router is stopped
by its PID. A repetition uses its own prompt salt, the same for every router.

Reported per load and router (medians over the repetitions, and each run): TTFT p50 / p90 /
p99 of the requests served, the workers' true hit rate (their prefix-cache counters, not a
router's estimate), errors. Then:

- the default (``serve:ttft``) against the best real peer at each load: its p90 over the
  lowest real-peer p90, and both hit rates (issue 41's bar: <= 0.7x at equal or higher hit
  rate, at two loads below the knee);
- faithfulness: each re-implementation's hit rate against its real binary's, in points
  (``serve:smg`` / ``smg:cache_aware`` and its steady variant, ``serve:vllm_router`` /
  ``vllm-router:cache_aware``, and ``serve:sglang_cache_aware`` / ``vllm-router:cache_aware``,
  the model vllm-router was taken for; bar: within 5 points);
- capacity at the SLO: per router, the highest load of ``--loads`` up to which every load
  held (TTFT p90 <= ``--slo-ttft-p90-s``, median over repetitions, and no error): a figure
  over the grid tried, a lower bound where the top held, none where the lowest missed; and
  the default's over the best real peer's (bar: >= 1.2x).

Time compression and SMG: SMG 1.13 runs timers in real seconds (its load poll every 10 s,
which feeds least_load and its overload protection; its worker stall, wedge and stale limits;
a 60 s warm-up slice after a worker registers, which here is every run's start). At time scale
10 a 10 s poll is 100 modelled seconds. The variant ``smg:POLICY:steady`` (``KIND:POLICY:VARIANT``)
runs SMG as a long-running one whose timers run in the workers' time: warm-up and thin-worker
diversion off, every timer divided by the time scale (whole seconds, at least 1;
:func:`variant_args`). Variants count as real peers in the comparisons: the best of them is
the bar. vllm-router routes on its own in-flight counts and polls nothing.

``--from-json FILE`` runs nothing: it reads an earlier result's runs and rewrites its report
and tables. Every process listens on 127.0.0.1 and is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from peer_routers import PEER_KINDS, peer_router, peer_version  # noqa: E402

from traces.live.fleet import (  # noqa: E402
    reset_caches,
    router,
    scrape,
    sim_workers,
    time_scaled_router_args,
)
from traces.live.replay import ReplayConfig, replay  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402
from traces.trace.record import TraceRequest  # noqa: E402

CONVERSATION = ROOT / "traces" / "data" / "conversation_sample.jsonl"
DEFAULT = "serve:ttft"
REAL_PEERS = ("smg:cache_aware", "smg:least_load", "vllm-router:cache_aware")
ROUTERS = (*REAL_PEERS, DEFAULT, "serve:unified", "serve:smg", "serve:vllm_router")
FAITHFUL = (
    ("serve:smg", "smg:cache_aware"),
    ("serve:smg", "smg:cache_aware:steady"),
    ("serve:vllm_router", "vllm-router:cache_aware"),
    ("serve:sglang_cache_aware", "vllm-router:cache_aware"),
)
"""(re-implementation behind serve, the real binary it models): SMG also as the steady
variant, the long-running SMG the re-implementation models."""
FAITHFUL_POINTS = 5.0
SMG_TIMERS = {
    "--load-monitor-interval": 10,
    "--worker-stale-secs": 15,
    "--worker-stall-secs": 2,
    "--worker-wedge-secs": 3,
    "--eviction-interval-secs": 60,
}
"""SMG 1.13's timers (real seconds, whole ones) and their defaults."""
VARIANTS = ("steady",)


def variant_args(kind: str, variant: str | None, time_scale: float) -> list[str]:
    """A peer variant's extra flags. ``smg`` ``steady``: a long-running SMG whose timers run
    in the workers' modelled time: no warm-up slice or thin-worker diversion (they follow a
    worker's registration, which here starts every run), and each timer of
    :data:`SMG_TIMERS` divided by ``time_scale`` (whole seconds, at least 1)."""
    if variant is None:
        return []
    if kind != "smg" or variant != "steady":
        raise ValueError(f"no variant {variant!r} for {kind}")
    args = ["--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0"]
    for flag, seconds in SMG_TIMERS.items():
        args += [flag, str(max(1, round(seconds / time_scale)))]
    return args


BINARY_DEFAULTS = {
    "smg": "/tmp/peers-venv/bin/smg",
    "vllm-router": "/tmp/peers-venv/bin/vllm-router",
}


@dataclass(frozen=True)
class RouterSpec:
    kind: str  # "serve", "smg" or "vllm-router"
    policy: str
    variant: str | None = None

    @property
    def name(self) -> str:
        return ":".join(p for p in (self.kind, self.policy, self.variant) if p)

    @property
    def real_peer(self) -> bool:
        return self.kind in PEER_KINDS


def parse_router(text: str) -> RouterSpec:
    """``KIND:POLICY[:VARIANT]``, KIND one of serve, smg, vllm-router."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"router {text!r}: expected KIND:POLICY[:VARIANT]")
    kind, policy, *rest = parts
    if kind != "serve" and kind not in PEER_KINDS:
        raise ValueError(f"router {text!r}: KIND is serve, {' or '.join(PEER_KINDS)}")
    variant = rest[0] if rest else None
    if variant is not None and (kind != "smg" or variant not in VARIANTS):
        raise ValueError(f"router {text!r}: variants are SMG's only: {', '.join(VARIANTS)}")
    return RouterSpec(kind, policy, variant)


# ---- one run -------------------------------------------------------------------------------


def run_record(
    router_name: str,
    load: float,
    salt: int,
    ttft_s: np.ndarray,
    status: np.ndarray,
    hit_rate: float | None,
    errors: int,
) -> dict:
    """One run's figures: TTFT percentiles (modelled seconds) over the requests served (a
    200 with a first token), the workers' hit rate, errors (requests not served, or cut)."""
    served = (status == 200) & np.isfinite(ttft_s)
    values = ttft_s[served]

    def pct(q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else math.nan

    return {
        "router": router_name,
        "load": load,
        "salt": salt,
        "requests": len(ttft_s),
        "served": int(served.sum()),
        "errors": max(errors, int((~served).sum())),
        "ttft_p50": pct(50),
        "ttft_p90": pct(90),
        "ttft_p99": pct(99),
        "hit_rate": math.nan if hit_rate is None else hit_rate,
    }


WORKER_COUNTERS = {
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_hits_total": "hit_tokens",
}


def worker_counters(workers: Sequence[str]) -> list[dict[str, float]]:
    """Each sim worker's requests finished, prompt tokens and prefix-cache hit tokens."""
    out = []
    for url in workers:
        totals = dict.fromkeys(WORKER_COUNTERS.values(), 0.0)
        for sample in scrape(url):
            key = WORKER_COUNTERS.get(sample.name)
            if key is not None:
                totals[key] += sample.value
        out.append(totals)
    return out


def spread(before: Sequence[dict], after: Sequence[dict]) -> dict:
    """Where a run's work went: requests and uncached prompt tokens (prefill work) per
    worker, and the busiest worker's share over the mean of each."""
    requests = [a["requests"] - b["requests"] for b, a in zip(before, after, strict=True)]
    work = [
        (a["prompt_tokens"] - b["prompt_tokens"]) - (a["hit_tokens"] - b["hit_tokens"])
        for b, a in zip(before, after, strict=True)
    ]

    def over_mean(xs: list[float]) -> float:
        mean = sum(xs) / len(xs) if xs else 0.0
        return max(xs) / mean if mean > 0 else math.nan

    return {
        "requests_per_worker": [int(x) for x in requests],
        "prefill_tokens_per_worker": [int(x) for x in work],
        "requests_max_over_mean": over_mean(requests),
        "prefill_max_over_mean": over_mean(work),
    }


@contextmanager
def front(
    spec: RouterSpec, workers: list[str], args: argparse.Namespace, logs: str
) -> Iterator[str]:
    """The router of ``spec`` in front of ``workers``; yields its URL."""
    if spec.kind == "serve":
        extra = ["--log-level", "warning", *time_scaled_router_args(spec.policy, args.time_scale)]
        with router(workers, spec.policy, extra) as r:
            yield r.url
        return
    binary = args.smg if spec.kind == "smg" else args.vllm_router
    extra = variant_args(spec.kind, spec.variant, args.time_scale)
    with peer_router(spec.kind, binary, workers, spec.policy, logs, extra) as r:
        yield r.url


def one_run(
    trace: Sequence[TraceRequest],
    workers: list[str],
    spec: RouterSpec,
    load: float,
    salt: int,
    model: str,
    args: argparse.Namespace,
    logs: str,
) -> dict:
    if not reset_caches(workers):
        raise RuntimeError("a worker refused POST /reset_prefix_cache")
    before = worker_counters(workers)
    with front(spec, workers, args, logs) as url:
        cfg = ReplayConfig(
            url=url, speedup=load * args.time_scale, pacing=args.pacing, prompt_mode="text",
            salt=salt, model=model, max_output_tokens=args.max_output,
            worker_urls=tuple(workers),
        )  # fmt: skip
        started = time.perf_counter()
        outcome = asyncio.run(replay(trace, cfg, spec.name))
        wall = time.perf_counter() - started
    record = run_record(
        spec.name, load, salt, outcome.ttft * args.time_scale, outcome.status,
        outcome.worker_hit_rate, outcome.errors,
    )  # fmt: skip
    record |= spread(before, worker_counters(workers))
    record["wall_s"] = wall
    record["error_samples"] = outcome.error_samples
    print(
        f"  {spec.name:<28} load {load:<5} salt {salt}: p90 {record['ttft_p90']:.2f} s, "
        f"hit {record['hit_rate']:.1%}, errors {record['errors']}, requests by worker "
        f"{record['requests_per_worker']}, {wall:.0f} s",
        file=sys.stderr,
    )
    return record


# ---- the report (pure: tests/traces/test_peer_live.py) -----------------------------------


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def summarize(runs: Sequence[dict]) -> list[dict]:
    """One row per (load, router): medians over its runs, the runs' p90s and hit rates."""
    groups: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for run in runs:
        groups[(run["load"], run["router"])].append(run)
    rows = []
    for (load, name), group in sorted(groups.items()):
        rows.append({
            "load": load, "router": name, "runs": len(group),
            "ttft_p50": _median([r["ttft_p50"] for r in group]),
            "ttft_p90": _median([r["ttft_p90"] for r in group]),
            "ttft_p99": _median([r["ttft_p99"] for r in group]),
            "hit_rate": _median([r["hit_rate"] for r in group]),
            "ttft_p90_runs": [r["ttft_p90"] for r in group],
            "hit_rate_runs": [r["hit_rate"] for r in group],
            "errors": sum(r["errors"] for r in group),
        })  # fmt: skip
    return rows


def _by(rows: Sequence[dict]) -> dict[tuple[float, str], dict]:
    return {(r["load"], r["router"]): r for r in rows}


def default_vs_peers(rows: Sequence[dict], default: str = DEFAULT) -> list[dict]:
    """Per load: the default's p90 over the lowest real-peer p90 (bar <= 0.7x), and whether
    its hit rate is at least that peer's (and the highest real peer's)."""
    at = _by(rows)
    out = []
    for load in sorted({r["load"] for r in rows}):
        mine = at.get((load, default))
        peers = [r for r in rows if r["load"] == load and parse_router(r["router"]).real_peer
                 and not math.isnan(r["ttft_p90"])]  # fmt: skip
        if mine is None or not peers:
            continue
        best = min(peers, key=lambda r: r["ttft_p90"])
        ratio = mine["ttft_p90"] / best["ttft_p90"] if best["ttft_p90"] > 0 else math.nan
        top_hit = max(r["hit_rate"] for r in peers)
        out.append({
            "load": load, "default_p90": mine["ttft_p90"], "best_peer": best["router"],
            "best_peer_p90": best["ttft_p90"], "p90_ratio": ratio,
            "default_hit": mine["hit_rate"], "best_peer_hit": best["hit_rate"],
            "highest_peer_hit": top_hit,
            "p90_ok": ratio <= 0.7,
            "hit_ok": mine["hit_rate"] >= best["hit_rate"],
        })  # fmt: skip
    return out


def faithfulness(rows: Sequence[dict], pairs: Sequence[tuple[str, str]] = FAITHFUL) -> list[dict]:
    """Per load and (re-implementation, real binary) pair present: both hit rates (medians)
    and the difference in points (bar: within 5)."""
    at = _by(rows)
    out = []
    for load in sorted({r["load"] for r in rows}):
        for model, real in pairs:
            ours, theirs = at.get((load, model)), at.get((load, real))
            if ours is None or theirs is None:
                continue
            points = 100 * (ours["hit_rate"] - theirs["hit_rate"])
            out.append({
                "load": load, "reimplementation": model, "binary": real,
                "reimplementation_hit": ours["hit_rate"], "binary_hit": theirs["hit_rate"],
                "points": points, "within": abs(points) <= FAITHFUL_POINTS,
                "reimplementation_p90": ours["ttft_p90"], "binary_p90": theirs["ttft_p90"],
            })  # fmt: skip
    return out


def capacity(rows: Sequence[dict], slo_s: float) -> dict[str, dict]:
    """Per router: the highest load of the grid up to which every load held (median p90 <=
    ``slo_s`` and no error). ``bound``: "grid" (the next load missed), "at_least" (the top
    load held: capacity is that or more), "below" (the lowest load missed: none here)."""
    out = {}
    for name in sorted({r["router"] for r in rows}):
        mine = sorted((r for r in rows if r["router"] == name), key=lambda r: r["load"])
        held = None
        for r in mine:
            if r["errors"] or not r["ttft_p90"] <= slo_s:
                break
            held = r["load"]
        if held is None:
            bound = "below"
        elif held == mine[-1]["load"]:
            bound = "at_least"
        else:
            bound = "grid"
        out[name] = {"load": held, "bound": bound, "lowest": mine[0]["load"],
                     "highest": mine[-1]["load"]}  # fmt: skip
    return out


def capacity_ratio(caps: dict[str, dict], default: str = DEFAULT) -> dict | None:
    """The default's capacity over the best real peer's, with how far the grid lets it be
    read: "grid" (both on the grid), "at_least" (the default's is a lower bound, or the
    peers held at no load), "at_most" (the peer's is a lower bound), "below" (the default
    held at no load: under the ratio), "unknown" (both held at the top); None where there
    is nothing to read."""
    mine = caps.get(default)
    peers = {k: v for k, v in caps.items() if parse_router(k).real_peer}
    if mine is None or not peers:
        return None
    held = {k: v for k, v in peers.items() if v["load"] is not None}
    if not held:  # no peer held at any load
        if mine["load"] is None:
            return None
        low = min(v["lowest"] for v in peers.values())
        return {"best_peer": None, "ratio": mine["load"] / low, "bound": "at_least"}
    best_name = max(held, key=lambda k: held[k]["load"])
    best = held[best_name]
    if mine["load"] is None:  # the default missed at the lowest load: below that ratio
        return {"best_peer": best_name, "ratio": mine["lowest"] / best["load"], "bound": "below"}
    ratio = mine["load"] / best["load"]
    if mine["bound"] == "at_least" and best["bound"] == "at_least":
        bound = "unknown"
    elif mine["bound"] == "at_least":
        bound = "at_least"
    elif best["bound"] == "at_least":
        bound = "at_most"
    else:
        bound = "grid"
    return {"best_peer": best_name, "ratio": ratio, "bound": bound}


def report(runs: Sequence[dict], slo_s: float) -> dict:
    rows = summarize(runs)
    caps = capacity(rows, slo_s)
    return {
        "rows": rows,
        "default_vs_peers": default_vs_peers(rows),
        "faithfulness": faithfulness(rows),
        "capacity": caps,
        "capacity_ratio": capacity_ratio(caps),
    }


def _f(x: float, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown(doc: dict) -> str:
    """The tables of ``doc`` (``report``'s, with ``config``)."""
    c = doc["config"]
    lines = [
        f"peer_live: {Path(c['trace']).name}, {c['requests']} requests, {c['workers']} sim "
        f"workers x {c['kv_capacity_tokens']:,} KV tokens, time scale {c['time_scale']}, "
        f"pacing {c['pacing']}, {c['repeats']} run(s) per cell, SLO TTFT p90 <= "
        f"{c['slo_ttft_p90_s']} s; peers: {doc.get('versions')}",
        "",
        "| load | router | runs | TTFT p50 s | TTFT p90 s (runs) | TTFT p99 s | hit rate (runs) "
        "| errors |",
        "|---:|---|---:|---:|---|---:|---|---:|",
    ]
    for r in doc["rows"]:
        p90s = " / ".join(_f(v) for v in r["ttft_p90_runs"])
        hits = " / ".join(_f(100 * v, ".1f") for v in r["hit_rate_runs"])
        lines.append(
            f"| {r['load']} | {r['router']} | {r['runs']} | {_f(r['ttft_p50'])} "
            f"| {_f(r['ttft_p90'])} ({p90s}) | {_f(r['ttft_p99'])} "
            f"| {_f(100 * r['hit_rate'], '.1f')}% ({hits}) | {r['errors']} |"
        )
    if doc["default_vs_peers"]:
        lines += ["", f"{DEFAULT} against the best real peer (lowest median p90) at each load:",
                  "", "| load | default p90 s | best peer | its p90 s | ratio (bar <= 0.7) "
                  "| default hit | its hit | highest peer hit |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for v in doc["default_vs_peers"]:
            lines.append(
                f"| {v['load']} | {_f(v['default_p90'])} | {v['best_peer']} "
                f"| {_f(v['best_peer_p90'])} | {_f(v['p90_ratio'])}x "
                f"{'met' if v['p90_ok'] else 'missed'} | {_f(100 * v['default_hit'], '.1f')}% "
                f"| {_f(100 * v['best_peer_hit'], '.1f')}% "
                f"| {_f(100 * v['highest_peer_hit'], '.1f')}% |"
            )
    if doc["faithfulness"]:
        lines += ["", "Faithfulness: re-implementation behind serve against the real binary "
                  "(workers' hit rate, medians):", "",
                  "| load | re-implementation | binary | its hit | binary's hit | points "
                  "(bar 5) | p90 s ours / binary's |",
                  "|---:|---|---|---:|---:|---:|---|"]  # fmt: skip
        for v in doc["faithfulness"]:
            lines.append(
                f"| {v['load']} | {v['reimplementation']} | {v['binary']} "
                f"| {_f(100 * v['reimplementation_hit'], '.1f')}% "
                f"| {_f(100 * v['binary_hit'], '.1f')}% | {v['points']:+.1f} "
                f"{'within' if v['within'] else 'OVER'} "
                f"| {_f(v['reimplementation_p90'])} / {_f(v['binary_p90'])} |"
            )
    lines += ["", f"Capacity at TTFT p90 <= {c['slo_ttft_p90_s']} s over the loads tried "
              f"({', '.join(str(x) for x in c['loads'])}):", "",
              "| router | capacity (load) | read |", "|---|---:|---|"]  # fmt: skip
    for name, cap in doc["capacity"].items():
        read = {"grid": "the next load missed", "at_least": "held at the top: a lower bound",
                "below": f"missed at {cap['lowest']}"}[cap["bound"]]  # fmt: skip
        lines.append(f"| {name} | {_f(cap['load'], 'g')} | {read} |")
    ratio = doc.get("capacity_ratio")
    if ratio:
        lines += ["", f"{DEFAULT} / best real peer ({ratio['best_peer']}): "
                  f"{_f(ratio['ratio'])}x ({ratio['bound']}; bar >= 1.2x)"]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---- main ----------------------------------------------------------------------------------


def worker_model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def run(args: argparse.Namespace) -> dict:
    trace = load_trace(str(args.trace))[: args.requests]
    specs = [parse_router(r) for r in args.routers.split(",") if r.strip()]
    binaries = {"smg": args.smg, "vllm-router": args.vllm_router}
    kinds = sorted({s.kind for s in specs if s.real_peer})
    for kind in kinds:
        if not binaries[kind] or not Path(binaries[kind]).exists():
            raise SystemExit(f"{kind} binary not found ({binaries[kind]}): see the docstring")
    versions = {k: peer_version(k, binaries[k]) for k in kinds}
    worker_args = ["--time-scale", str(args.time_scale), "--kv-capacity-tokens",
                   str(args.kv_capacity_tokens), "--log-level", "warning"]  # fmt: skip
    runs: list[dict] = []
    started = time.perf_counter()
    with sim_workers(args.workers, worker_args) as sims, tempfile.TemporaryDirectory() as logs:
        workers = [w.url for w in sims]
        model = worker_model(workers[0])
        step = 0
        for rep in range(args.repeats):
            for load in args.loads:
                k = step % len(specs)
                step += 1
                for spec in [*specs[k:], *specs[:k]]:
                    runs.append(
                        one_run(trace, workers, spec, load, args.salt + rep, model, args, logs)
                    )
    config = {
        "trace": str(args.trace), "requests": len(trace), "workers": args.workers,
        "kv_capacity_tokens": args.kv_capacity_tokens, "time_scale": args.time_scale,
        "pacing": args.pacing, "max_output": args.max_output, "loads": args.loads,
        "routers": [s.name for s in specs], "repeats": args.repeats, "salt": args.salt,
        "slo_ttft_p90_s": args.slo_ttft_p90_s, "wall_s": time.perf_counter() - started,
    }  # fmt: skip
    return {"config": config, "versions": versions, **report(runs, args.slo_ttft_p90_s),
            "runs": runs}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(CONVERSATION))
    p.add_argument("--requests", type=int, default=None, help="the first N (default: all)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--kv-capacity-tokens", type=int, default=1_000_000)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--pacing", choices=("open", "session"), default="open")
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument(
        "--loads", type=float, nargs="+", default=[0.8], help="multiples of the trace's rate"
    )
    p.add_argument(
        "--routers", default=",".join(ROUTERS),
        help="KIND:POLICY[:VARIANT] list, KIND serve, smg or vllm-router (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="runs per (load, router)")
    p.add_argument("--salt", type=int, default=0, help="the first repetition's prompt salt")
    p.add_argument("--smg", default=BINARY_DEFAULTS["smg"], metavar="BIN")
    p.add_argument("--vllm-router", default=BINARY_DEFAULTS["vllm-router"], metavar="BIN")
    p.add_argument("--slo-ttft-p90-s", type=float, default=15.0, help="modelled seconds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "peer_live.json"))
    p.add_argument(
        "--from-json", metavar="FILE", default=None,
        help="run nothing: read FILE's runs and config, rewrite its report and tables (to "
        "--out and its .md)",
    )  # fmt: skip
    args = p.parse_args()
    if args.from_json:
        old = json.loads(Path(args.from_json).read_text())
        tables = report(old["runs"], old["config"]["slo_ttft_p90_s"])
        doc = {"config": old["config"], "versions": old.get("versions"), **tables,
               "runs": old["runs"]}  # fmt: skip
    elif args.repeats < 1 or min(args.loads) <= 0:
        p.error("--repeats >= 1 and positive --loads")
    else:
        doc = run(args)
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    table = markdown(doc)
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

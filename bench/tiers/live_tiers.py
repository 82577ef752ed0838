"""Tiered KV caches live (issue 43): the router's per-tier shadows against sim workers with a
CPU tier, and the live ranking of the tier-blind, tier-aware and fixed-credit routers against
the simulator's.

    nice -n 5 .venv/bin/python bench/tiers/live_tiers.py [--requests 80] \
        [--out bench/results/live_tiers.json] [--md out/live_tiers.md]

Four sim workers (GPU KV ``--kv-capacity-tokens`` 262,144, a CPU tier of
``--cpu-kv-capacity-tokens`` 1,048,576, KV events published, each at its own port) priced by
``--gpu-profile`` (the worker model's default, the measured H100 8B profile, loading at its
measured rate; ``flat``, or a flat-model flag such as ``--kv-load-gbps`` given without it: the
flat model, loading at ``--kv-load-gbps``, 20 GB/s by default; the worker model's flags are
``simulate``'s, :func:`traces.sim.worker_model.add_model_options`) run
``--speedup`` (20) times faster than real time, as ``cache-router sweep --sim-workers`` runs
them. On the same workers, their caches reset in
between (``POST /reset_prefix_cache``), a fresh ``cache-router serve`` per configuration:

- (a) ``ttft --router-tiers off`` (tier-blind), (b) ``ttft --router-tiers on``,
  (c) ``tiered --router-tiers on`` (the peers' fixed credits), (d) ``ttft --router-tiers on
  --kv-events --kv-events-connect`` (the KV-event index, the workers binding their
  publishers).

Every router runs the GPU shadow ``--shadow`` (radix): its split of a hit between the tiers
is right only when the shadow evicts as the worker does, and the sim workers' radix cache
evicts whole leaves (SGLang's rule; ``blocks`` evicts block by block, tail first, as vLLM).

Every router gets the workers' capacities, their profile (``--cost-profile``) and, like
``sweep``, their time scale
(:func:`traces.live.fleet.time_scaled_router_args`: the prefill prior times it, ttft's times
divided by it, ``--cost-time-scale``, which divides the price of a CPU-tier load too: the
workers' loads take 1/speedup real seconds). ``cache-router replay`` sends the bundled
Weka agentic sample through it with session pacing (output capped at 64 tokens, as
``bench/live_vs_offline``'s agentic preset; ``--requests N``: the first N only) and writes its
results.json under ``out/live_tiers/``; client times are multiplied by the speedup, so they
read in modelled seconds.

Per configuration: TTFT p50/p90 (modelled s), hit rate (both tiers: the responses'
``cached_tokens`` over prompt tokens), the CPU tier's share of the cached tokens (the
workers' ``vllm:prompt_tokens_cached_by_source{source="host"}`` deltas), the router's
per-tier shadow error from ``GET /workers`` summed over workers (``cpu_tier``
``abs_error_tokens`` and ``gpu_abs_error_tokens`` over the ``prompt_tokens`` of the reports
with a tier split) and ``cache_router_shadow_error_ratio`` from ``/metrics``. The simulator
runs the same configurations (``traces.sim.simulator.simulate``, ``router_tiers``, ``kv_events``
for (d)) on the same requests; the report says whether the live ranking of (a)-(c) by TTFT p90
and by hit rate is the offline one. Bar (issue 43): per-tier error <= 5% in (b), <= 2% in (d).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from traces.commands.options import cap_output, make_sim_picker  # noqa: E402
from traces.live.fleet import (  # noqa: E402
    HOST,
    free_port,
    reset_caches,
    scrape,
    sim_workers,
    start_service,
    time_scaled_router_args,
)
from traces.sim.simulator import SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import (  # noqa: E402
    add_model_options,
    model_argv,
    model_config_from_args,
    profile_arg,
)
from traces.trace.formats import load_trace  # noqa: E402

TRACE = ROOT / "traces" / "data" / "weka_agentic_sample.jsonl"


@dataclass(frozen=True)
class Config:
    key: str
    policy: str
    tiers: str  # --router-tiers
    kv_events: bool

    @property
    def label(self) -> str:
        return f"({self.key}) {self.policy} tiers {self.tiers}" + (
            " + KV events" if self.kv_events else ""
        )


CONFIGS = (
    Config("a", "ttft", "off", False),
    Config("b", "ttft", "on", False),
    Config("c", "tiered", "on", False),
    Config("d", "ttft", "on", True),
)
RANKED = ("a", "b", "c")  # the ranking compared live and offline


# ---- live ------------------------------------------------------------------------------------


def cached_by_source(workers: list[str]) -> dict[str, float]:
    """Summed ``vllm:prompt_tokens_cached_by_source`` of ``workers``, by source."""
    out: dict[str, float] = {}
    for url in workers:
        for s in scrape(url):
            if s.name.startswith("vllm:prompt_tokens_cached_by_source") and not s.name.endswith(
                "_created"
            ):
                src = s.labels.get("source", "?")
                out[src] = out.get(src, 0.0) + s.value
    return out


def wait_synced(url: str, n: int, timeout_s: float = 30.0) -> bool:
    """Until every worker's KV-event index at the router is connected and synced."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            kv = [w.get("kv_events") or {} for w in httpx.get(f"{url}/workers", timeout=5).json()]
        except (httpx.HTTPError, ValueError):
            kv = []
        if len(kv) == n and all(k.get("connected") and k.get("synced") for k in kv):
            return True
        time.sleep(0.1)
    return False


def router_args(cfg: Config, workers: list[str], args: argparse.Namespace, port: int) -> list[str]:
    out = ["serve", "--host", HOST, "--port", str(port), "--policy", cfg.policy]
    out += ["--worker", *workers]
    out += ["--kv-capacity-tokens", str(args.kv_capacity_tokens)]
    out += ["--cpu-kv-capacity-tokens", str(args.cpu_kv_capacity_tokens)]
    out += ["--router-tiers", cfg.tiers, "--shadow", args.shadow, "--log-level", "warning"]
    # priced as the workers are: their profile, or the flat model at its load rate (modelled
    # time: --cost-time-scale scales both); a profile prices a load at its own bulk rate
    out += ["--cost-profile", profile_arg(args.model.profile)]
    if args.model.profile is None:
        out += ["--kv-load-gbps", repr(args.model.kv_load_gbps)]
    out += time_scaled_router_args(cfg.policy, args.speedup)
    if cfg.kv_events:
        out += ["--kv-events", "--kv-events-connect"]
    return out


def tier_errors(listed: list[dict]) -> dict:
    """The router's per-tier accuracy summed over workers (``GET /workers``)."""
    tiers = [w["cpu_tier"] for w in listed if w.get("cpu_tier")]
    acc = [w["accuracy"] for w in listed]
    out: dict = {
        "requests": sum(a["requests"] for a in acc),
        "prompt_tokens": sum(a["prompt_tokens"] for a in acc),
        "reported_tokens": sum(a["reported_tokens"] for a in acc),
        "blocks_estimate_tokens": sum(a["blocks_estimate_tokens"] for a in acc),
        "blocks_abs_error_tokens": sum(a["blocks_abs_error_tokens"] for a in acc),
        "kv_events_requests": sum(a["kv_events_requests"] for a in acc),
    }
    if not tiers:
        return out | {"cpu_error": None, "gpu_error": None}
    keys = ("requests", "prompt_tokens", "reported_tokens", "estimate_tokens")
    keys += ("abs_error_tokens", "gpu_abs_error_tokens", "shadow_blocks")
    tier = {k: sum(t[k] for t in tiers) for k in keys}
    prompt = tier["prompt_tokens"] or 1
    return out | {
        "cpu_tier": tier,
        "cpu_error": tier["abs_error_tokens"] / prompt,
        "gpu_error": tier["gpu_abs_error_tokens"] / prompt,
    }


def metric_ratios(url: str) -> dict[str, float]:
    """``cache_router_shadow_error_ratio`` by shadow."""
    return {
        s.labels["shadow"]: s.value
        for s in scrape(url)
        if s.name == "cache_router_shadow_error_ratio"
    }


def run_one(cfg: Config, workers: list[str], args: argparse.Namespace, out_dir: Path) -> dict:
    if not reset_caches(workers):
        raise RuntimeError("sim workers refused a cache reset")
    port = free_port()
    log = out_dir / f"router-{cfg.key}.log"
    router = start_service(f"router-{cfg.key}", router_args(cfg, workers, args, port), port,
                           log_file=str(log))  # fmt: skip
    try:
        synced = wait_synced(router.url, len(workers)) if cfg.kv_events else None
        before = cached_by_source(workers)
        run_dir = out_dir / cfg.key
        cmd = [sys.executable, "-m", "router.cli", "replay", "--url", router.url]
        cmd += ["--trace", args.trace, "--speedup", repr(args.speedup), "--pacing", "session"]
        cmd += ["--out", str(run_dir), "--name", cfg.key, "--worker-metrics", *workers]
        cmd += ["--prompt-mode", args.prompt_mode]
        if args.max_output_tokens:
            cmd += ["--max-output-tokens", str(args.max_output_tokens)]
        if args.requests:
            cmd += ["--max-requests", str(args.requests)]
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ})
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"replay failed ({done.returncode}): {done.stderr[-2000:]}")
        after = cached_by_source(workers)
        listed = httpx.get(router.url + "/workers", timeout=10).json()
        ratios = metric_ratios(router.url)
    finally:
        router.stop()
    doc = json.loads((run_dir / "results.json").read_text())
    entry = doc["policies"][cfg.key]
    host = after.get("host", 0.0) - before.get("host", 0.0)
    device = after.get("device", 0.0) - before.get("device", 0.0)
    errors = tier_errors(listed)
    row = {
        "config": cfg.key,
        "label": cfg.label,
        "requests": entry["requests"],
        "errors": entry.get("errors"),
        "wall_s": wall,
        # replay's client times are real seconds: times the speedup, modelled ones
        "ttft_p50": entry["ttft_p50"] * args.speedup,
        "ttft_p90": entry["ttft_p90"] * args.speedup,
        "hit_rate": entry["reported_hit_rate"],
        "worker_gpu_hit_rate": entry.get("hit_rate"),
        "cpu_share": host / (host + device) if host + device else None,
        "cached_host_tokens": host,
        "cached_device_tokens": device,
        "cpu_error": errors["cpu_error"],
        "gpu_error": errors["gpu_error"],
        "metrics_ratio": ratios,
        "router": errors,
        "kv_events_synced": synced,
    }
    print(f"  live {cfg.label}: {wall:.0f} s, {fmt_row(row)}", file=sys.stderr)
    return row


def run_live(args: argparse.Namespace, out_dir: Path, configs: list[Config]) -> list[dict]:
    sim_args = ["--time-scale", repr(args.speedup), "--log-level", "warning"]
    sim_args += model_argv(args.model)
    with sim_workers(args.workers, sim_args, kv_events="worker-binds") as sims:
        workers = [s.url for s in sims]
        return [run_one(cfg, workers, args, out_dir) for cfg in configs]


# ---- offline ---------------------------------------------------------------------------------


def run_offline(args: argparse.Namespace, configs: list[Config]) -> list[dict]:
    trace = load_trace(args.trace)
    if args.requests:
        trace = trace[: args.requests]
    if args.max_output_tokens:
        trace = cap_output(trace, args.max_output_tokens)
    worker = args.model  # as the sim workers
    rows = []
    for cfg in configs:
        config = SimConfig(workers=args.workers, worker=worker, pacing="session",
                           cost_profile=worker.profile, router_tiers=cfg.tiers,
                           kv_events=cfg.kv_events, shadow=args.shadow)  # fmt: skip
        s = simulate(trace, make_sim_picker(cfg.policy), config, cfg.key).summary()
        hit, cpu = s["hit_rate"], s.get("cpu_hit_rate", 0.0)
        rows.append(
            {
                "config": cfg.key,
                "label": cfg.label,
                "ttft_p50": s["ttft_p50"],
                "ttft_p90": s["ttft_p90"],
                "hit_rate": hit,
                "cpu_share": cpu / hit if hit else None,
                "cpu_error": s.get("shadow_abs_error_cpu"),
                "gpu_error": s.get("shadow_abs_error_gpu"),
                "shadow_abs_error": s["shadow_abs_error"],
            }
        )
    if any(c.kv_events for c in configs):
        # a diagnostic, not ranked: the same (d) with the KV events arriving at once (the
        # index then sees an eviction made at the very step boundary a session's next turn
        # is dispatched at; any delay, even 1 ms, hides it)
        config = SimConfig(workers=args.workers, worker=worker, pacing="session",
                           cost_profile=worker.profile, router_tiers="on", kv_events=True,
                           kv_event_delay_s=0.0, shadow=args.shadow)  # fmt: skip
        s = simulate(trace, make_sim_picker("ttft"), config, "d0").summary()
        rows.append(
            {
                "config": "d0",
                "label": "(d) offline, KV events without delay",
                "ttft_p50": s["ttft_p50"],
                "ttft_p90": s["ttft_p90"],
                "hit_rate": s["hit_rate"],
                "cpu_share": s.get("cpu_hit_rate", 0.0) / s["hit_rate"] if s["hit_rate"] else None,
                "cpu_error": s.get("shadow_abs_error_cpu"),
                "gpu_error": s.get("shadow_abs_error_gpu"),
                "shadow_abs_error": s["shadow_abs_error"],
            }
        )
    return rows


# ---- report ----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def fmt_row(r: dict) -> str:
    return (
        f"TTFT p50 {r['ttft_p50']:.2f} s p90 {r['ttft_p90']:.2f} s, hit {_pct(r['hit_rate'])} "
        f"(CPU share {_pct(r['cpu_share'])}), tier error CPU {_pct(r['cpu_error'])} "
        f"GPU {_pct(r['gpu_error'])}"
    )


def ranking(rows: list[dict], key: str, reverse: bool) -> list[str]:
    ranked = [r for r in rows if r["config"] in RANKED]
    return [r["config"] for r in sorted(ranked, key=lambda r: r[key], reverse=reverse)]


TIES = {"ttft_p90": 0.01, "hit_rate": 0.001}  # offline differences this small are ties
"""TTFT p90: relative (1%); hit rate: absolute (0.1 points)."""


def _order(x: float, y: float, key: str) -> int:
    gap = TIES[key] * (max(abs(x), abs(y)) if key == "ttft_p90" else 1.0)
    return 0 if abs(x - y) <= gap else (1 if x > y else -1)


def compare(live: list[dict], offline: list[dict]) -> dict:
    """Per key, both rankings of (a)-(c) and whether every pair offline orders (not a tie
    there) is ordered the same way live."""
    lv = {r["config"]: r for r in live}
    of = {r["config"]: r for r in offline}
    keys = [k for k in RANKED if k in lv and k in of]
    out = {}
    for key, reverse in (("ttft_p90", False), ("hit_rate", True)):
        pairs = []
        for i, x in enumerate(keys):
            for y in keys[i + 1 :]:
                off = _order(of[x][key], of[y][key], key)
                on = _order(lv[x][key], lv[y][key], key)
                pairs.append({"pair": f"{x}-{y}", "offline": off, "live": on,
                              "agree": off == 0 or on == off})  # fmt: skip
        out[key] = {
            "live": ranking(live, key, reverse),
            "offline": ranking(offline, key, reverse),
            "pairs": pairs,
            "agree": all(p["agree"] for p in pairs),
        }
    return out


def markdown(live: list[dict], offline: list[dict], agreement: dict, args: argparse.Namespace,
             n: int) -> str:  # fmt: skip
    off = {r["config"]: r for r in offline}
    model = args.model
    flat = model.profile is None
    load = f"flat, {model.kv_load_gbps:g} GB/s" if flat else profile_arg(model.profile)
    lines = [
        f"Live tiered KV: {args.workers} sim workers, GPU KV {args.kv_capacity_tokens:,} + CPU "
        f"tier {args.cpu_kv_capacity_tokens:,} tokens ({load}), "
        f"{Path(args.trace).name} ({n} requests), session pacing, {args.speedup:g}x "
        f"(times in modelled s), output <= {args.max_output_tokens} tokens",
        "",
        "| config | TTFT p50 | TTFT p90 | hit (both tiers) | CPU share | CPU-tier err | "
        "GPU-tier err | /metrics blocks / kv_events / cpu_tier / gpu_tier | offline p50 / p90 "
        "| offline hit (CPU share) | offline CPU / GPU err | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|",
    ]
    for r in live:
        o = off.get(r["config"], {})
        m = r["metrics_ratio"]
        ratios = " / ".join(_pct(m.get(k)) for k in ("blocks", "kv_events", "cpu_tier", "gpu_tier"))
        lines.append(
            f"| {r['label']} | {r['ttft_p50']:.2f} | {r['ttft_p90']:.2f} | {_pct(r['hit_rate'])} "
            f"| {_pct(r['cpu_share'])} | {_pct(r['cpu_error'])} | {_pct(r['gpu_error'])} "
            f"| {ratios} | {o.get('ttft_p50', float('nan')):.2f} / "
            f"{o.get('ttft_p90', float('nan')):.2f} | {_pct(o.get('hit_rate'))} "
            f"({_pct(o.get('cpu_share'))}) | {_pct(o.get('cpu_error'))} / "
            f"{_pct(o.get('gpu_error'))} | {r['errors']} |"
        )
    lines.append("")
    for key, name in (
        ("ttft_p90", "TTFT p90 (lowest first)"),
        ("hit_rate", "hit rate (highest first)"),
    ):
        a = agreement[key]
        verdict = ("agree" if a["agree"] else "DISAGREE") if a["pairs"] else "n/a"
        ties = [p["pair"] for p in a["pairs"] if p["offline"] == 0]
        tied = f" (offline ties: {', '.join(ties)})" if ties else ""
        lines.append(
            f"- ranking of (a)-(c) by {name}: live {', '.join(a['live'])}; offline "
            f"{', '.join(a['offline'])}{tied}: {verdict}"
        )
    d0 = off.get("d0")
    if d0 is not None:
        lines.append(
            f"- offline (d) with KV events delivered at once (no delay): per-tier error CPU "
            f"{_pct(d0['cpu_error'])}, GPU {_pct(d0['gpu_error'])} (with the default 50 ms: "
            f"{_pct(off['d']['cpu_error'])}, {_pct(off['d']['gpu_error'])})"
        )
    bar = {r["config"]: r for r in live}
    for key, limit in (("b", 0.05), ("d", 0.02)):
        r = bar.get(key)
        if r is None or r["cpu_error"] is None:
            continue
        worst = max(r["cpu_error"], r["gpu_error"])
        verdict = "meets" if worst <= limit else "MISSES"
        lines.append(
            f"- bar ({key}) per-tier error <= {limit:.0%}: CPU {_pct(r['cpu_error'])}, GPU "
            f"{_pct(r['gpu_error'])}: {verdict}"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's flags; ``model`` the sim workers' model they describe (the worker model's
    flags as ``simulate`` reads them, the flat-model rule included)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--speedup", type=float, default=20.0,
                   help="replay speedup and the sim workers' --time-scale")  # fmt: skip
    add_model_options(p, kv_help="GPU KV tokens per sim worker")
    p.set_defaults(kv_capacity_tokens=262_144, cpu_kv_capacity_tokens=1_048_576)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--requests", "--max-requests", type=int, default=None,
                   help="first N requests only (quick runs)")  # fmt: skip
    p.add_argument("--prompt-mode", choices=("tokens", "text"), default="tokens")
    p.add_argument("--configs", default="a,b,c,d", help="of a,b,c,d")
    p.add_argument(
        "--shadow", choices=("radix", "blocks"), default="radix",
        help="the router's GPU shadow, which splits a hit by tier: radix evicts whole leaves, "
        "as the sim workers' radix cache does (SGLang's rule); blocks evicts block by block "
        "(vLLM's rule)",
    )  # fmt: skip
    p.add_argument("--out", default="bench/results/live_tiers.json")
    p.add_argument("--md", default="out/live_tiers.md")
    p.add_argument("--runs", default="out/live_tiers", help="replay results and router logs")
    args = p.parse_args(argv)
    try:
        args.model = model_config_from_args(args)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = set(args.configs.split(","))
    configs = [c for c in CONFIGS if c.key in chosen]
    out_dir = Path(args.runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(load_trace(args.trace)[: args.requests] if args.requests else load_trace(args.trace))
    started = time.perf_counter()
    offline = run_offline(args, configs)
    for r in offline:
        print(f"  offline {r['label']}: {fmt_row(r)}", file=sys.stderr)
    live = run_live(args, out_dir, configs)
    agreement = compare(live, offline)
    md = markdown(live, offline, agreement, args, n)
    document = {
        "trace": args.trace,
        "requests": n,
        "workers": args.workers,
        "speedup": args.speedup,
        "kv_capacity_tokens": args.kv_capacity_tokens,
        "cpu_kv_capacity_tokens": args.cpu_kv_capacity_tokens,
        "kv_load_gbps": args.model.kv_load_gbps if args.model.profile is None else None,
        "gpu_profile": profile_arg(args.model.profile),
        "max_output_tokens": args.max_output_tokens,
        "prompt_mode": args.prompt_mode,
        "shadow": args.shadow,
        "wall_s": time.perf_counter() - started,
        "live": live,
        "offline": offline,
        "ranking": agreement,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    Path(args.md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.md).write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

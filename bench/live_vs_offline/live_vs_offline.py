"""Live vs offline, policy by policy and request by request (issue 31).

    nice -n 5 .venv/bin/python bench/live_vs_offline/live_vs_offline.py --preset agentic \
        --policies ttft,unified --salts 3   # writes bench/results/live_vs_offline-agentic.{json,md}

For one configuration (trace, workers, speedup, pacing, KV capacity, output cap, requests),
each policy runs live as ``cache-router sweep`` runs it (simulated workers at ``--speedup``,
a fresh router per policy, the workers' caches reset in between, ``traces/live/replay.py``; once
per salt, the policies' order rotated from salt to salt) and offline as ``cache-router
simulate`` runs it on the same requests (the simulator is deterministic: once). The table
gives live TTFT p50/p90 and hit rate (median over salts, and the range) beside the offline
figures; FLIP marks a policy whose rank by TTFT p90 differs live and offline.

Per-request diagnostics (live: the first salt; matched with offline by request id): session
stickiness (share of later turns on their previous turn's worker, session moves), the true
cached tokens live vs offline, TTFT live vs offline and where the p90 tail comes from (first
turns vs continuations, moved vs stayed), and the workers' load over time.

The picker's inputs: every router runs with :func:`instrument_pickers` (this module, loaded
into the router process before ``cache-router serve``), which logs each pick's inputs (per
worker: pending prefill tokens, requests in flight, the learned prefill rate and its sample
count, the session footprint; for ttft its cost per worker) to a JSON-lines file; the
offline simulation logs the same through the same function. ``picker`` in the JSON compares
them. Times in both are the router's own clock: real seconds live (the workers run
``--speedup`` times faster), modelled seconds offline.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from traces.commands.options import cap_output, make_sim_picker  # noqa: E402
from traces.commands.run_sweep import scaled  # noqa: E402
from traces.live.fleet import (  # noqa: E402
    HOST,
    Service,
    free_port,
    reset_caches,
    sim_workers,
    time_scaled_settings,
)
from traces.live.replay import ReplayConfig, replay  # noqa: E402
from traces.sim.simulator import PolicyRun, SimConfig, simulate  # noqa: E402
from traces.sim.worker_model import WorkerModelConfig  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402
from traces.trace.record import TraceRequest  # noqa: E402


def _data(name: str) -> str:
    return str(resources.files("traces") / "data" / name)


PRESETS = {
    # issue 31's first configuration: `cache-router demo` on the Weka agentic sample
    "agentic": dict(
        trace=_data("weka_agentic_sample.jsonl"),
        workers=4,
        speedup=20.0,
        pacing="session",
        kv_capacity_tokens=1_000_000,
        max_output_tokens=64,
        requests=None,
    ),
    # where live and offline agree: the conversation sample, first 1,000 requests
    "conversation": dict(
        trace=_data("conversation_sample.jsonl"),
        workers=4,
        speedup=10.0,
        pacing="open",
        kv_capacity_tokens=1_000_000,
        max_output_tokens=64,
        requests=1000,
    ),
    # not tuned on: the agentic sample on twice the workers (half the load per worker); the
    # conversation preset at twice the time compression (the same modelled load: live, the
    # workers' time scale is the speedup; what changes is how much the router's own real
    # milliseconds weigh)
    "agentic-8": dict(
        trace=_data("weka_agentic_sample.jsonl"),
        workers=8,
        speedup=20.0,
        pacing="session",
        kv_capacity_tokens=1_000_000,
        max_output_tokens=64,
        requests=None,
    ),
    "conversation-20x": dict(
        trace=_data("conversation_sample.jsonl"),
        workers=4,
        speedup=20.0,
        pacing="open",
        kv_capacity_tokens=1_000_000,
        max_output_tokens=64,
        requests=1000,
    ),
}

# ---- the picker's inputs, logged the same way live (in the router) and offline ---------------


def instrument_pickers(path: str) -> None:
    """Wrap ``TTFTPicker.pick`` and ``UnifiedPicker.pick`` to append each pick's inputs to
    ``path`` (JSON lines). Reads only: ttft's costs are computed with ``exact=True`` on the
    same views before the pick (``costs`` changes no state but the footprints' expiry,
    which the pick itself does the same way)."""
    from policies.hits import estimate_hits
    from policies.ttft import TTFTPicker
    from policies.unified import UnifiedPicker

    global _SINK
    if _SINK is not None:
        _SINK.close()
    _SINK = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)

    def wrap(cls: type) -> None:
        original = cls.pick
        if getattr(original, "_lvo", False):
            return

        def pick(self, request, workers):
            views = []
            for w in workers:
                rate = getattr(w, "rate", None)
                footprint = getattr(w, "footprint", None)
                views.append(
                    [
                        w.pending_prefill_tokens,
                        w.num_requests,
                        round(rate.tokens_per_s) if rate is not None else None,
                        rate.samples if rate is not None else 0,
                        footprint.warm_tokens if footprint is not None else 0,
                        len(footprint) if footprint is not None else 0,
                        getattr(w, "kv_capacity_tokens", 0),
                    ]
                )
            clock = max((getattr(w, "footprint", None) or _NoClock).clock for w in workers)
            costs = None
            if isinstance(self, TTFTPicker):
                hits, _ = estimate_hits(request, workers)
                costs = [round(c, 5) for c in self.costs(request, workers, hits, exact=True)]
            chosen = original(self, request, workers)
            _SINK.write(
                json.dumps(
                    {
                        "clock": clock,
                        "t": time.monotonic(),
                        "session": request.session_id,
                        "input": request.input_length,
                        "worker": chosen.worker,
                        "branch": chosen.branch,
                        "hit": chosen.hit_tokens,
                        "best_hit": chosen.best_hit_tokens,
                        "views": views,
                        "costs": costs,
                    }
                )
                + "\n"
            )
            return chosen

        pick._lvo = True
        cls.pick = pick

    wrap(TTFTPicker)
    wrap(UnifiedPicker)


_SINK = None


class _NoClock:
    clock = 0.0


ROUTER_SHIM = """
import os, sys
sys.path.insert(0, os.environ["LVO_BENCH_DIR"])
import live_vs_offline
live_vs_offline.instrument_pickers(os.environ["LVO_PICKLOG"])
from router.cli import main
sys.exit(main())
"""


def time_scaled_env(policy: str, time_scale: float) -> dict[str, str]:
    """:func:`traces.live.fleet.time_scaled_settings` as the router's environment (a user's
    ``CACHE_ROUTER_PICKER_PARAMS`` on top, unchanged)."""
    prior, params = time_scaled_settings(policy, time_scale)
    if prior is None:
        return {}
    env = {"CACHE_ROUTER_PREFILL_TOKENS_PER_S": repr(prior)}
    if params:
        params |= json.loads(os.environ.get("CACHE_ROUTER_PICKER_PARAMS") or "{}")
        env["CACHE_ROUTER_PICKER_PARAMS"] = json.dumps(params)
    return env


def start_router(
    workers: Sequence[str], policy: str, picklog: str, time_scale: float = 1.0
) -> Service:
    """``cache-router serve`` with ``policy`` in front of ``workers``, its picks logged;
    ``time_scale``: see :func:`time_scaled_env`."""
    port = free_port()
    args = ["serve", "--host", HOST, "--port", str(port), "--policy", policy, "--worker"]
    env = {**os.environ, "LVO_BENCH_DIR": str(Path(__file__).parent), "LVO_PICKLOG": picklog}
    env |= time_scaled_env(policy, time_scale)
    process = subprocess.Popen(
        [sys.executable, "-c", ROUTER_SHIM, *args, *workers],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    service = Service(f"router-{policy}", f"http://{HOST}:{port}", process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(service.url + "/health", timeout=1.0).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    service.stop()
    raise RuntimeError("router did not become ready")


def read_picklog(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- runs ------------------------------------------------------------------------------------


def select(args: argparse.Namespace) -> list[TraceRequest]:
    trace = load_trace(args.trace)
    if args.requests is not None:
        trace = trace[: args.requests]
    if args.max_output_tokens:  # replay caps them when sending; offline gets them capped
        trace = cap_output(trace, args.max_output_tokens)
    return trace


def sim_config(args: argparse.Namespace) -> SimConfig:
    """``simulate``'s configuration for these options (as ``cache-router demo`` runs it)."""
    return SimConfig(
        workers=args.workers,
        worker=WorkerModelConfig(kv_capacity_tokens=args.kv_capacity_tokens),
        pacing=args.pacing,
        # the router's reading of bodies: real MB/s, modelled time runs `speedup` times slower
        ingest_bytes_per_s=args.ingest_mb_per_s * 1e6 / args.speedup,
        ingest_window_bytes=args.ingest_window_kb * 1e3,
    )


def simulate_one(trace: Sequence[TraceRequest], policy: str, config: SimConfig) -> PolicyRun:
    """One offline run, its pick log going nowhere."""
    instrument_pickers(os.devnull)
    return simulate(trace, make_sim_picker(policy), config, policy)


def run_offline(trace: list[TraceRequest], args: argparse.Namespace, logdir: Path) -> dict:
    config = sim_config(args)
    capped = trace
    out = {}
    for policy in args.policies:
        log = str(logdir / f"offline-{policy}.jsonl")
        instrument_pickers(log)
        run = simulate(capped, make_sim_picker(policy), config, policy)
        out[policy] = {"run": run, "picks": read_picklog(log), "branches": dict(run.branches)}
    return out


def run_live(trace: list[TraceRequest], args: argparse.Namespace, logdir: Path) -> dict:
    """{policy: [per salt: {run, picks, branches, errors, hit_rate, workers}]}."""
    out: dict[str, list[dict]] = defaultdict(list)
    sim_args = ["--time-scale", str(args.speedup), "--kv-capacity-tokens"]
    sim_args.append(str(args.kv_capacity_tokens))
    for s in range(args.salts):
        salt = args.salt + s
        with sim_workers(args.workers, sim_args) as sims:
            workers = [w.url for w in sims]
            k = s % len(args.policies)  # each salt starts with another policy: no order effect
            for policy in [*args.policies[k:], *args.policies[:k]]:
                if not reset_caches(workers):
                    raise RuntimeError("sim workers refused a cache reset")
                log = str(logdir / f"live-{policy}-salt{salt}.jsonl")
                scale = args.speedup if args.router_time_scale else 1.0
                service = start_router(workers, policy, log, scale)
                try:
                    cfg = ReplayConfig(
                        url=service.url,
                        speedup=args.speedup,
                        pacing=args.pacing,
                        prompt_mode=args.prompt_mode,
                        salt=salt,
                        max_output_tokens=args.max_output_tokens,
                        worker_urls=tuple(workers),
                    )
                    started = time.perf_counter()
                    outcome = asyncio.run(replay(trace, cfg, policy))
                    wall = time.perf_counter() - started
                    data = httpx.get(service.url + "/dashboard/data", timeout=10).json()
                finally:
                    service.stop()
                scaled(outcome, args.speedup)
                out[policy].append(
                    {
                        "salt": salt,
                        "run": outcome.run,
                        "served_by": outcome.served_by,
                        "workers": workers,
                        "errors": outcome.errors,
                        "hit_rate": outcome.worker_hit_rate,
                        "branches": data.get("decisions", {}),
                        "picks": read_picklog(log),
                        "wall_s": wall,
                    }
                )
                print(
                    f"  live {policy} salt {salt}: {wall:.0f} s, TTFT p90 "
                    f"{outcome.run.summary()['ttft_p90']:.2f} s, errors {outcome.errors}",
                    file=sys.stderr,
                )
    return out


# ---- summaries -------------------------------------------------------------------------------


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def ttft(run: PolicyRun) -> np.ndarray:
    return run.first_token - run.arrival


def rank(values: dict[str, float]) -> list[str]:
    return sorted(values, key=values.__getitem__)


def table(live: dict, offline: dict, policies: Sequence[str]) -> tuple[list[dict], str]:
    rows = []
    for policy in policies:
        salts = live[policy]
        p50 = [_pct(ttft(s["run"]), 50) for s in salts]
        p90 = [_pct(ttft(s["run"]), 90) for s in salts]
        hit = [s["hit_rate"] if s["hit_rate"] is not None else float("nan") for s in salts]
        off = offline[policy]["run"].summary()
        rows.append(
            {
                "policy": policy,
                "live_ttft_p50": statistics.median(p50),
                "live_ttft_p50_range": [min(p50), max(p50)],
                "live_ttft_p90": statistics.median(p90),
                "live_ttft_p90_range": [min(p90), max(p90)],
                "live_ttft_p90_salts": p90,
                "live_hit_rate": statistics.median(hit),
                "live_hit_rate_range": [min(hit), max(hit)],
                "live_hit_rate_salts": hit,
                "live_errors": sum(s["errors"] for s in salts),
                "offline_ttft_p50": off["ttft_p50"],
                "offline_ttft_p90": off["ttft_p90"],
                "offline_hit_rate": off["hit_rate"],
            }
        )
    live_rank = rank({r["policy"]: r["live_ttft_p90"] for r in rows})
    off_rank = rank({r["policy"]: r["offline_ttft_p90"] for r in rows})
    for r in rows:
        r["live_rank"] = live_rank.index(r["policy"]) + 1
        r["offline_rank"] = off_rank.index(r["policy"]) + 1
        r["flip"] = r["live_rank"] != r["offline_rank"]
    lines = [
        "| policy | live TTFT p50 s | live TTFT p90 s (range) | live hit rate (range) "
        "| offline TTFT p50 s | offline TTFT p90 s | offline hit rate | rank live/offline |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lo, hi = r["live_ttft_p90_range"]
        hlo, hhi = r["live_hit_rate_range"]
        flip = " FLIP" if r["flip"] else ""
        lines.append(
            f"| {r['policy']} | {r['live_ttft_p50']:.2f} | {r['live_ttft_p90']:.2f} "
            f"({lo:.2f}-{hi:.2f}) | {r['live_hit_rate']:.1%} ({hlo:.1%}-{hhi:.1%}) "
            f"| {r['offline_ttft_p50']:.2f} | {r['offline_ttft_p90']:.2f} "
            f"| {r['offline_hit_rate']:.1%} | {r['live_rank']}/{r['offline_rank']}{flip} |"
        )
    return rows, "\n".join(lines)


def salt_groups(rows: list[dict], size: int = 3) -> tuple[list[dict], str]:
    """The first policy (the default) in each group of ``size`` consecutive salts, read as
    issue 31's bar reads one run: lowest median TTFT p90 of the group, and its median hit
    rate's gap to the best one's. Groups that disagree show how far one 3-salt median can be
    trusted; empty with fewer than two groups or no other policy."""
    salts = len(rows[0]["live_ttft_p90_salts"])
    if salts < 2 * size or len(rows) < 2:
        return [], ""
    default = rows[0]["policy"]
    groups = []
    for start in range(0, salts - size + 1, size):
        part = slice(start, start + size)
        p90 = {r["policy"]: statistics.median(r["live_ttft_p90_salts"][part]) for r in rows}
        hit = {r["policy"]: statistics.median(r["live_hit_rate_salts"][part]) for r in rows}
        best = min(p90, key=p90.__getitem__)
        groups.append(
            {
                "salts": [start, start + size - 1],
                "best_p90": best,
                "default_p90": p90[default],
                "best_other_p90": min(v for k, v in p90.items() if k != default),
                "default_hit_gap": max(hit.values()) - hit[default],
            }
        )
    lines = [
        f"{default} by groups of {size} salts (lowest median TTFT p90; hit-rate gap to the best):",
        "",
        "| salts | lowest p90 | p90 default / best other s | hit gap pts |",
        "|---|---|---|---:|",
    ]
    for g in groups:
        lo, hi = g["salts"]
        lines.append(
            f"| {lo}-{hi} | {g['best_p90']} | {g['default_p90']:.2f} / {g['best_other_p90']:.2f} "
            f"| {100 * g['default_hit_gap']:.1f} |"
        )
    return groups, "\n".join(lines)


def session_shape(trace: Sequence[TraceRequest]) -> tuple[np.ndarray, np.ndarray]:
    """Per request: the index of its session's previous request (-1: first turn), and
    its turn number within the session (0-based, trace order)."""
    last: dict[str, int] = {}
    prev = np.full(len(trace), -1)
    turn = np.zeros(len(trace), dtype=int)
    count: Counter = Counter()
    for i, r in enumerate(trace):
        prev[i] = last.get(r.session_id, -1)
        turn[i] = count[r.session_id]
        count[r.session_id] += 1
        last[r.session_id] = i
    return prev, turn


def stickiness(worker: np.ndarray, prev: np.ndarray) -> dict:
    later = prev >= 0
    stayed = worker[later] == worker[prev[later]]
    return {
        "continuations": int(later.sum()),
        "stayed_share": float(stayed.mean()) if later.any() else float("nan"),
        "moves": int((~stayed).sum()),
    }


def moved_mask(worker: np.ndarray, prev: np.ndarray) -> np.ndarray:
    moved = np.zeros(len(worker), dtype=bool)
    later = prev >= 0
    moved[later] = worker[later] != worker[prev[later]]
    return moved


def tail(run: PolicyRun, prev: np.ndarray) -> dict:
    """Which requests make the TTFT p90 tail: first turns vs continuations, moved vs stayed,
    and their uncached (true) prompt tokens."""
    t = ttft(run)
    p90 = _pct(t, 90)
    top = t >= p90
    first = prev < 0
    moved = moved_mask(run.worker, prev)
    stayed = ~first & ~moved
    uncached = run.input_length - run.cached

    def group(mask: np.ndarray) -> dict:
        return {
            "n": int(mask.sum()),
            "in_tail": int((mask & top).sum()),
            "ttft_mean": float(t[mask].mean()) if mask.any() else float("nan"),
            "ttft_p90": _pct(t[mask], 90),
            "uncached_mean": float(uncached[mask].mean()) if mask.any() else float("nan"),
        }

    return {
        "p90": p90,
        "tail_n": int(top.sum()),
        "first": group(first),
        "stayed": group(stayed),
        "moved": group(moved),
        "tail_uncached_mean": float(uncached[top].mean()),
        "all_uncached_mean": float(uncached.mean()),
    }


def load_balance(run: PolicyRun, workers: int, points: int = 400) -> dict:
    """Requests per worker, and in flight per worker over time (from arrival to finish)."""
    per = np.bincount(run.worker, minlength=workers)
    grid = np.linspace(run.arrival.min(), run.finish.max(), points)
    inflight = np.zeros((points, workers))
    for w in range(workers):
        sel = run.worker == w
        a, f = np.sort(run.arrival[sel]), np.sort(run.finish[sel])
        inflight[:, w] = np.searchsorted(a, grid, "right") - np.searchsorted(f, grid, "right")
    busy = inflight.sum(axis=1) > 0
    spread = inflight.max(axis=1) - inflight.min(axis=1)
    # uncached prompt tokens (prefill work) per worker: the work each had to do
    work = np.bincount(run.worker, weights=run.input_length - run.cached, minlength=workers)
    return {
        "requests_per_worker": per.tolist(),
        "requests_max_over_mean": float(per.max() / per.mean()),
        "prefill_work_per_worker": [int(x) for x in work],
        "prefill_work_max_over_mean": float(work.max() / work.mean()) if work.mean() else 0.0,
        "inflight_max_minus_min_mean": float(spread[busy].mean()) if busy.any() else 0.0,
        "inflight_mean": float(inflight[busy].sum(axis=1).mean()) if busy.any() else 0.0,
    }


def session_turn_index(picks: list[dict]) -> list[tuple[str, int]]:
    """Each logged pick's (session, k): its session's k-th pick, to match the trace."""
    count: Counter = Counter()
    keys = []
    for p in picks:
        keys.append((p["session"], count[p["session"]]))
        count[p["session"]] += 1
    return keys


def picker_inputs(picks: list[dict], trace: Sequence[TraceRequest], prev: np.ndarray) -> dict:
    """The picker's view, summarized: learned rates, pending prefill, costs, by branch."""
    if not picks:
        return {}
    views = np.array([[v[:4] for v in p["views"]] for p in picks], dtype=float)
    rates = views[:, :, 2]
    pending = views[:, :, 0]
    n = len(picks)
    idx = {(r.session_id, k): i for i, (r, k) in enumerate(zip(trace, _turns(trace), strict=True))}
    keys = session_turn_index(picks)
    req = np.array([idx.get(k, -1) for k in keys])
    # the router's input length vs the trace's (text prompts: the router's approximation)
    matched = req >= 0
    router_len = np.array([p["input"] for p in picks], dtype=float)
    trace_len = np.array([trace[i].input_length if i >= 0 else np.nan for i in req], dtype=float)
    out = {
        "picks": n,
        "matched": int(matched.sum()),
        "input_router_over_trace_mean": float(np.nanmean(router_len / trace_len)),
        "learned_rate_median_per_worker": np.median(rates, axis=0).round().tolist(),
        "learned_rate_final_per_worker": rates[-1].tolist(),
        "learned_rate_quartiles_all": np.percentile(rates, [10, 50, 90]).round().tolist(),
        "rate_samples_final_per_worker": views[-1, :, 3].astype(int).tolist(),
        "pending_prefill_mean": float(pending.sum(axis=1).mean()),
        "pending_prefill_p90": _pct(pending.sum(axis=1), 90),
        "pending_on_chosen_mean": float(np.mean([p["views"][p["worker"]][0] for p in picks])),
        "est_hit_over_input_chosen": float(np.mean([p["hit"] / max(1, p["input"]) for p in picks])),
        "branches": dict(Counter(p["branch"] for p in picks)),
    }
    costs = [p["costs"] for p in picks if p["costs"]]
    if costs:
        c = np.array(costs, dtype=float)
        c[~np.isfinite(c)] = np.nan
        best = np.nanmin(c, axis=1)
        second = np.sort(c, axis=1)[:, 1]
        chosen = np.array([p["costs"][p["worker"]] for p in picks if p["costs"]], dtype=float)
        out |= {
            "cost_best_p50": _pct(best, 50),
            "cost_best_p90": _pct(best, 90),
            "cost_gap_second_minus_best_p50": _pct(second - best, 50),
            "chosen_over_best_mean": float(np.nanmean(chosen / np.maximum(best, 1e-9))),
        }
    # first turns: where did new sessions go (balance / cost / tie) and how many workers
    # looked equal
    firsts = [p for p, i in zip(picks, req, strict=True) if i >= 0 and prev[i] < 0]
    out["first_turn_branches"] = dict(Counter(p["branch"] for p in firsts))
    out["first_turn_workers"] = dict(Counter(p["worker"] for p in firsts))
    return out


def _turns(trace: Sequence[TraceRequest]) -> list[int]:
    return session_shape(trace)[1].tolist()


def per_request(
    live: dict, offline: dict, trace: Sequence[TraceRequest], args: argparse.Namespace
) -> dict:
    prev, _ = session_shape(trace)
    arrivals = np.array([r.arrival for r in trace])
    workers, speedup = args.workers, args.speedup
    # replays in the live pick order or at the live pick times: the router has read those
    # bodies already, so no ingest model (it would re-sort the burst by body size)
    config = dataclasses.replace(sim_config(args), ingest_bytes_per_s=0.0)
    out = {}
    for policy, salts in live.items():
        off = offline[policy]["run"]
        entry: dict = {
            "offline": {
                "stickiness": stickiness(off.worker, prev),
                "tail": tail(off, prev),
                "load": load_balance(off, workers),
                "picker": picker_inputs(offline[policy]["picks"], trace, prev),
                "branches": offline[policy]["branches"],
                "burst": burst_order(trace, offline[policy]["picks"]),
            },
            "live": [],
        }
        for k, s in enumerate(salts):
            run = s["run"]
            item: dict = {"salt": s["salt"], "branches": s["branches"]}
            if s["errors"] or run.requests != len(trace):
                item["skipped"] = f"{s['errors']} errors: no request-by-request match"
                entry["live"].append(item)
                continue
            item["stickiness"] = stickiness(run.worker, prev)
            item["load"] = load_balance(run, len(s["served_by"]))
            item["tail"] = tail(run, prev)
            item["picker"] = picker_inputs(s["picks"], trace, prev)
            item["burst"] = burst_order(trace, s["picks"])
            for mode in ("order", "times"):
                reordered = live_order_trace(trace, s["picks"], speedup, mode)
                if reordered is not None:
                    rerun_run = simulate_one(reordered, policy, config)
                    rerun = rerun_run.summary()
                    item[f"offline_with_live_{mode}"] = {
                        k: rerun[k] for k in ("ttft_p50", "ttft_p90", "hit_rate")
                    }
                    # same sends, same picks (mostly): what is left is execution
                    delta = ttft(run) - ttft(rerun_run)
                    first = prev < 0
                    burst = first & (arrivals == arrivals[0])  # the opening burst
                    item[f"offline_with_live_{mode}"] |= {
                        "same_partition_first_turns": _same_partition(
                            run.worker[first], rerun_run.worker[first]
                        ),
                        "first_turn_ttft_live_minus_this_mean": float(delta[first].mean()),
                        "first_turn_ttft_live_minus_this_p10_p50_p90": [
                            _pct(delta[first], q) for q in (10, 50, 90)
                        ],
                        "continuation_ttft_live_minus_this_mean": float(delta[~first].mean()),
                        "burst_same_partition": _same_partition(
                            run.worker[burst], rerun_run.worker[burst]
                        ),
                        "burst_ttft_live_minus_this_p10_p50_p90": [
                            _pct(delta[burst], q) for q in (10, 50, 90)
                        ],
                    }
            reordered = live_order_trace(trace, s["picks"], speedup, "times")
            if reordered is not None:
                item["ablations_with_live_times"] = {
                    v: simulate_as_live(reordered, policy, config, speedup, v) for v in ABLATIONS
                }
            if k == 0:  # request by request against offline
                diff = np.abs(run.cached - off.cached)
                big = diff > np.maximum(0.1 * run.input_length, 2048)
                tl, to = ttft(run), ttft(off)
                first = prev < 0
                item["vs_offline"] = {
                    "cached_mean_abs_diff": float(diff.mean()),
                    "cached_large_diff_share": float(big.mean()),
                    "cached_live_minus_offline_mean": float((run.cached - off.cached).mean()),
                    "ttft_live_minus_offline_p10_p50_p90": [_pct(tl - to, q) for q in (10, 50, 90)],
                    "ttft_live_over_offline_median": float(np.median(tl / np.maximum(to, 1e-3))),
                    "ttft_first_turns_live_offline_mean": [
                        float(tl[first].mean()),
                        float(to[first].mean()),
                    ],
                    "ttft_continuations_live_offline_mean": [
                        float(tl[~first].mean()),
                        float(to[~first].mean()),
                    ],
                    "same_worker_group_share": _same_partition(run.worker, off.worker),
                    "tail_overlap": float(
                        ((tl >= _pct(tl, 90)) & (to >= _pct(to, 90))).sum()
                        / max(1, (tl >= _pct(tl, 90)).sum())
                    ),
                }
            entry["live"].append(item)
        out[policy] = entry
    return out


def live_order_trace(
    trace: Sequence[TraceRequest], picks: list[dict], speedup: float, mode: str
) -> list[TraceRequest] | None:
    """The trace with its first turns sent as the live router received them: ``order``, at
    their trace times but tied requests in the live pick order (a microsecond apart);
    ``times``, at the live pick times (real seconds since the first pick, times
    ``speedup``). Later turns keep session pacing. None if the picks do not match."""
    from dataclasses import replace

    prev, turns = session_shape(trace)
    idx = {(r.session_id, k): i for i, (r, k) in enumerate(zip(trace, turns, strict=True))}
    keys = session_turn_index(picks)
    t0 = picks[0]["t"] if picks else 0.0
    out = list(trace)
    for pos, (key, p) in enumerate(zip(keys, picks, strict=True)):
        i = idx.get(key)
        if i is None:
            return None
        if prev[i] >= 0:
            continue
        if mode == "order":
            arrival = trace[i].arrival + pos * 1e-6
        else:
            arrival = max(trace[i].arrival, (p["t"] - t0) * speedup)
        out[i] = replace(trace[i], arrival=arrival)
    return out


ABLATIONS = ("as offline", "live clock", "live rate", "live clock + rate")


def simulate_as_live(
    trace: Sequence[TraceRequest], policy: str, config: SimConfig, speedup: float, variant: str
) -> dict:
    """Offline, with what the live router's clock does to it (``variant``): ``live clock``:
    the router's windows (ttft's ``live_s``, the session footprint's horizon) count real
    seconds, ``speedup`` times as many modelled ones; ``live rate``: the learned prefill
    rate samples real TTFT, ``speedup`` times shorter than modelled (it climbs from the
    configured prior toward its bound as samples come in)."""
    from policies.registry import make_picker
    from router.cache.workload import PrefillRate, SessionFootprint

    clock = variant in ("live clock", "live clock + rate")
    rate = variant in ("live rate", "live clock + rate")
    defaults = SessionFootprint.__init__.__defaults__
    observe = PrefillRate.observe
    try:
        if clock:
            SessionFootprint.__init__.__defaults__ = (defaults[0] * speedup,)
        if rate:

            def scaled_observe(self, work_tokens, ttft_s):
                observe(self, work_tokens, ttft_s / speedup)

            PrefillRate.observe = scaled_observe
        params = {"live_s": 60.0 * speedup} if clock and policy == "ttft" else {}
        instrument_pickers(os.devnull)
        picker = make_picker(policy, **params) if policy != "oracle" else make_sim_picker(policy)
        run = simulate(trace, picker, config, policy)
    finally:
        SessionFootprint.__init__.__defaults__ = defaults
        PrefillRate.observe = observe
    prev, _ = session_shape(trace)
    summary = run.summary()
    return {
        "ttft_p50": summary["ttft_p50"],
        "ttft_p90": summary["ttft_p90"],
        "hit_rate": summary["hit_rate"],
        "stayed_share": stickiness(run.worker, prev)["stayed_share"],
        "branches": dict(run.branches),
    }


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation of ``a`` and ``b`` (ties ranked in their order)."""

    def ranks(x: np.ndarray) -> np.ndarray:
        return np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(float)

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def burst_order(trace: Sequence[TraceRequest], picks: list[dict]) -> dict:
    """The first turns that share the trace's first arrival time (the opening burst): the
    rank correlation of their pick order with their prompt length (offline: the trace
    order), and the mean length of the first and last third picked."""
    prev, turns = session_shape(trace)
    idx = {(r.session_id, k): i for i, (r, k) in enumerate(zip(trace, turns, strict=True))}
    t_first = trace[0].arrival
    burst = [
        idx[k] for k in session_turn_index(picks)
        if k in idx and prev[idx[k]] < 0 and trace[idx[k]].arrival == t_first
    ]  # fmt: skip
    lengths = np.array([trace[i].input_length for i in burst], dtype=float)
    if len(lengths) < 3:
        return {}
    third = len(lengths) // 3
    spread = [p["t"] for p, k in zip(picks, session_turn_index(picks), strict=True) if k in idx]
    return {
        "requests": len(burst),
        "spearman_pick_order_vs_length": spearman(np.arange(len(lengths)), lengths),
        "first_third_mean_len": float(lengths[:third].mean()),
        "last_third_mean_len": float(lengths[-third:].mean()),
        "pick_span_real_s": float(spread[len(burst) - 1] - spread[0]) if spread else 0.0,
    }


def _same_partition(a: np.ndarray, b: np.ndarray) -> float:
    """Share of request pairs that are together (same worker) in both runs or apart in
    both (worker indices differ between runs, so compare co-location)."""
    same_a = a[:, None] == a[None, :]
    same_b = b[:, None] == b[None, :]
    return float((same_a == same_b).mean())


def diagnostics_md(diag: dict) -> str:
    lines = [
        "| policy | run | stayed | moves | req max/mean | prefill work max/mean "
        "| in-flight spread | tail: first/stayed/moved | TTFT p90 first/stayed/moved s |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for policy, entry in diag.items():
        runs = [("offline", entry["offline"])]
        runs += [(f"live salt {x['salt']}", x) for x in entry["live"] if "tail" in x]
        for label, x in runs:
            st, ld, tl = x["stickiness"], x["load"], x["tail"]
            lines.append(
                f"| {policy} | {label} | {st['stayed_share']:.1%} | {st['moves']} "
                f"| {ld['requests_max_over_mean']:.2f} | {ld['prefill_work_max_over_mean']:.2f} "
                f"| {ld['inflight_max_minus_min_mean']:.2f} "
                f"| {tl['first']['in_tail']}/{tl['stayed']['in_tail']}/{tl['moved']['in_tail']} "
                f"| {tl['first']['ttft_p90']:.1f}/{tl['stayed']['ttft_p90']:.1f}"
                f"/{tl['moved']['ttft_p90']:.1f} |"
            )
    lines += [
        "",
        "| policy | run | learned rate p10/p50/p90 tok/s | rate samples (final) "
        "| pending prefill mean | first-turn branches | branches |",
        "|---|---|---|---|---:|---|---|",
    ]
    for policy, entry in diag.items():
        runs = [("offline", entry["offline"])]
        runs += [(f"live salt {x['salt']}", x) for x in entry["live"] if "picker" in x]
        for label, x in runs:
            p = x["picker"]
            if not p:
                continue
            q = "/".join(f"{v:,.0f}" for v in p["learned_rate_quartiles_all"])
            lines.append(
                f"| {policy} | {label} | {q} | {p['rate_samples_final_per_worker']} "
                f"| {p['pending_prefill_mean']:,.0f} | {_fmt(p['first_turn_branches'])} "
                f"| {_fmt(p['branches'])} |"
            )
    lines += [
        "",
        "| policy | run | opening burst: requests, pick order vs length (Spearman) "
        "| mean length first/last third | offline with live order: TTFT p50/p90 s "
        "| offline with live times: TTFT p50/p90 s | same first-turn placement "
        "| first-turn TTFT live minus it, mean (p10/p50/p90) s "
        "| opening burst: same placement, TTFT live minus it p10/p50/p90 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for policy, entry in diag.items():
        runs = [("offline", entry["offline"])]
        runs += [(f"live salt {x['salt']}", x) for x in entry["live"] if "burst" in x]
        for label, x in runs:
            b = x.get("burst") or {}
            if not b:
                continue
            cells = []
            for mode in ("order", "times"):
                r = x.get(f"offline_with_live_{mode}")
                cells.append(f"{r['ttft_p50']:.2f}/{r['ttft_p90']:.2f}" if r else "")
            lines.append(
                f"| {policy} | {label} | {b['requests']}, "
                f"{b['spearman_pick_order_vs_length']:+.2f} "
                f"| {b['first_third_mean_len']:,.0f}/{b['last_third_mean_len']:,.0f} "
                f"| {cells[0]} | {cells[1]} | {_delta(x)} |"
            )
    lines += [
        "",
        "Offline at the live send times of the first turns, with the live router's clock "
        "effects added (TTFT p90 s / stayed share / affinity_moved):",
        "",
        "| policy | run | live TTFT p90 | " + " | ".join(ABLATIONS) + " |",
        "|---|---|---:|" + "---|" * len(ABLATIONS),
    ]
    for policy, entry in diag.items():
        for x in entry["live"]:
            ab = x.get("ablations_with_live_times")
            if not ab:
                continue
            cells = [
                f"{a['ttft_p90']:.2f} / {a['stayed_share']:.0%} / "
                f"{a['branches'].get('affinity_moved', 0)}"
                for a in (ab[v] for v in ABLATIONS)
            ]
            lines.append(
                f"| {policy} | live salt {x['salt']} | {x['tail']['p90']:.2f} | "
                + " | ".join(cells)
                + " |"
            )
    vs = [(policy, e["live"][0]["vs_offline"]) for policy, e in diag.items()
          if e["live"] and "vs_offline" in e["live"][0]]  # fmt: skip
    if vs:
        lines += [
            "",
            "| policy | cached |live-offline| mean | large diff share | TTFT live-offline "
            "p10/p50/p90 s | TTFT first turns live/offline | continuations live/offline |",
            "|---|---:|---:|---|---|---|",
        ]
        for policy, v in vs:
            d = "/".join(f"{x:.2f}" for x in v["ttft_live_minus_offline_p10_p50_p90"])
            f = "/".join(f"{x:.2f}" for x in v["ttft_first_turns_live_offline_mean"])
            c = "/".join(f"{x:.2f}" for x in v["ttft_continuations_live_offline_mean"])
            lines.append(
                f"| {policy} | {v['cached_mean_abs_diff']:,.0f} "
                f"| {v['cached_large_diff_share']:.1%} | {d} | {f} | {c} |"
            )
    return "\n".join(lines)


def _delta(x: dict) -> str:
    r = x.get("offline_with_live_times")
    if not r:
        return " |  | "
    q = "/".join(f"{v:+.2f}" for v in r["first_turn_ttft_live_minus_this_p10_p50_p90"])
    b = "/".join(f"{v:+.2f}" for v in r.get("burst_ttft_live_minus_this_p10_p50_p90", ()))
    return (
        f"{r['same_partition_first_turns']:.0%} "
        f"| {r['first_turn_ttft_live_minus_this_mean']:+.2f} ({q}) "
        f"| {r.get('burst_same_partition', float('nan')):.0%}, {b}"
    )


def _fmt(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and x != x:
        return None
    return x


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="agentic")
    p.add_argument("--trace", default=None)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--speedup", type=float, default=None)
    p.add_argument("--pacing", choices=("open", "session"), default=None)
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--max-output-tokens", type=int, default=None)
    p.add_argument("--requests", type=int, default=None, help="first N requests")
    p.add_argument("--policies", default="ttft,unified,sticky,lmetric")
    p.add_argument("--salts", type=int, default=3, help="live runs per policy")
    p.add_argument("--salt", type=int, default=0, help="first salt")
    p.add_argument("--prompt-mode", choices=("text", "tokens"), default="text")
    p.add_argument("--offline-only", action="store_true")
    p.add_argument("--ingest-mb-per-s", type=float, default=0.0,
                   help="offline: the router reads bodies at this many real MB/s, shared "
                   "(0: picked when sent; `serve` on the 2-core VM: about 100)")  # fmt: skip
    p.add_argument(
        "--ingest-window-kb",
        type=float,
        default=0.0,
        help="offline: a body this small is in at once when sent (socket buffers; measured "
        "here: 128, bench/live_vs_offline/ingest_window.py)",
    )
    p.add_argument(
        "--router-time-scale",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give the router the workers' time scale: the prefill rate's prior and ttft's "
        "times in the workers' seconds (default: on)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="writes OUT.json and OUT.md (default: bench/results/live_vs_offline-PRESET)",
    )
    p.add_argument("--logs", default=None, help="folder for the pick logs (default: a tmp dir)")
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    trace = select(args)
    logdir = Path(args.logs or tempfile.mkdtemp(prefix="lvo-"))
    logdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"{len(trace)} requests; pick logs in {logdir}", file=sys.stderr)
    offline = run_offline(trace, args, logdir)
    for policy, o in offline.items():
        s = o["run"].summary()
        print(f"  offline {policy}: TTFT p90 {s['ttft_p90']:.2f} s", file=sys.stderr)
    if args.offline_only:
        return 0
    live = run_live(trace, args, logdir)
    rows, md = table(live, offline, args.policies)
    groups, groups_md = salt_groups(rows)
    if groups_md:
        md += "\n\n" + groups_md
    diag = per_request(live, offline, trace, args)
    config = {k: getattr(args, k) for k in PRESETS["agentic"]} | {
        "preset": args.preset,
        "policies": args.policies,
        "salts": args.salts,
        "prompt_mode": args.prompt_mode,
        "router_time_scale": args.router_time_scale,
        "wall_s": time.perf_counter() - started,
    }
    document = {"config": config, "table": rows, "salt_groups": groups, "diagnostics": diag}
    out = Path(args.out or ROOT / "bench" / "results" / f"live_vs_offline-{args.preset}")
    out.with_suffix(".json").write_text(json.dumps(_jsonable(document), indent=1) + "\n")
    text = f"{args.preset}: {json.dumps(config)}\n\n{md}\n\n{diagnostics_md(diag)}\n"
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

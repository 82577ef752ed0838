#!/usr/bin/env python3
"""Real-worker benchmark: a shared-prefix multi-turn chat workload through the router, once
per policy, against running vLLM workers; the hit rates are the workers' own.

For each run: the workers' prefix caches are reset (``POST /reset_prefix_cache``, vLLM with
``VLLM_SERVER_DEV_MODE=1``) and every prompt carries a run tag, so no run reuses another's
blocks; a fresh ``cache-router serve`` starts with the run's policy and options; the sessions
are replayed closed-loop (each turn waits for the previous answer) with ``--concurrency``
sessions at a time, streamed, so the client measures time to first token. Reported per run:

- ``worker_hit_rate``: Δ``vllm:prefix_cache_hits_total`` / Δ``vllm:prefix_cache_queries_total``
  summed over the workers (their own counters, read before and after);
- ``reported_hit_rate``: Σ ``cached_tokens`` the responses reported / Σ prompt tokens;
- ``ttft_p50_s`` / ``ttft_p90_s``: client time to the first streamed token;
- ``requests_per_worker`` and ``imbalance`` = max / mean of those counts;
- ``shadow_error``: per shadow (``blocks``, ``radix``, ``kv_events``), Σ |estimated - reported
  cached tokens| / Σ prompt tokens over the requests it was scored on (the router's
  ``GET /workers`` accuracy), and ``metrics_shadow_error_ratio``, the same from its
  ``/metrics`` (``cache_router_shadow_error_ratio``).

The workload (:class:`Workload`): ``system_prompts`` shared system prompts, ``sessions``
conversations of ``turns`` turns; each turn adds a user message and, after the answer, a
scripted assistant message (the tiny model's own output is noise, and scripted turns keep the
prompts identical across policies). Text comes from this Python's standard-library sources,
so prompts are deterministic and need no download; about 3.4 characters a token with the tiny
model's tokenizer.

    python bench/real_workers/bench.py --worker http://127.0.0.1:28101 ... \\
        --tokenizer /tmp/realworker/tiny-llama --out out/real_bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from router.fleet.worker_truth import parse_worker_metrics  # noqa: E402
from traces.live.fleet import reset_caches, router, scrape  # noqa: E402

CHARS_PER_TOKEN = 3.4
WORKER_HEADER = "x-cache-router-worker"


@dataclass(frozen=True)
class Workload:
    """The shared-prefix multi-turn chat workload (token counts are approximate)."""

    sessions: int = 24
    system_prompts: int = 3
    system_tokens: int = 120
    turns: int = 5
    user_tokens: int = 60
    assistant_tokens: int = 400
    concurrency: int = 3
    max_tokens: int = 4
    think_s: float = 0.15  # mean; uniform 0..2x: shuffles the sessions' order, or round robin
    # turns accidentally sticky when the sessions in flight (3) match the workers (3)
    seed: int = 0
    document_tokens: int = 0  # > 0: each session opens with its own document, not a shared prompt


@dataclass
class RunSpec:
    """One bench run: a policy and the router's extra options."""

    name: str
    policy: str
    router_args: list[str] = field(default_factory=list)


def corpus() -> str:
    """Standard-library sources, deterministic for a given Python installation."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:80]
    return "".join(p.read_text(errors="ignore") for p in files)


def build_sessions(cfg: Workload, tag: str, text: str) -> list[dict[str, Any]]:
    """Sessions: a system prompt (shared) and scripted (user, assistant) turns."""
    rng = random.Random(cfg.seed)

    def snippet(tokens: int) -> str:
        chars = int(tokens * CHARS_PER_TOKEN * rng.uniform(0.6, 1.4))
        start = rng.randrange(0, len(text) - chars)
        return text[start : start + chars]

    systems = [
        f"# run {tag} system prompt {k}\n" + snippet(cfg.system_tokens)
        for k in range(cfg.system_prompts)
    ]
    sessions = []
    for s in range(cfg.sessions):
        turns = [
            (f"[{tag} s{s} t{t}] " + snippet(cfg.user_tokens), snippet(cfg.assistant_tokens))
            for t in range(cfg.turns)
        ]
        system = systems[s % len(systems)]
        if cfg.document_tokens:
            system = f"# run {tag} session {s} document\n" + snippet(cfg.document_tokens)
        sessions.append({"id": f"{tag}-{s}", "system": system, "turns": turns})
    return sessions


def worker_counters(urls: list[str]) -> dict[str, tuple[float, float]]:
    """(hits, queries) of each worker's prefix cache, from its /metrics."""
    out = {}
    for url in urls:
        reading = parse_worker_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        out[url] = (reading.prefix_cache_hits or 0.0, reading.prefix_cache_queries or 0.0)
    return out


async def drive(router_url: str, sessions: list[dict[str, Any]], cfg: Workload) -> list[dict]:
    """Replay the sessions through the router; one record per request."""
    records: list[dict] = []
    gate = asyncio.Semaphore(cfg.concurrency)
    rng = random.Random(cfg.seed + 1)
    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def one(session: dict[str, Any]) -> None:
            messages = [{"role": "system", "content": session["system"]}]
            async with gate:
                for turn, (user, assistant) in enumerate(session["turns"]):
                    messages.append({"role": "user", "content": user})
                    rec = await ask(client, router_url, messages, session["id"], cfg)
                    rec.update(session=session["id"], turn=turn)
                    records.append(rec)
                    messages.append({"role": "assistant", "content": assistant})
                    await asyncio.sleep(rng.uniform(0, 2 * cfg.think_s))

        await asyncio.gather(*(one(s) for s in sessions))
    return records


async def ask(
    client: httpx.AsyncClient, url: str, messages: list[dict], session: str, cfg: Workload
) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": cfg.max_tokens,
        "min_tokens": cfg.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec: dict[str, Any] = {"ok": False, "ttft": None, "prompt_tokens": 0, "cached": 0}
    start = time.perf_counter()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": session}
        ) as resp:
            rec["worker"] = resp.headers.get(WORKER_HEADER, "")
            if resp.status_code != 200:
                rec["error"] = f"{resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and rec["ttft"] is None:
                    rec["ttft"] = time.perf_counter() - start
                usage = chunk.get("usage")
                if usage:
                    rec["prompt_tokens"] = usage.get("prompt_tokens") or 0
                    details = usage.get("prompt_tokens_details") or {}
                    rec["cached"] = details.get("cached_tokens") or 0
        rec["ok"] = rec["ttft"] is not None
    except (httpx.HTTPError, ValueError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    return rec


def wait_kv_connected(url: str, workers: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """Wait until every worker's event publisher is connected to the router (precise mode)."""
    deadline = time.monotonic() + timeout_s
    state: list = []
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/workers", timeout=5).json()
        kv = [w.get("kv_events") or {} for w in state]
        if len(kv) == workers and all(k.get("connected") and not k.get("replaying") for k in kv):
            break
        time.sleep(0.25)
    return {w["url"]: (w.get("kv_events") or {}).get("synced") for w in state}


def shadow_errors(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Σ|estimate - reported| / Σ prompt tokens per shadow, from the router's GET /workers."""
    acc = [w["accuracy"] for w in workers]
    prompt = sum(a["prompt_tokens"] for a in acc)
    kv_prompt = sum(a["kv_events_prompt_tokens"] for a in acc)
    out: dict[str, Any] = {
        "scored_requests": sum(a["requests"] for a in acc),
        "kv_scored_requests": sum(a["kv_events_requests"] for a in acc),
    }
    if prompt:
        out["blocks"] = sum(a["blocks_abs_error_tokens"] for a in acc) / prompt
        out["radix"] = sum(a["radix_abs_error_tokens"] for a in acc) / prompt
    if kv_prompt:
        out["kv_events"] = sum(a["kv_events_abs_error_tokens"] for a in acc) / kv_prompt
    return out


def metrics_error_ratio(url: str) -> tuple[dict[str, float], dict[str, int]]:
    """``cache_router_shadow_error_ratio{shadow}`` and the picker's decisions by branch
    (``cache_router_decisions_total{branch}``) from the router's /metrics."""
    out: dict[str, float] = {}
    decisions: dict[str, int] = {}
    for sample in scrape(url):
        if sample.name == "cache_router_shadow_error_ratio":
            out[sample.labels["shadow"]] = sample.value
        elif sample.name == "cache_router_decisions_total":
            decisions[sample.labels["branch"]] = int(sample.value)
    return out, decisions


def run_one(spec: RunSpec, workers: list[str], cfg: Workload, text: str) -> dict[str, Any]:
    """One policy run: reset, fresh router, replay, figures."""
    tag = f"{spec.name}-{time.time_ns()}"
    clean = reset_caches(workers)
    sessions = build_sessions(cfg, tag, text)
    args = [*spec.router_args, "--log-level", "warning", "--worker-metrics-interval-s", "1"]
    with router(workers, spec.policy, args) as svc:
        synced = wait_kv_connected(svc.url, len(workers)) if "--kv-events" in args else {}
        before = worker_counters(workers)
        started = time.perf_counter()
        records = asyncio.run(drive(svc.url, sessions, cfg))
        wall = time.perf_counter() - started
        time.sleep(1.5)  # the last usage reports, scrapes and events
        after = worker_counters(workers)
        described = httpx.get(f"{svc.url}/workers", timeout=10).json()
        ratio, decisions = metrics_error_ratio(svc.url)
    ok = [r for r in records if r["ok"]]
    hits = sum(after[u][0] - before[u][0] for u in workers)
    queries = sum(after[u][1] - before[u][1] for u in workers)
    per_worker = {u: sum(1 for r in ok if r.get("worker") == u) for u in workers}
    counts = list(per_worker.values())
    ttft = np.array([r["ttft"] for r in ok]) if ok else np.zeros(1)
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {
        "name": spec.name,
        "policy": spec.policy,
        "router_args": spec.router_args,
        "caches_reset": clean,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "error_samples": [r.get("error") for r in records if not r["ok"]][:3],
        "wall_s": round(wall, 2),
        "worker_hit_rate": hits / queries if queries else None,
        "worker_hit_tokens": hits,
        "worker_query_tokens": queries,
        "per_worker_hit_rate": {
            u: (after[u][0] - before[u][0]) / (after[u][1] - before[u][1])
            if after[u][1] > before[u][1]
            else None
            for u in workers
        },
        "reported_hit_rate": sum(r["cached"] for r in ok) / prompt if prompt else None,
        "prompt_tokens": prompt,
        "mean_prompt_tokens": prompt / len(ok) if ok else 0,
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p90_s": float(np.percentile(ttft, 90)),
        "requests_per_worker": per_worker,
        "imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else None,
        "shadow_error": shadow_errors(described),
        "metrics_shadow_error_ratio": ratio,
        "decisions": decisions,
        "kv_synced_at_start": synced,
        "kv_events": {w["url"]: w.get("kv_events") for w in described},
        "records": records,
        "worker_kv_capacity_tokens": {
            w["url"]: (w.get("worker_metrics") or {}).get("kv_capacity_tokens") for w in described
        },
    }


DEFAULT_RUNS = "round_robin,lmetric,lmetric+kv"


def run_specs(names: str, tokenizer: str, block_size: int) -> list[RunSpec]:
    """``policy`` runs in exact-token mode (``--tokenizer PATH``); ``policy+kv`` adds the KV
    events and uses the worker's /tokenize, so both exact modes are exercised."""
    common = ["--block-size", str(block_size), "--shadow-capacity-from-worker"]
    specs = []
    for name in names.split(","):
        policy, _, mode = name.strip().partition("+")
        if mode == "kv":
            args = [*common, "--tokenizer", "worker", "--kv-events"]
        else:
            args = [*common, "--tokenizer", tokenizer]
        specs.append(RunSpec(name.strip(), policy, args))
    return specs


def run_bench(
    workers: list[str], specs: list[RunSpec], cfg: Workload, log=print
) -> list[dict[str, Any]]:
    text = corpus()
    results = []
    for spec in specs:
        result = run_one(spec, workers, cfg, text)
        log(
            f"{spec.name:<16} hit {result['worker_hit_rate']:.3f} "
            f"imbalance {result['imbalance']:.2f} ttft p50 {result['ttft_p50_s']:.3f} s "
            f"errors {result['errors']} shadow {json.dumps(result['shadow_error'])}"
        )
        results.append(result)
    return results


def markdown(results: list[dict[str, Any]]) -> str:
    """The results as a table (the RESULTS.md section's body)."""
    rr = next((r for r in results if r["policy"] == "round_robin"), None)
    rows = [
        "| run | worker hit rate | × round_robin | reported hit rate | TTFT p50 / p90 s | "
        "requests per worker | max/mean | shadow error blocks / radix / kv_events |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = (
            f"{r['worker_hit_rate'] / rr['worker_hit_rate']:.2f}"
            if rr and rr["worker_hit_rate"]
            else "-"
        )
        err = r["shadow_error"]
        errs = " / ".join(
            f"{100 * err[k]:.2f}%" if k in err else "-" for k in ("blocks", "radix", "kv_events")
        )
        counts = ", ".join(str(n) for n in r["requests_per_worker"].values())
        rows.append(
            f"| {r['name']} | {r['worker_hit_rate']:.3f} | {ratio} | "
            f"{r['reported_hit_rate']:.3f} | {r['ttft_p50_s']:.3f} / {r['ttft_p90_s']:.3f} | "
            f"{counts} | {r['imbalance']:.2f} | {errs} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--worker", nargs="+", required=True, help="vLLM worker base URLs")
    ap.add_argument("--tokenizer", required=True, help="the served model's folder")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="policy or policy+kv, comma-separated")
    ap.add_argument("--block-size", type=int, default=32, help="router shadow block size")
    ap.add_argument("--out", default="out/real_bench")
    for name, value in asdict(Workload()).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    a = ap.parse_args()
    cfg = Workload(**{k: getattr(a, k) for k in asdict(Workload())})
    workers = [w.rstrip("/") for w in a.worker]
    results = run_bench(workers, run_specs(a.runs, a.tokenizer, a.block_size), cfg)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"workload": asdict(cfg), "workers": workers, "runs": results}
    (out / "results.json").write_text(json.dumps(document, indent=1))
    table = markdown(results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

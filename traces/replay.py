"""``cache-router replay``: a trace, open loop, through a live router (or one worker).

Each request is sent at its arrival time (divided by ``--speedup``) whether or not earlier
ones have finished, streamed, with its session in the session header, so time to first token
and time per output token are measured at the client as users see them. Prompts are rebuilt
from the trace's block keys (:mod:`traces.prompts`) so the workers' real caches see the
trace's prefix reuse. The workers' own ``/metrics`` are read before and after: the hit rate
reported is theirs (vLLM's prefix-cache counters), not the router's estimate.

The report has ``simulate``'s shape (:mod:`traces.report`); ``hit_rate`` is the workers'
metric, ``reported_hit_rate`` the sum of ``cached_tokens`` in the responses.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from traces.prompts import prompt_text, prompt_token_ids
from traces.record import TraceRequest
from traces.simulator import PolicyRun

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
WORKER_HEADER = "x-cache-router-worker"


@dataclass(frozen=True)
class ReplayConfig:
    url: str  # the router (or a worker) base URL
    speedup: float = 1.0
    prompt_mode: str = "tokens"  # or "text"
    vocab_size: int = 32_000
    salt: int = 0
    model: str | None = None  # default: the first of GET /v1/models
    session_header: str = "X-Session-ID"
    max_output_tokens: int | None = None  # cap the trace's output lengths
    timeout_s: float = 300.0
    max_inflight: int = 2048
    worker_urls: tuple[str, ...] = ()  # default: from the router's GET /workers
    progress: bool = False


@dataclass
class ReplayOutcome:
    run: PolicyRun
    errors: int
    workers: list[str]
    worker_hit_rate: float | None  # from the workers' /metrics deltas
    reported_hit_rate: float
    send_lag: np.ndarray  # seconds each request left after its scheduled time (open loop)
    error_samples: list[str] = field(default_factory=list)

    @property
    def send_lag_p99(self) -> float:
        return float(np.percentile(self.send_lag, 99)) if len(self.send_lag) else 0.0


def _counter_sums(text: str) -> dict[str, float]:
    sums = {HITS: 0.0, QUERIES: 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


async def scrape_hits(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, float] | None:
    """Summed prefix-cache hit and query counters of ``urls`` (None if any is unreadable)."""
    total = {HITS: 0.0, QUERIES: 0.0}
    for url in urls:
        try:
            resp = await client.get(f"{url.rstrip('/')}/metrics", timeout=10)
            resp.raise_for_status()
        except httpx.HTTPError:
            return None
        for k, v in _counter_sums(resp.text).items():
            total[k] += v
    return total


async def _discover(client: httpx.AsyncClient, cfg: ReplayConfig) -> tuple[str, list[str]]:
    base = cfg.url.rstrip("/")
    model = cfg.model
    if model is None:
        resp = await client.get(f"{base}/v1/models", timeout=10)
        resp.raise_for_status()
        model = resp.json()["data"][0]["id"]
    workers = list(cfg.worker_urls)
    if not workers:
        try:
            resp = await client.get(f"{base}/workers", timeout=10)
            if resp.status_code == 200:
                workers = [w["url"] for w in resp.json()]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            workers = []
    return model, workers or [base]


def _body(req: TraceRequest, cfg: ReplayConfig, model: str) -> dict:
    out = max(1, req.output_length)
    if cfg.max_output_tokens is not None:
        out = min(out, cfg.max_output_tokens)
    if cfg.prompt_mode == "tokens":
        prompt: object = prompt_token_ids(req, cfg.salt, cfg.vocab_size)
    else:
        prompt = prompt_text(req, cfg.salt)
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": out,
        "min_tokens": out,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def replay(trace: Sequence[TraceRequest], cfg: ReplayConfig, name: str) -> ReplayOutcome:
    """Send ``trace`` open loop to ``cfg.url`` and collect per-request outcomes."""
    if cfg.prompt_mode not in ("tokens", "text") or cfg.speedup <= 0:
        raise ValueError("prompt_mode must be tokens or text, speedup > 0")
    n = len(trace)
    arrival = np.array([r.arrival / cfg.speedup for r in trace])
    sent = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    out_tokens = np.zeros(n, dtype=np.int64)
    cached = np.zeros(n, dtype=np.int64)
    worker_of: list[str] = [""] * n
    errors: list[str] = []
    limits = httpx.Limits(max_connections=cfg.max_inflight, max_keepalive_connections=256)
    timeout = httpx.Timeout(cfg.timeout_s, connect=10.0)
    gate = asyncio.Semaphore(cfg.max_inflight)
    done = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model, workers = await _discover(client, cfg)
        before = await scrape_hits(client, workers)
        start = time.perf_counter()

        async def one(i: int, req: TraceRequest) -> None:
            nonlocal done
            delay = start + arrival[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = _body(req, cfg, model)
            headers = {cfg.session_header: req.session_id}
            sent[i] = time.perf_counter() - start
            try:
                async with (
                    gate,
                    client.stream(
                        "POST", f"{cfg.url.rstrip('/')}/v1/completions", json=body, headers=headers
                    ) as resp,
                ):
                    if resp.status_code != 200:
                        errors.append(f"{resp.status_code}: {(await resp.aread())[:200]!r}")
                        return
                    worker_of[i] = resp.headers.get(WORKER_HEADER, "")
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("choices"):
                            if np.isnan(first[i]):
                                first[i] = time.perf_counter() - start
                            out_tokens[i] += 1
                        usage = chunk.get("usage")
                        if usage:
                            out_tokens[i] = usage.get("completion_tokens", out_tokens[i])
                            details = usage.get("prompt_tokens_details") or {}
                            cached[i] = details.get("cached_tokens") or 0
                    finish[i] = time.perf_counter() - start
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                done += 1
                if cfg.progress and (done % 50 == 0 or done == n):
                    sys.stderr.write(f"\r  {name:<20} {done:>7}/{n} requests")
                    sys.stderr.flush()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(trace)))
        wall = time.perf_counter() - start
        after = await scrape_hits(client, workers)
    if cfg.progress:
        sys.stderr.write("\n")
    ok = ~np.isnan(finish) & ~np.isnan(first)
    names = sorted({w for w in worker_of if w}) or ["?"]
    index = {w: k for k, w in enumerate(names)}
    worker = np.array([index.get(w, 0) for w in worker_of], dtype=np.int64)[ok]
    input_length = np.array([r.input_length for r in trace])[ok]
    run = PolicyRun(
        name=name,
        requests=int(ok.sum()),
        worker=worker,
        arrival=arrival[ok],
        first_token=first[ok],
        finish=finish[ok],
        output_length=out_tokens[ok],
        input_length=input_length,
        cached=cached[ok],
        estimated=np.zeros(int(ok.sum())),
        pick_us=np.zeros(0),
        branches={},
        inflight_t=np.zeros(0),
        inflight=np.zeros((0, len(names)), dtype=np.int32),
        wall_seconds=wall,
    )
    worker_rate = None
    if before is not None and after is not None:
        queries = after[QUERIES] - before[QUERIES]
        worker_rate = (after[HITS] - before[HITS]) / queries if queries > 0 else None
    reported = float(cached[ok].sum()) / max(1.0, float(input_length.sum()))
    lag = sent[~np.isnan(sent)] - arrival[~np.isnan(sent)]
    return ReplayOutcome(run, len(errors), workers, worker_rate, reported, lag, errors[:5])

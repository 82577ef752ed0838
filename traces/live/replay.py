"""``cache-router replay``: a trace through a live router (or one worker).

Each request is sent at its arrival time (divided by ``--speedup``) whether or not earlier
ones have finished (open loop), or with ``--pacing session`` also no earlier than its
session's previous turn's answer plus the recorded think time (:mod:`traces.trace.pacing`). It is
streamed, with its session in the session header, so time to first token and time per output
token are measured at the client as users see them. Prompts are rebuilt from the trace's block
keys (:mod:`traces.trace.prompts`) so the workers' real caches see the trace's prefix reuse. The
workers' own ``/metrics`` are read before and after: the hit rate reported is theirs (vLLM's
prefix-cache counters or SGLang's realtime tokens), not the router's estimate.

The report has ``simulate``'s shape (:mod:`traces.reports.results`); ``hit_rate`` is the workers'
metric, ``reported_hit_rate`` the sum of ``cached_tokens`` in the responses.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from router.fleet.upstream import ConnectFailed, ConnectionLost, UpstreamError, UpstreamPool
from router.fleet.worker_truth import parse_worker_metrics
from traces.trace.pacing import Pacing, predecessors, release_time
from traces.trace.prompts import prompt_text, prompt_token_ids
from traces.trace.record import TraceRequest
from traces.trace.run import PolicyRun

HITS = "prefix_cache_hits"  # tokens, vLLM's counters or SGLang's realtime_tokens
QUERIES = "prefix_cache_queries"
WORKER_HEADER = b"x-cache-router-worker"


@dataclass(frozen=True)
class ReplayConfig:
    url: str  # the router (or a worker) base URL
    speedup: float = 1.0
    pacing: Pacing = "open"  # or "session" (traces/trace/pacing.py)
    prompt_mode: str = "tokens"  # or "text"
    vocab_size: int = 32_000
    salt: int = 0
    model: str | None = None  # default: the first of GET /v1/models (a request's own first)
    session_header: str = "X-Session-ID"
    max_output_tokens: int | None = None  # cap the trace's output lengths
    timeout_s: float = 300.0
    max_inflight: int = 2048
    worker_urls: tuple[str, ...] = ()  # default: from the router's GET /workers
    progress: bool = False
    # A request whose connection failed before its first token is sent again, up to this many
    # times (after 0.1 s, 0.2 s, ...), as the OpenAI SDK does on connection errors (its
    # default: 2). What a router replica killed mid-stream had already streamed is lost.
    retries: int = 0
    # a request's priority as another router reads it: the header's name and, per priority,
    # its value (e.g. SMG's x-smg-priority: interactive); None: x-priority, the integer
    priority_header: str = "x-priority"
    priority_names: tuple[tuple[int, str], ...] | None = None


@dataclass
class ReplayOutcome:
    run: PolicyRun
    errors: int
    workers: list[str]
    worker_hit_rate: float | None  # from the workers' /metrics deltas
    reported_hit_rate: float
    send_lag: np.ndarray  # seconds each request left after its scheduled (or release) time
    error_samples: list[str] = field(default_factory=list)
    retried: int = 0  # sends repeated after a connection failure before the first token
    lost_streaming: int = 0  # errors after the first token (a retry would repeat output)
    served_by: list[str] = field(default_factory=list)  # run.worker's index -> worker URL
    # per request of the trace, in its order: the HTTP status (0: none), whether a refusal
    # said Retry-After, the TTFT (nan: no first token)
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    retry_after: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    ttft: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # the trace replayed, and the positions in it of ``run``'s rows (the requests answered)
    trace: Sequence[TraceRequest] = ()
    answered: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def send_lag_p99(self) -> float:
        return float(np.percentile(self.send_lag, 99)) if len(self.send_lag) else 0.0


def _counter_sums(text: str) -> dict[str, float]:
    """The prefix-cache counters of a vLLM or SGLang page, read as the router reads them."""
    reading = parse_worker_metrics(text)
    return {HITS: reading.prefix_cache_hits or 0.0, QUERIES: reading.prefix_cache_queries or 0.0}


class _Clients:
    """One keep-alive connection pool per base URL (the router's own HTTP/1.1 client)."""

    def __init__(self) -> None:
        self._pools: dict[str, UpstreamPool] = {}

    def pool(self, url: str) -> UpstreamPool:
        url = url.rstrip("/")
        if url not in self._pools:
            self._pools[url] = UpstreamPool(url, connect_timeout=10.0)
        return self._pools[url]

    async def get(self, url: str, path: str) -> tuple[int, bytes]:
        return await self.pool(url).fetch("GET", path, timeout=10.0)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


async def scrape_hits(clients: _Clients, urls: Sequence[str]) -> dict[str, float] | None:
    """Summed prefix-cache hit and query counters of ``urls`` (None if any is unreadable)."""
    total = {HITS: 0.0, QUERIES: 0.0}
    for url in urls:
        try:
            status, body = await clients.get(url, "/metrics")
        except (UpstreamError, OSError):
            return None
        if status != 200:
            return None
        for k, v in _counter_sums(body.decode(errors="replace")).items():
            total[k] += v
    return total


async def _discover(clients: _Clients, cfg: ReplayConfig) -> tuple[str, list[str]]:
    model = cfg.model
    if model is None:
        status, body = await clients.get(cfg.url, "/v1/models")
        if status != 200:
            raise ValueError(f"GET {cfg.url}/v1/models answered {status}")
        model = orjson.loads(body)["data"][0]["id"]
    workers = list(cfg.worker_urls)
    if not workers:
        try:
            status, body = await clients.get(cfg.url, "/workers")
            if status == 200:
                workers = [w["url"] for w in orjson.loads(body)]
        except (UpstreamError, OSError, ValueError, KeyError, TypeError):
            workers = []
    return model, workers or [cfg.url.rstrip("/")]


def _body(req: TraceRequest, cfg: ReplayConfig, model: str) -> dict:
    out = max(1, req.output_length)
    if cfg.max_output_tokens is not None:
        out = min(out, cfg.max_output_tokens)
    if cfg.prompt_mode == "tokens":
        prompt: object = prompt_token_ids(req, cfg.salt, cfg.vocab_size)
    else:
        prompt = prompt_text(req, cfg.salt)
    return {
        "model": req.model or model,
        "prompt": prompt,
        "max_tokens": out,
        "min_tokens": out,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


PREBUILD_BYTES = 512 << 20
"""Request bodies built before the clock starts, at most this many bytes in all."""


def prebuilt_bodies(trace: Sequence[TraceRequest], cfg: ReplayConfig, model: str) -> list:
    """The requests' bodies, built before the replay's clock starts (up to
    ``PREBUILD_BYTES``; the rest, None, are built when sent). Built at send time, a burst's
    prompts (megabytes of text) stall the client's one event loop while answers wait to be
    read, and only for the first run on a salt (the prompt blocks are cached after it): in a
    sweep the first policy's TTFT read 2.4 modelled seconds worse on a burst's requests than
    the same placements run later (bench/RESULTS.md, issue 31)."""
    bodies: list[bytes | None] = [None] * len(trace)
    total = 0
    for i, req in enumerate(trace):
        body = orjson.dumps(_body(req, cfg, model))
        total += len(body)
        if total > PREBUILD_BYTES:
            break
        bodies[i] = body
    return bodies


async def replay(trace: Sequence[TraceRequest], cfg: ReplayConfig, name: str) -> ReplayOutcome:
    """Send ``trace`` to ``cfg.url`` (paced as ``cfg.pacing``) and collect per-request
    outcomes."""
    if cfg.prompt_mode not in ("tokens", "text") or cfg.speedup <= 0:
        raise ValueError("prompt_mode must be tokens or text, speedup > 0")
    n = len(trace)
    arrival = np.array([r.arrival / cfg.speedup for r in trace])
    # session pacing: a turn waits for its session's previous one to end (any outcome)
    previous = predecessors(trace, cfg.pacing)
    ended = [asyncio.Event() for _ in range(n)]
    ended_at = np.full(n, np.nan)
    sent = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    out_tokens = np.zeros(n, dtype=np.int64)
    cached = np.zeros(n, dtype=np.int64)
    worker_of: list[str] = [""] * n
    status = np.zeros(n, dtype=np.int64)  # the router's answer (0: none came)
    retry_after = np.zeros(n, dtype=bool)  # a refusal that said Retry-After
    errors: list[str] = []
    retried = lost_streaming = 0
    gate = asyncio.Semaphore(cfg.max_inflight)
    done = 0
    clients = _Clients()
    target = clients.pool(cfg.url)
    session_header = cfg.session_header.lower().encode()
    priority_header = cfg.priority_header.lower().encode()
    try:
        model, workers = await _discover(clients, cfg)
        bodies = prebuilt_bodies(trace, cfg, model)
        before = await scrape_hits(clients, workers)
        start = time.perf_counter()

        async def one(i: int, req: TraceRequest) -> None:
            nonlocal done, retried, lost_streaming
            if previous[i] >= 0:
                await ended[previous[i]].wait()
                arrival[i] = release_time(req, cfg.speedup, ended_at[previous[i]])
            delay = start + arrival[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = bodies[i]
            if body is None:
                body = orjson.dumps(_body(req, cfg, model))
            else:
                bodies[i] = None  # sent once: not held longer
            headers = b"content-type: application/json\r\n%s: %s\r\n" % (
                session_header,
                req.session_id.encode(),
            )
            if req.tenant is not None:  # flow control: the request's flow and priority
                headers += b"x-llm-d-inference-fairness-id: %s\r\n" % req.tenant.encode()
            if cfg.priority_names is not None:
                named = dict(cfg.priority_names).get(req.priority)
                if named is not None:
                    headers += b"%s: %s\r\n" % (priority_header, named.encode())
            elif req.priority:
                headers += b"%s: %d\r\n" % (priority_header, req.priority)
            sent[i] = time.perf_counter() - start
            try:
                for attempt in range(cfg.retries + 1):
                    try:
                        async with gate:
                            conn = await target.request(
                                b"POST", b"/v1/completions", headers, body, cfg.timeout_s
                            )
                            try:
                                await _read_stream(conn, i, cfg.timeout_s)
                            finally:
                                conn.release()
                        break
                    except (ConnectFailed, ConnectionLost, OSError):
                        if not np.isnan(first[i]) or attempt == cfg.retries:
                            raise
                        retried += 1
                        out_tokens[i] = cached[i] = 0
                        await asyncio.sleep(0.1 * 2**attempt)
            except (UpstreamError, OSError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                lost_streaming += not np.isnan(first[i])
            finally:
                ended_at[i] = time.perf_counter() - start
                ended[i].set()
                done += 1
                if cfg.progress and (done % 50 == 0 or done == n):
                    sys.stderr.write(f"\r  {name:<20} {done:>7}/{n} requests")
                    sys.stderr.flush()

        async def _read_stream(conn, i: int, timeout: float) -> None:
            status[i] = conn.status
            if conn.status != 200:
                retry_after[i] = b"retry-after" in dict(conn.headers)
                data, more = await conn.read(timeout)
                raise ValueError(f"status {conn.status}: {data[:200]!r}")
            worker_of[i] = dict(conn.headers).get(WORKER_HEADER, b"").decode()
            buf = b""
            more = True
            while more:
                data, more = await conn.read(timeout)
                buf += data
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    chunk = orjson.loads(event[6:])
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

        await asyncio.gather(*(one(i, r) for i, r in enumerate(trace)))
        wall = time.perf_counter() - start
        after = await scrape_hits(clients, workers)
    finally:
        clients.close()
    if cfg.progress:
        sys.stderr.write("\n")
    return _outcome(
        name, trace, wall, workers, before, after, errors, retried, lost_streaming,
        arrival=arrival, sent=sent, first=first, finish=finish, out_tokens=out_tokens,
        cached=cached, worker_of=worker_of, status=status, retry_after=retry_after,
    )  # fmt: skip


def _outcome(
    name: str,
    trace: Sequence[TraceRequest],
    wall: float,
    workers: list[str],
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    errors: list[str],
    retried: int,
    lost_streaming: int,
    *,
    arrival: np.ndarray,
    sent: np.ndarray,
    first: np.ndarray,
    finish: np.ndarray,
    out_tokens: np.ndarray,
    cached: np.ndarray,
    worker_of: list[str],
    status: np.ndarray,
    retry_after: np.ndarray,
) -> ReplayOutcome:
    """The replay's per-request records as a :class:`PolicyRun` (the requests answered) and
    the outcome around it (errors, hit rates, send lag, who served each)."""
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
    return ReplayOutcome(
        run,
        len(errors),
        workers,
        worker_rate,
        reported,
        lag,
        errors[:5],
        retried,
        lost_streaming,
        names,
        status,
        retry_after,
        first - arrival,
        trace,
        np.flatnonzero(ok),
    )

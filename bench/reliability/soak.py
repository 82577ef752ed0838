#!/usr/bin/env python3
"""Load and soak the router against simulated workers, with random client disconnects and
worker kills, then check that nothing leaked.

    python bench/reliability/soak.py --concurrency 64 --duration 600 --disconnect-rate 0.2
    python bench/reliability/soak.py --requests 10000 --concurrency 64 --disconnect-rate 0.3 \
        --kill-workers 2

It starts ``--workers`` sim workers and one router (traces/live/fleet.py: child processes on
127.0.0.1 only, stopped by the PIDs it started), then ``--concurrency`` clients send chat
and completion requests (streamed or not, conversations that grow turn by turn so prompts
share prefixes) over keep-alive connections, until ``--duration`` seconds or ``--requests``
requests. A ``--disconnect-rate`` share of requests hang up on purpose at a random point:
while sending the request, before the answer, after the status line, or mid-stream.
``--kill-workers N`` SIGKILLs a worker N times, spread over the run, and restarts it on the
same port ``--restart-after-s`` later.

Every request ends in one outcome:

- ``ok``: the whole answer (a stream up to ``[DONE]`` without an error event);
- ``disconnected``: the client hung up on purpose;
- ``cut``: the answer had started (bytes reached the client) and then a worker died: the
  stream ends with the router's error event, or the connection closed early;
- ``lost``: failed before any byte of an answer (an error status, a dropped connection or a
  timeout): the router should have retried these elsewhere, so the bar is 0;
- ``rejected``: a 4xx from the router (never expected here).

At the end: the router's ``GET /workers`` counters (``num_requests``,
``pending_prefill_tokens``, ``ongoing_decode_tokens``, ``pinned_blocks``,
``radix_locked_tokens``) must all return to 0 within ``--settle-s``, its ``in_flight`` gauge
too, and one more request must succeed. The router's RSS (``VmRSS`` of /proc/<pid>/status)
is sampled every 5 s; growth is measured from the first sample after ``--warmup-s`` (the
shadows fill up first) to the end. Exit status 0 when no counter leaked, nothing was lost
and RSS grew at most ``--max-rss-growth``. ``--out FILE.json`` writes the whole report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import httpx
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from traces.live.fleet import HOST, Service, free_port, start_service

COUNTERS = (
    "num_requests",
    "pending_prefill_tokens",
    "ongoing_decode_tokens",
    "pinned_blocks",
    "radix_locked_tokens",
)
DISCONNECT_POINTS = ("while_sending", "before_answer", "after_status", "mid_stream")
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "words",
]


# ---- the client --------------------------------------------------------------------------


class _Response:
    """httptools callbacks: status, body bytes, whether the message ended."""

    def __init__(self) -> None:
        self.status = 0
        self.headers_done = False
        self.body = bytearray()
        self.complete = False
        self.keep_alive = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


@dataclass
class Result:
    outcome: str  # ok, disconnected, cut, lost, rejected
    status: int
    latency_s: float
    ttfb_s: float | None
    detail: str = ""


@dataclass
class Conversation:
    system: str
    turns: list[str] = field(default_factory=list)


class Client:
    """One client: a keep-alive connection to the router, one request at a time."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()  # a hang-up without goodbye
        self.reader = self.writer = None

    async def send(
        self, path: str, body: bytes, stream: bool, hang_up: str | None, rng: random.Random
    ) -> Result:
        start = time.perf_counter()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        data = head + body
        try:
            await self._connect()
        except OSError as exc:
            return Result("lost", 0, time.perf_counter() - start, None, f"connect: {exc}")
        assert self.reader is not None and self.writer is not None
        if hang_up == "while_sending":
            self.writer.write(data[: rng.randint(1, len(data) - 1)])
            await asyncio.sleep(rng.uniform(0, 0.05))
            self._drop()
            return Result("disconnected", 0, time.perf_counter() - start, None, hang_up)
        self.writer.write(data)
        response = _Response()
        parser = httptools.HttpResponseParser(response)
        events_to_hang_up = rng.randint(1, 8) if hang_up == "mid_stream" else None
        hang_up_at = (
            time.perf_counter() + rng.uniform(0.0, 0.3) if hang_up == "before_answer" else None
        )
        ttfb = None
        deadline = time.perf_counter() + self.timeout_s
        try:
            while not response.complete:
                wait = deadline - time.perf_counter()
                if hang_up_at is not None:
                    wait = min(wait, hang_up_at - time.perf_counter())
                if wait <= 0:
                    if hang_up_at is not None and time.perf_counter() >= hang_up_at:
                        self._drop()
                        return Result("disconnected", response.status, 0.0, ttfb, hang_up)
                    self._drop()
                    return self._failed(response, start, ttfb, "timeout")
                try:
                    chunk = await asyncio.wait_for(self.reader.read(65536), wait)
                except TimeoutError:
                    continue
                if not chunk:
                    self._drop()
                    return self._failed(response, start, ttfb, "connection closed")
                if ttfb is None:
                    ttfb = time.perf_counter() - start
                parser.feed_data(chunk)
                if response.headers_done and response.status == 0:
                    response.status = parser.get_status_code()
                    response.keep_alive = parser.should_keep_alive()
                if hang_up == "after_status" and response.headers_done:
                    self._drop()
                    return Result("disconnected", response.status, 0.0, ttfb, hang_up)
                if events_to_hang_up is not None and response.body.count(b"data:") >= (
                    events_to_hang_up
                ):
                    self._drop()
                    return Result("disconnected", response.status, 0.0, ttfb, hang_up)
        except (ConnectionError, httptools.HttpParserError) as exc:
            self._drop()
            return self._failed(response, start, ttfb, f"{type(exc).__name__}: {exc}")
        if not response.keep_alive:
            self._drop()
        latency = time.perf_counter() - start
        if hang_up is not None:  # the answer came before the planned hang-up: still a hang-up
            self._drop()
            return Result("disconnected", response.status, latency, ttfb, hang_up)
        body = bytes(response.body)
        if response.status != 200:
            outcome = "lost" if response.status >= 500 else "rejected"
            detail = body[:200].decode(errors="replace")
            return Result(outcome, response.status, latency, ttfb, detail)
        if stream and (b'data: {"error"' in body or b"data: [DONE]" not in body):
            return Result("cut", 200, latency, ttfb, body[-200:].decode(errors="replace"))
        return Result("ok", 200, latency, ttfb)

    @staticmethod
    def _failed(response: _Response, start: float, ttfb: float | None, why: str) -> Result:
        """No complete answer: ``cut`` if an answer had started, else ``lost``."""
        started = response.status == 200 and len(response.body) > 0
        outcome = "cut" if started else "lost"
        return Result(outcome, response.status, time.perf_counter() - start, ttfb, why)


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_request(
    rng: random.Random, conversations: list[Conversation], max_tokens: int
) -> tuple[str, bytes, bool]:
    """A chat turn of a random conversation (its prompt extends the previous turn), or a
    completion over a shared system prompt; streamed three times in four."""
    conv = rng.choice(conversations)
    conv.turns.append(_text(rng, rng.randint(20, 300)))
    if len(conv.turns) > 12:  # a new conversation in its place, over the same system prompt
        del conv.turns[:-1]
    stream = rng.random() < 0.75
    tokens = rng.randint(4, max_tokens)
    if rng.random() < 0.7:
        messages = [{"role": "system", "content": conv.system}]
        for i, turn in enumerate(conv.turns):
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
        body = {"model": "sim-model", "messages": messages, "max_tokens": tokens, "stream": stream}
        return "/v1/chat/completions", orjson.dumps(body), stream
    prompt = conv.system + " " + conv.turns[-1]
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": tokens, "stream": stream}
    return "/v1/completions", orjson.dumps(body), stream


# ---- the fleet -----------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Fleet:
    """Sim workers and a router as child processes; workers can be killed and restarted."""

    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        self.args = args
        self.log_dir = log_dir
        self.ports = [free_port() for _ in range(args.workers)]
        self.workers: list[Service] = []
        self.router: Service | None = None

    def _worker_args(self, port: int) -> list[str]:
        return ["sim-worker", "--host", HOST, "--port", str(port), "--log-level", "warning",
                "--time-scale", str(self.args.time_scale), *self.args.sim_worker_arg]  # fmt: skip

    def start_worker(self, i: int) -> Service:
        port = self.ports[i]
        return start_service(
            f"sim-worker-{i}",
            self._worker_args(port),
            port,
            log_file=str(self.log_dir / f"worker-{i}.log"),
        )

    def start(self) -> None:
        for i in range(len(self.ports)):
            self.workers.append(self.start_worker(i))
        port = free_port()
        urls = [w.url for w in self.workers]
        args = ["serve", "--host", HOST, "--port", str(port), "--policy", self.args.policy,
                "--log-level", "warning", "--worker", *urls, *self.args.router_arg]  # fmt: skip
        self.router = start_service("router", args, port, log_file=str(self.log_dir / "router.log"))

    def kill(self, i: int) -> None:
        """SIGKILL worker ``i`` (a crash: its connections drop mid-stream)."""
        self.workers[i].process.send_signal(signal.SIGKILL)
        self.workers[i].process.wait(10)

    def restart(self, i: int) -> None:
        self.workers[i] = self.start_worker(i)

    def stop(self) -> None:
        for service in [self.router, *self.workers]:
            if service is not None:
                service.stop()


# ---- the run -------------------------------------------------------------------------------


async def run(args: argparse.Namespace, fleet: Fleet) -> dict:
    assert fleet.router is not None
    router_url = fleet.router.url
    router_pid = fleet.router.process.pid
    port = int(router_url.rsplit(":", 1)[1])
    rng = random.Random(args.seed)
    conversations = [
        Conversation(system=f"system {i % 8}: " + _text(random.Random(i % 8), 400))
        for i in range(args.sessions)
    ]
    results: list[Result] = []
    rss: list[tuple[float, int]] = []
    kills: list[dict] = []
    start = time.perf_counter()
    stop_at = start + args.duration if args.duration else float("inf")
    budget = args.requests or 0
    issued = 0

    def more() -> bool:
        nonlocal issued
        if time.perf_counter() >= stop_at or (budget and issued >= budget):
            return False
        issued += 1
        return True

    async def client_loop(seed: int) -> None:
        crng = random.Random(seed)
        client = Client(port, args.request_timeout_s)
        while more():
            path, body, stream = make_request(crng, conversations, args.max_tokens)
            hang_up = None
            if crng.random() < args.disconnect_rate:
                points = DISCONNECT_POINTS if stream else DISCONNECT_POINTS[:3]
                hang_up = crng.choice(points)
            results.append(await client.send(path, body, stream, hang_up, crng))
        client._drop()

    async def sample_rss() -> None:
        while True:
            value = rss_kib(router_pid)
            if value is not None:
                rss.append((time.perf_counter() - start, value))
            await asyncio.sleep(5)

    async def killer() -> None:
        n = args.kill_workers
        for k in range(n):
            # spread over the run: by time, or by requests done
            while True:
                if budget:
                    if len(results) >= budget * (k + 1) / (n + 1):
                        break
                elif time.perf_counter() - start >= args.duration * (k + 1) / (n + 1):
                    break
                if time.perf_counter() >= stop_at or (budget and len(results) >= budget):
                    return
                await asyncio.sleep(0.05)
            i = k % args.workers
            record = {"worker": i, "killed_at_s": round(time.perf_counter() - start, 2)}
            kills.append(record)
            await asyncio.to_thread(fleet.kill, i)
            await asyncio.sleep(args.restart_after_s)
            await asyncio.to_thread(fleet.restart, i)
            record["back_at_s"] = round(time.perf_counter() - start, 2)

    sampler = asyncio.ensure_future(sample_rss())
    killing = asyncio.ensure_future(killer())
    progress = asyncio.ensure_future(_progress(results, start, args))
    await asyncio.gather(*(client_loop(args.seed * 1000 + i) for i in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    progress.cancel()
    # a restart under way finishes (the fleet ends whole); a kill not reached yet is skipped
    await asyncio.wait_for(killing, args.restart_after_s + 90)

    # settle: every counter back to 0 (bounded wait), then one more request must succeed
    async with httpx.AsyncClient(base_url=router_url, timeout=10) as http:
        deadline = time.perf_counter() + args.settle_s
        while True:
            workers = (await http.get("/workers")).json()
            totals = {c: sum(w.get(c, 0) for w in workers) for c in COUNTERS}
            if not any(totals.values()) or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.5)
        metrics = (await http.get("/metrics")).text
        final = await Client(port, 30).send(
            *make_request(rng, conversations, 8)[:2], False, None, rng
        )
    sampler.cancel()
    end_rss = rss_kib(router_pid)
    if end_rss is not None:
        rss.append((time.perf_counter() - start, end_rss))
    return summarize(args, results, rss, kills, elapsed, workers, totals, metrics, final)


async def _progress(results: list[Result], start: float, args: argparse.Namespace) -> None:
    while True:
        await asyncio.sleep(args.progress_s)
        t = time.perf_counter() - start
        counts: dict[str, int] = {}
        for r in results:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        print(f"  {t:7.1f} s  {len(results):>8} requests  {counts}", file=sys.stderr, flush=True)


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _metric_sum(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def summarize(args, results, rss, kills, elapsed, workers, totals, metrics, final) -> dict:
    outcomes: dict[str, int] = {}
    statuses: dict[str, int] = {}
    disconnects: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
        if r.outcome == "disconnected":
            disconnects[r.detail] = disconnects.get(r.detail, 0) + 1
    ok = np.array([r.latency_s for r in results if r.outcome == "ok"]) * 1000
    ttfb = np.array([r.ttfb_s for r in results if r.outcome == "ok" and r.ttfb_s]) * 1000
    warm = [v for t, v in rss if t >= args.warmup_s] or [v for _, v in rss]
    rss_start, rss_end = (warm[0], warm[-1]) if warm else (None, None)
    growth = (rss_end - rss_start) / rss_start if rss_start else None
    leaked = {c: v for c, v in totals.items() if v}
    lost = outcomes.get("lost", 0)
    report = {
        "command": " ".join(sys.argv),
        "workers": args.workers,
        "concurrency": args.concurrency,
        "disconnect_rate": args.disconnect_rate,
        "elapsed_s": round(elapsed, 1),
        "requests": len(results),
        "requests_per_s": round(len(results) / elapsed, 1) if elapsed else None,
        "outcomes": dict(sorted(outcomes.items())),
        "statuses": dict(sorted(statuses.items())),
        "disconnect_points": dict(sorted(disconnects.items())),
        "errors": len(results) - outcomes.get("ok", 0) - outcomes.get("disconnected", 0),
        "latency_ms": _percentiles(ok),
        "ttfb_ms": _percentiles(ttfb),
        "kills": kills,
        "lost_samples": [r.detail for r in results if r.outcome == "lost"][:5],
        "router_rss_kib": {
            "first": rss[0][1] if rss else None,
            "after_warmup": rss_start,
            "end": rss_end,
            "max": max((v for _, v in rss), default=None),
            "growth_after_warmup": round(growth, 4) if growth is not None else None,
            "samples": len(rss),
            "series": [[round(t, 1), v] for t, v in rss],
        },
        # the shadows are bounded by the KV capacity: RSS grows until they are full
        "shadow_fill_at_end": [
            {
                "blocks": round(w["shadow_blocks"] / max(1, w["shadow_capacity_blocks"]), 3),
                "radix": round(w["radix_tokens"] / max(1, w["radix_capacity_tokens"]), 3),
            }
            for w in workers
        ],
        "counters_at_end": totals,
        "router_in_flight_at_end": _metric(metrics, "cache_router_in_flight"),
        "router_retries": _metric_sum(metrics, "cache_router_retries_total"),
        "router_client_disconnects": sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("cache_router_requests_total{")
            and 'status="client_disconnect"' in line
        ),
        "circuit_opened": sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("cache_router_circuit_transitions_total{") and "open" in line
        ),
        "final_request": final.outcome,
        "worker_states": [{c: w.get(c) for c in ("url", "healthy", *COUNTERS)} for w in workers],
    }
    checks = {
        "no_counter_leak": not leaked and report["router_in_flight_at_end"] == 0,
        "nothing_lost": lost == 0,
        "still_serves": final.outcome == "ok",
        "rss_growth_ok": growth is None or growth <= args.max_rss_growth,
    }
    report["checks"] = checks
    report["passed"] = all(checks.values())
    return report


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {"p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "p50": round(float(p50), 1),
        "p90": round(float(p90), 1),
        "p99": round(float(p99), 1),
        "max": round(float(values.max()), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--concurrency", type=int, default=64, help="clients sending at once")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (0: none)")
    p.add_argument("--requests", type=int, default=0, help="stop after this many (0: none)")
    p.add_argument("--disconnect-rate", type=float, default=0.2, help="share that hang up")
    p.add_argument("--kill-workers", type=int, default=0, help="worker kills over the run")
    p.add_argument("--restart-after-s", type=float, default=3.0, help="a killed worker's downtime")
    p.add_argument("--workers", type=int, default=4, help="sim workers")
    p.add_argument("--time-scale", type=float, default=1.0, help="sim workers' speed-up")
    p.add_argument("--max-tokens", type=int, default=32, help="largest max_tokens asked")
    p.add_argument("--sessions", type=int, default=256, help="conversations")
    p.add_argument("--policy", default="lmetric", help="router policy")
    p.add_argument("--router-arg", action="append", default=[], help="extra serve flag (repeat)")
    p.add_argument(
        "--sim-worker-arg", action="append", default=[], help="extra sim-worker flag (repeat)"
    )
    p.add_argument("--warmup-s", type=float, default=30.0, help="RSS growth measured after this")
    p.add_argument("--max-rss-growth", type=float, default=0.10, help="allowed RSS growth")
    p.add_argument("--settle-s", type=float, default=30.0, help="wait for counters to reach 0")
    p.add_argument("--request-timeout-s", type=float, default=120.0, help="client timeout")
    p.add_argument("--progress-s", type=float, default=10.0, help="progress line interval")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--log-dir", help="child process logs (default: a temporary folder)")
    args = p.parse_args(argv)
    if not args.duration and not args.requests:
        p.error("give --duration or --requests")
    if args.requests:
        args.duration = args.duration if "--duration" in (argv or sys.argv) else 0
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(args, log_dir)
    try:
        fleet.start()
        try:
            import uvloop

            report = uvloop.run(run(args, fleet))
        except ImportError:  # pragma: no cover
            report = asyncio.run(run(args, fleet))
    finally:
        fleet.stop()
    report["logs"] = str(log_dir)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())

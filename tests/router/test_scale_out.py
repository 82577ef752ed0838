"""Scale-out, end to end: real router processes sharing a real redis-server, behind a real
haproxy (TCP, round-robin), replaying the bundled conversation sample against sim workers.

- two replicas behind haproxy, and ``serve --processes 2``, keep one router's true hit rate
  (the workers' own counters; guarded at 0.90x here, measured by bench/scale_out/scale_replay.py);
  without sharing the loss is printed (not asserted);
- a replica killed mid-replay: the other serves on, only requests it was streaming are lost
  (the client sends again what had not started, as the OpenAI SDK does), its load leaves the
  survivor's view within the TTL;
- Redis stopped mid-replay: 0 failed requests, ``state_sync_up`` 0 then 1, sharing resumes;
- a sticky session's turns sent alternately to two replicas land on one worker.

The replays are the slow suite (``CACHE_ROUTER_SLOW=1``, on in CI): ~8 minutes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))

from scale_support import Haproxy, RedisServer, need

import traces
from traces.live.fleet import Service, free_port, reset_caches, sim_workers
from traces.live.replay import ReplayConfig, ReplayOutcome, replay
from traces.trace.formats import load_trace

CONVERSATION = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"
BENCH = Path(__file__).parents[2] / "bench" / "scale_out" / "scale_replay.py"
_spec = importlib.util.spec_from_file_location("scale_replay", BENCH)
scale_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale_replay)
SLOW = pytest.mark.skipif(
    os.environ.get("CACHE_ROUTER_SLOW") != "1", reason="slow suite: set CACHE_ROUTER_SLOW=1"
)
SPEEDUP = 4.0
WINDOW_S = 180.0  # the trace's first 180 s (556 requests): ~45 s a replay
SIM_ARGS = ["--time-scale", str(SPEEDUP), "--kv-capacity-tokens", "1000000"]
TTL_S = 1.0


@pytest.fixture(scope="module")
def workers() -> Iterator[list[str]]:
    with sim_workers(4, SIM_ARGS) as sims:
        yield [s.url for s in sims]


@pytest.fixture
def redis(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def trace():
    return [r for r in load_trace(CONVERSATION) if r.arrival <= WINDOW_S]


def router(workers: list[str], *extra: str, name: str = "router") -> Service:
    return scale_replay.router(workers, "--state-load-ttl-s", str(TTL_S), *extra, name=name)


def run(url: str, workers: list[str], salt: int, name: str, retries: int = 0) -> ReplayOutcome:
    reset_caches(workers)
    cfg = ReplayConfig(url=url, speedup=SPEEDUP, prompt_mode="text", salt=salt,
                       max_output_tokens=64, worker_urls=tuple(workers),
                       retries=retries)  # fmt: skip
    return asyncio.run(replay(trace(), cfg, name))


def figures(outcome: ReplayOutcome) -> dict:
    return scale_replay.figures(outcome, SPEEDUP)


def metric(url: str, name: str) -> float | None:
    text = httpx.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def stop(*services: Service) -> None:
    for s in services:
        s.stop()


def report(name: str, rows: dict[str, dict]) -> None:
    print(f"\n{name}: " + json.dumps(rows, indent=1))


@SLOW
def test_replicas_and_processes_route_like_one_router():
    """Two replicas behind haproxy and ``--processes 2``, each run twice interleaved with one
    router, route like it. The bars (hit rate >= 0.95x, TTFT p90 <= 1.1x) are measured by
    bench/scale_out/scale_replay.py over 8 runs (bench/RESULTS.md). This guards against losing the
    sharing, which gives hit 0.60-0.68x of one router. Single replays on this 2-core machine
    span 0.109-0.148 in hit rate (shared) and 0.127-0.153 (one router), so the ratio of two
    2-run means has a spread of about 0.065: at 0.90x a configuration that routes like one
    router failed about 1 run in 10 (a CI run at 15:19 UTC 2026-11-23: shared 0.85x,
    --processes 0.93x). 0.80x sits about 3 spreads from the measured ratio (0.98x). TTFT is
    printed, not asserted: it is a latency on a 2-core machine that runs three routers, Redis,
    haproxy and the workers at once (a CI run at 21:50 UTC 2026-11-25: --processes 2 at 1.41x
    one router's p90 with the same hit rate, 0.99x), and its bar lives in the benchmark."""
    need("redis-server")
    need("haproxy")
    result = scale_replay.measure(reps=2, window_s=WINDOW_S, speedup=SPEEDUP)
    print("\n" + scale_replay.table(result))
    summary = result["summary"]
    one = summary[scale_replay.ONE]
    for name in (scale_replay.SHARED, scale_replay.PROCESSES):
        got = summary[name]
        assert got["errors"] == 0 and got["runs"] == 2, name
        assert all(r["requests"] == len(trace()) for r in result["runs"][name]), name
        assert got["hit_rate"] >= 0.80 * one["hit_rate"], name
    assert one["errors"] == 0


def _in_background(target) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def body() -> None:
        box["outcome"] = target()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


def _remote_in_flight(url: str) -> int:
    return sum(w["remote_num_requests"] for w in httpx.get(url + "/workers", timeout=5).json())


@SLOW
def test_a_replica_killed_mid_replay_loses_only_what_it_was_streaming(workers, redis, tmp_path):
    a = router(workers, "--state-url", redis.url, name="a")
    b = router(workers, "--state-url", redis.url, name="b")
    lb = Haproxy(tmp_path, free_port(), [a.url[7:], b.url[7:]]).start()
    try:
        # the client sends again what failed before its first token, as the OpenAI SDK does
        # (2 retries on connection errors): with an L4 balancer nothing else can
        thread, box = _in_background(lambda: run(lb.url, workers, 21, "kill", retries=2))
        time.sleep(0.4 * WINDOW_S / SPEEDUP)
        in_flight_b = metric(b.url, "cache_router_in_flight") or 0
        assert _remote_in_flight(a.url) >= 0
        b.process.send_signal(signal.SIGKILL)
        b.process.wait(5)
        killed_at = time.monotonic()
        deadline = killed_at + TTL_S + 2.0
        while _remote_in_flight(a.url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _remote_in_flight(a.url) == 0, "the dead replica's load haunts the survivor"
        thread.join(WINDOW_S / SPEEDUP + 60)
        outcome = box["outcome"]
    finally:
        lb.stop()
        stop(a, b)
    rows = {
        "kill b": {
            **figures(outcome),
            "b_in_flight_before_kill": in_flight_b,
            "retried": outcome.retried,
            "lost_streaming": outcome.lost_streaming,
        }
    }
    report("kill one replica", rows)
    # lost: only requests that were streaming from b (none that had not started)
    assert outcome.errors == outcome.lost_streaming, outcome.error_samples
    assert outcome.lost_streaming <= in_flight_b + 4
    assert outcome.run.requests + outcome.errors == len(trace())


@SLOW
def test_redis_stopped_mid_replay_fails_nothing_and_sharing_resumes(workers, redis, tmp_path):
    a = router(workers, "--state-url", redis.url, name="a")
    b = router(workers, "--state-url", redis.url, name="b")
    lb = Haproxy(tmp_path, free_port(), [a.url[7:], b.url[7:]]).start()
    try:
        thread, box = _in_background(lambda: run(lb.url, workers, 31, "redis-stop"))
        time.sleep(0.3 * WINDOW_S / SPEEDUP)
        redis.stop()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            metric(a.url, "cache_router_state_sync_up")
            or metric(b.url, "cache_router_state_sync_up")
        ):
            time.sleep(0.05)
        down = [metric(s.url, "cache_router_state_sync_up") for s in (a, b)]
        time.sleep(2.0)
        applied_before = metric(a.url, "cache_router_state_sync_applied_total")
        redis.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
            metric(a.url, "cache_router_state_sync_up")
            and metric(b.url, "cache_router_state_sync_up")
        ):
            time.sleep(0.05)
        up = [metric(s.url, "cache_router_state_sync_up") for s in (a, b)]
        thread.join(WINDOW_S / SPEEDUP + 60)
        outcome = box["outcome"]
        applied_after = metric(a.url, "cache_router_state_sync_applied_total")
        errors = metric(a.url, "cache_router_state_sync_errors_total")
    finally:
        lb.stop()
        stop(a, b)
    report("redis stopped", {"redis stop": figures(outcome)})
    assert down == [0.0, 0.0] and up == [1.0, 1.0]
    assert outcome.errors == 0 and outcome.run.requests == len(trace())
    assert (errors or 0) > 0 and (applied_after or 0) > (applied_before or 0)


def alternate_turns(a: Service, b: Service, session: str) -> list[str]:
    """A session's 6 turns sent to a, b, a, ...; the worker each landed on. Before them b
    starts a long request (no session) on its first worker, so b's view of the load differs
    from a's unless they share it."""
    busy = threading.Thread(
        target=lambda: httpx.post(
            b.url + "/v1/completions",
            json={"model": "sim-model", "prompt": "busy " * 50, "max_tokens": 4000},
            timeout=120,
        ),
        daemon=True,
    )
    busy.start()
    deadline = time.monotonic() + 10
    while not any(w["num_requests"] for w in httpx.get(b.url + "/workers", timeout=5).json()):
        assert time.monotonic() < deadline, "the long request never started"
        time.sleep(0.02)
    time.sleep(0.1)  # a few load intervals: a sees it too when they share
    chosen = []
    history = "You are a helpful assistant. " * 40
    for turn in range(6):
        history += f" Turn {turn}: tell me more about the number {turn * 7919}."
        reply = httpx.post(
            (a, b)[turn % 2].url + "/v1/completions",
            json={"model": "sim-model", "prompt": history, "max_tokens": 4},
            headers={"X-Session-ID": session},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        chosen.append(reply.headers["x-cache-router-worker"])
        time.sleep(0.05)  # a user's next turn comes later than one sync flush (5 ms)
    return chosen


def test_a_sticky_sessions_turns_alternating_replicas_land_on_one_worker(workers, redis):
    quick = ["--policy", "sticky", "--shutdown-timeout-s", "1"]  # the long request is cut
    a = router(workers, "--state-url", redis.url, *quick, name="a")
    b = router(workers, "--state-url", redis.url, *quick, name="b")
    try:
        shared = alternate_turns(a, b, "alternating")
    finally:
        stop(a, b)
    assert len(set(shared)) == 1, shared
    # the same without sharing: each replica binds the session where its own view says
    a, b = router(workers, *quick, name="a"), router(workers, *quick, name="b")
    try:
        alone = alternate_turns(a, b, "alternating-alone")
    finally:
        stop(a, b)
    assert len(set(alone)) == 2, alone

"""Precise mode live, without vLLM: ``cache-router serve --kv-events`` in front of sim workers
that publish their KV events over ZMQ (``sim-worker --kv-events-config``), in both directions
(the router binds / the worker binds and the router connects) and both flavors (vLLM's and
SGLang's encoding). Real processes, real sockets, 127.0.0.1 only.

- a multi-turn replay: every booking is answered by a synced index, and its estimates match
  what the workers report (the shadow error of the KV index ~0 under concurrency, and exactly
  0 for requests sent one at a time once the events have arrived);
- a batch lost on the way (``--kv-events-drop``) is a gap: the router replays it from the
  worker's replay socket and stays exact; without replay the index goes unsynced (the shadow
  answers) until the worker's cache is reset (``AllBlocksCleared``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from traces.live.fleet import free_port, kv_events_args, router, sim_workers, start_service
from traces.live.replay import ReplayConfig, replay
from traces.trace.prompts import prompt_token_ids
from traces.trace.synth import SynthConfig, synthesize

WORKER = ["--time-scale", "20", "--kv-capacity-tokens", str(96 * 512)]


def workers_of(url: str) -> dict[str, dict[str, Any]]:
    return {w["url"]: w for w in httpx.get(f"{url}/workers", timeout=10).json()}


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def kv_ready(url: str, n: int) -> bool:
    kv = [w["kv_events"] or {} for w in workers_of(url).values()]
    return len(kv) == n and all(
        k.get("connected") and k.get("synced") and not k.get("replaying") for k in kv
    )


def totals(url: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in workers_of(url).values():
        for key, value in {**w["accuracy"], **(w["kv_events"] or {})}.items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
    return out


def complete(url: str, ids: list[int]) -> httpx.Response:
    body = {"model": "sim-model", "prompt": ids, "max_tokens": 4}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30_000 + 1 for i in range(n)]


def settled(url: str, quiet_s: float = 0.3, timeout: float = 20.0) -> dict[str, int]:
    """The totals once no KV event batch has arrived for ``quiet_s``: every event the idle
    workers published has reached the index."""
    deadline = time.monotonic() + timeout
    before = totals(url)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = totals(url)
        if now["batches"] == before["batches"]:
            return now
        before = now
    pytest.fail(f"KV event batches still arriving after {timeout} s")


@pytest.mark.slow  # three live multi-turn replays, ~40 s each on 2 cores
@pytest.mark.parametrize(
    ("direction", "flavor"),
    [("worker-binds", "vllm"), ("router-binds", "vllm"), ("worker-binds", "sglang")],
)
def test_multi_turn_replay_index_matches_the_workers(direction: str, flavor: str) -> None:
    trace = synthesize(
        SynthConfig(sessions=30, rate=3.0, think_time=1.0, user_tokens=600.0, output_tokens=16.0,
                    turns_alpha=0.8, max_turns=8, system_prompts=2, seed=5)
    )  # 96 requests, 3.8k prompt tokens on average, up to 8 turns  # fmt: skip
    assert len({r.session_id for r in trace}) < len(trace)  # later turns extend earlier ones
    last_turns = list({r.session_id: r for r in trace}.values())[:12]
    args = ["--kv-events"] + (["--kv-events-connect"] if direction == "worker-binds" else [])
    small = ["--time-scale", "20", "--kv-capacity-tokens", str(32 * 512)]  # evictions
    with sim_workers(3, [*small, "--flavor", flavor], kv_events=direction) as workers:
        urls = [w.url for w in workers]
        with router(urls, "lmetric", args) as svc:
            wait_until(lambda: kv_ready(svc.url, 3), "synced publishers")
            config = ReplayConfig(url=svc.url, speedup=4.0, max_output_tokens=16)
            outcome = asyncio.run(replay(trace, config, "lmetric"))
            assert outcome.errors == 0 and outcome.worker_hit_rate is not None
            t = settled(svc.url)
            # quiescent: one request at a time on idle workers whose every event has arrived
            for req in last_turns:
                complete(svc.url, prompt_token_ids(req))
                quiet = settled(svc.url)
    # every booking is answered by the index, but for a worker's first ones before it knows
    # the block size (from the first stored event, or vLLM's /metrics)
    assert t["requests"] == len(trace) and t["kv_events_requests"] >= len(trace) - 3
    assert t["stored"] > 0 and t["removed"] > 0 and t["gaps"] == 0  # evictions are followed
    # Under concurrency a request can wait behind another whose admission evicts blocks the
    # index (rightly) listed at dispatch: the worker then reports less than the estimate. One
    # such request is ~1% of this trace's prompt tokens (seen on a loaded 2-core CI machine).
    error = t["kv_events_abs_error_tokens"] / t["kv_events_prompt_tokens"]
    assert error <= 0.02, (error, t)
    assert t["reported_tokens"] > 0  # the multi-turn prefixes did hit
    # ... and with nothing in flight the index is exact: every estimate equals the report
    probes = {k: quiet[k] - t[k] for k in ("kv_events_requests", "kv_events_reported_tokens",
                                           "kv_events_abs_error_tokens")}  # fmt: skip
    assert probes["kv_events_requests"] == len(last_turns), probes
    assert probes["kv_events_reported_tokens"] > 0, probes  # the probes hit cached prefixes
    assert probes["kv_events_abs_error_tokens"] == 0, probes


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_lost_batch_is_replayed(flavor: str) -> None:
    port = free_port()
    worker_args = ["sim-worker", "--host", "127.0.0.1", "--port", str(port), *WORKER,
                   "--flavor", flavor, "--kv-events-drop", "1",
                   *kv_events_args(port, "worker-binds")]  # fmt: skip
    worker = start_service("sim-worker", worker_args, port)
    try:
        with router([worker.url], "round_robin", ["--kv-events", "--kv-events-connect"]) as svc:
            wait_until(lambda: kv_ready(svc.url, 1), "a synced publisher")
            a, b = prompt(1, 3000), prompt(2, 2500)
            complete(svc.url, a)  # batch 0
            complete(svc.url, b)  # batch 1: dropped on the way
            complete(svc.url, prompt(3, 1800))  # batch 2: the gap shows, 1 is replayed
            wait_until(lambda: totals(svc.url)["batches"] == 3, "the replayed batch")
            r = complete(svc.url, b)  # the index knows b's blocks although batch 1 was lost
            t = totals(svc.url)
    finally:
        worker.stop()
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 2048
    assert t["gaps"] == 1 and t["replays"] >= 2
    assert t["kv_events_requests"] >= 3 and t["kv_events_abs_error_tokens"] == 0


def test_without_replay_the_index_falls_back_until_cleared() -> None:
    port = free_port()
    events = kv_events_args(port, "worker-binds", replay=False)
    worker_args = ["sim-worker", "--host", "127.0.0.1", "--port", str(port), *WORKER,
                   "--kv-events-drop", "1", *events]  # fmt: skip
    worker = start_service("sim-worker", worker_args, port)
    url = worker.url
    try:
        args = ["--kv-events", "--kv-events-connect", "--kv-events-replay-offset", "0"]
        with router([url], "round_robin", args) as svc:
            wait_until(lambda: workers_of(svc.url)[url]["kv_events"]["connected"], "publisher")
            time.sleep(0.2)  # the subscription reaches the worker (no replay to catch up)
            complete(svc.url, prompt(4, 1200))  # batch 0: a complete history, synced
            wait_until(lambda: workers_of(svc.url)[url]["kv_events"]["synced"], "synced")
            complete(svc.url, prompt(5, 1300))  # batch 1: lost
            complete(svc.url, prompt(6, 1400))  # batch 2: a gap nobody can fill
            wait_until(lambda: not workers_of(svc.url)[url]["kv_events"]["synced"], "unsynced")
            before = totals(svc.url)["kv_events_requests"]
            complete(svc.url, prompt(7, 1500))  # the shadow answers
            assert totals(svc.url)["kv_events_requests"] == before
            assert httpx.post(f"{url}/reset_prefix_cache", timeout=10).status_code == 200
            wait_until(lambda: workers_of(svc.url)[url]["kv_events"]["synced"], "resynced")
            complete(svc.url, prompt(8, 1600))
            t = totals(svc.url)
    finally:
        worker.stop()
    assert t["desyncs"] >= 1 and t["cleared"] == 1
    assert t["kv_events_requests"] == before + 1 and t["kv_events_abs_error_tokens"] == 0

"""Precise mode against real vLLM: the router binds, vLLM's publishers connect; the index
follows what the workers store, evict and clear, even for traffic the router never saw; a
router that starts late catches up by replay; without replay it falls back to the estimate
until the worker's cache is cleared."""

from __future__ import annotations

import pytest
from realworkers_support import (
    ENABLED,
    SKIP_REASON,
    cached,
    complete,
    kv_ready,
    reset,
    routed,
    text,
    unique,
    wait_until,
    workers_of,
)

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)

WORKER_HEADER = "x-cache-router-worker"


def kv(url: str, worker: str) -> dict:
    return workers_of(url)[worker]["kv_events"]


def accuracy(url: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for entry in workers_of(url).values():
        for key, value in entry["accuracy"].items():
            total[key] = total.get(key, 0) + value
    return total


def test_index_follows_the_worker_including_traffic_it_did_not_route(real_workers) -> None:
    args = ("--kv-events", "--tokenizer", str(real_workers.model), "--block-size", "32")
    with routed(real_workers.urls, "lmetric", *args) as svc:
        wait_until(lambda: kv_ready(svc.url, len(real_workers.urls)), what="publishers")
        prompt = unique("kv-a") + text(7000, 3000)
        first = complete(svc.url, prompt)
        worker = first.headers[WORKER_HEADER]
        wait_until(lambda: kv(svc.url, worker)["synced"], what="a synced index")
        again = complete(svc.url, prompt)
        assert again.headers[WORKER_HEADER] == worker and cached(again) > 0
        acc = accuracy(svc.url)
        assert acc["kv_events_requests"] == 2 and acc["kv_events_abs_error_tokens"] == 0

        # traffic the router never saw: a reset and a request straight to the worker
        cleared = kv(svc.url, worker)["cleared"]
        reset(worker)
        other = unique("kv-b") + text(12_000, 3000)
        complete(worker, other)
        wait_until(lambda: kv(svc.url, worker)["cleared"] > cleared, what="AllBlocksCleared")
        # the index knows: the prompt the router routed is gone, the other one is there
        gone = complete(svc.url, prompt)
        assert cached(gone) == 0
        there = complete(svc.url, other)
        assert there.headers[WORKER_HEADER] == worker and cached(there) > 0
        acc = accuracy(svc.url)
        assert acc["kv_events_requests"] == 4 and acc["kv_events_abs_error_tokens"] == 0
        assert acc["blocks_abs_error_tokens"] > 0  # the shadow could not have known


def test_late_router_catches_up_by_replay(real_workers) -> None:
    worker = real_workers.urls[1]
    prompt = unique("kv-late") + text(15_000, 3000)
    complete(worker, prompt)  # nobody listens: only the worker's replay buffer has it
    args = ("--kv-events", "--tokenizer", str(real_workers.model), "--block-size", "32")
    with routed(real_workers.urls, "lmetric", *args) as svc:
        wait_until(lambda: kv_ready(svc.url, len(real_workers.urls)), what="publishers")
        state = kv(svc.url, worker)
        assert state["synced"] and state["replays"] >= 1 and state["blocks"] > 0
        r = complete(svc.url, prompt)
        assert r.headers[WORKER_HEADER] == worker and cached(r) > 0
        acc = accuracy(svc.url)
        assert acc["kv_events_requests"] == 1 and acc["kv_events_abs_error_tokens"] == 0


def test_without_replay_it_falls_back_until_cleared(real_workers) -> None:
    args = ("--kv-events", "--kv-events-replay-offset", "0", "--tokenizer", str(real_workers.model))
    with routed(real_workers.urls, "round_robin", *args) as svc:
        wait_until(lambda: kv_ready(svc.url, len(real_workers.urls)), what="publishers")
        worker = real_workers.urls[2]
        complete(worker, unique("kv-gap") + text(20_000, 1000))
        wait_until(lambda: kv(svc.url, worker)["last_seq"] is not None, what="a live batch")
        assert not kv(svc.url, worker)["synced"]  # it has a history the router missed
        before = accuracy(svc.url)["kv_events_requests"]
        r = complete(svc.url, unique("kv-gap2") + text(21_000, 1000))
        assert r.status_code == 200
        assert accuracy(svc.url)["kv_events_requests"] == before  # the shadow answered
        reset(worker)
        complete(worker, unique("kv-gap3") + text(22_000, 1000))
        wait_until(lambda: kv(svc.url, worker)["synced"], what="resync on AllBlocksCleared")

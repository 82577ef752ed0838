"""The worker circuit of router.fleet.pool: opens at the failure threshold, stays open for
``circuit_open_s``, closes on the next success after that, never opens on the last healthy
worker from request failures alone, and shows in the metrics."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from router.config import load_settings
from router.core.metrics import RouterMetrics
from router.fleet.pool import WorkerPool


@pytest.fixture
def clock(monkeypatch):
    """A hand-driven time.monotonic for router.fleet.pool."""
    now = [1000.0]
    monkeypatch.setattr("router.fleet.pool.time.monotonic", lambda: now[0])
    return now


def pool(**kw) -> WorkerPool:
    values = {"workers": ["a:1", "b:2", "c:3"], "health_failure_threshold": 3, **kw}
    return WorkerPool(load_settings(**values))


def test_opens_at_the_threshold_and_closes_after_the_cool_down(clock):
    p = pool(circuit_open_s=5)
    w = p.workers[0]
    for i in range(3):
        assert w.healthy, i
        p.record_failure(w, "HTTP 500", request=True)
    assert not w.healthy and w.stats.circuit == {"open": 1}
    clock[0] += 4.9
    p.record_success(w)  # a probe answered, but the circuit is still cooling down
    assert not w.healthy and w.consecutive_failures == 3
    clock[0] += 0.2
    p.record_success(w)
    assert w.healthy and w.consecutive_failures == 0
    assert w.stats.circuit == {"open": 1, "closed": 1}


def test_a_success_restarts_the_count(clock):
    p = pool()
    w = p.workers[0]
    for _ in range(5):
        p.record_failure(w, "reset", request=True)
        p.record_failure(w, "reset", request=True)
        p.record_success(w)
    assert w.healthy and w.stats.circuit == {}


def test_a_passing_probe_does_not_hide_failing_requests(clock):
    """Gray failure: /health answers 200 between requests that fail; the circuit still opens
    at the threshold. A probe after probe failures does restart the count."""
    p = pool()
    w = p.workers[0]
    for _ in range(2):
        p.record_failure(w, "HTTP 500", request=True)
        p.record_success(w, probe=True)
    assert w.healthy and w.consecutive_failures == 2
    p.record_failure(w, "HTTP 500", request=True)
    assert not w.healthy
    v = p.workers[1]
    p.record_failure(v, "health probe: timeout")
    p.record_failure(v, "health probe: timeout")
    p.record_success(v, probe=True)
    assert v.healthy and v.consecutive_failures == 0


def test_request_failures_never_take_out_the_last_healthy_worker(clock):
    p = pool(circuit_open_s=0)
    a, b, c = p.workers
    for w in (a, b):
        for _ in range(3):
            p.record_failure(w, "HTTP 500", request=True)
    assert not a.healthy and not b.healthy
    for _ in range(10):
        p.record_failure(c, "HTTP 500", request=True)
    assert c.healthy and c.consecutive_failures == 10  # relaying its 5xx beats a 503
    p.record_failure(c, "health probe: timeout")  # probes can
    assert not c.healthy


def test_a_removed_worker_never_comes_back(clock):
    p = pool(circuit_open_s=0)
    w = p.workers[0]
    for _ in range(3):
        p.record_failure(w, "connect refused")
    p.remove(w.url)
    p.record_success(w)
    assert not w.healthy and w not in p.workers


def test_circuit_metrics(clock):
    p = pool(circuit_open_s=0)
    metrics = RouterMetrics("lmetric")
    metrics.watch(p)
    w = p.workers[1]
    for _ in range(3):
        p.record_failure(w, "reset", request=True)
    p.record_success(w)
    p.record_failure(w, "reset", request=True)
    text = generate_latest(metrics.registry).decode()
    url = w.url
    assert f'cache_router_circuit_transitions_total{{state="open",worker="{url}"}} 1.0' in text
    assert f'cache_router_circuit_transitions_total{{state="closed",worker="{url}"}} 1.0' in text
    assert f'cache_router_worker_consecutive_failures{{worker="{url}"}} 1.0' in text

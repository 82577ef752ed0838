"""The Prometheus exposition: every documented metric, per-app registries."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.config import load_settings
from router.proxy.app import create_app

EXPECTED = {
    "cache_router_requests",
    "cache_router_request_duration_seconds",
    "cache_router_time_to_first_byte_seconds",
    "cache_router_pick_duration_seconds",
    "cache_router_decisions",
    "cache_router_prompt_tokens",
    "cache_router_estimated_hit_tokens",
    "cache_router_best_hit_tokens",
    "cache_router_reported_requests",
    "cache_router_reported_cached_tokens",
    "cache_router_estimated_cached_tokens",
    "cache_router_shadow_abs_error_tokens",
    "cache_router_worker_in_flight",
    "cache_router_worker_pending_prefill_tokens",
    "cache_router_worker_healthy",
    "cache_router_worker_shadow_blocks",
    "cache_router_worker_pinned_blocks",
    "cache_router_worker_shadow_capacity_blocks",
    "cache_router_worker_radix_tokens",
    "cache_router_worker_radix_capacity_tokens",
    "cache_router_retries",
    "cache_router_upstream_errors",
    "cache_router_shadow_corrections",
    "cache_router_tokenize",
}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_two_apps_have_separate_registries():
    a = create_app(load_settings(workers=["a:1"]))
    b = create_app(load_settings(workers=["b:1", "c:1"], policy="unified"))
    assert a.metrics.registry is not b.metrics.registry
    fa = families(httpx_free_exposition(a))
    fb = families(httpx_free_exposition(b))
    assert len(fa["cache_router_worker_healthy"].samples) == 1
    assert len(fb["cache_router_worker_healthy"].samples) == 2


def httpx_free_exposition(app) -> str:
    from prometheus_client import generate_latest

    return generate_latest(app.metrics.registry).decode()


def test_every_metric_is_exported_after_traffic(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], policy="unified")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for _ in range(3):
            client.post("/v1/completions", json={"prompt": "hello " * 1000, "user": "u"})
        text = client.get("/metrics").text
    found = families(text)
    assert set(found) >= EXPECTED, EXPECTED - set(found)
    requests = found["cache_router_requests"].samples
    assert any(
        s.labels == {"worker": worker.url, "policy": "unified", "status": "200"} and s.value == 3
        for s in requests
    )
    decisions = {s.labels["branch"] for s in found["cache_router_decisions"].samples}
    assert "affinity_stick" in decisions
    hit = found["cache_router_estimated_hit_tokens"].samples[0].value
    assert hit > 0  # turns 2 and 3 hit the shadow
    assert found["cache_router_reported_cached_tokens"].samples[0].value > 0


def test_histograms_export_as_prometheus_client_would():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from router.core.metrics import LATENCY_BUCKETS, RouterMetrics

    ours = RouterMetrics("ttft")
    registry = CollectorRegistry()
    theirs = Histogram(
        "cache_router_request_duration_seconds",
        "Time from request arrival to the last byte sent (or the error)",
        ["policy", "endpoint"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    for value in (0.0001, 0.0005, 0.0007, 0.01, 1.0, 400.0):  # edges, inside, past the last
        ours.duration("chat").observe(value)
        theirs.labels("ttft", "chat").observe(value)

    def lines(text: str) -> list[str]:
        return [
            line
            for line in text.splitlines()
            if "request_duration" in line and "_created" not in line
        ]

    expected = lines(generate_latest(registry).decode())
    assert len(expected) > 20
    assert lines(generate_latest(ours.registry).decode()) == expected

"""Flow control through ``serve`` (real HTTP on 127.0.0.1): priority order, shedding, limits,
TTL, a client gone while queued, the metrics and ``/workers/flow``; off: nothing changes.

The fleet is one fake worker and the router's model of it: 1000 prompt tokens a request at a
configured 500 tokens/s (two seconds of predicted prefill each) against a 2.5 s target, so a
second request is predicted past the target while one is booked, and waits."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import wait_until
from flow_support import FLOW, flow_prompt
from prometheus_client.parser import text_string_to_metric_families


def body(tag: str) -> dict:
    return {"model": "fake-model", "prompt": flow_prompt(tag), "max_tokens": 4}


def tag(seen: dict) -> str:
    """The tag of a request the worker saw."""
    return seen["body"]["prompt"][:16].rstrip("-")


async def post(client: httpx.AsyncClient, tag: str, **headers: str) -> httpx.Response:
    return await client.post("/v1/completions", json=body(tag), headers=headers)


async def arrived(worker, n: int = 1) -> None:
    """Wait (5 s at most) until ``worker`` has received ``n`` requests: the router placed
    them, so the fleet is saturated for the next (a fixed sleep races a loaded machine)."""
    for _ in range(250):
        if len(worker.requests) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the worker got {len(worker.requests)} of {n} requests")


async def in_queue(router, n: int = 1) -> None:
    """Wait (5 s at most) until ``n`` requests wait in the router's flow-control queue."""
    for _ in range(250):
        if len(router.app.core.flow.queue) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(router.app.core.flow.queue)} of {n} requests queued")


def metrics(router) -> dict:
    text = httpx.get(router.url + "/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            out[key] = sample.value
    return out


def value(table: dict, name: str, **labels: str) -> float:
    return table.get((name, tuple(sorted(labels.items()))), 0.0)


def settled(router) -> bool:
    flow = router.app.core.flow
    return router.app.pool.stats.in_flight == 0 and (flow is None or len(flow.queue) == 0)


async def test_higher_priority_goes_first_and_everything_is_answered(fake_workers, router_server):
    # the blocker stays in prefill 1.2 s: past that, or once 1.5 of its predicted 2 s are gone,
    # "low" would be placed, not queued (CI failed once at 0.6 s on a loaded machine)
    (worker,) = fake_workers(1, delay=1.2)
    router = router_server(workers=[worker.url], **FLOW)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        blocker = asyncio.create_task(post(client, "blocker"))
        await arrived(worker)
        low = asyncio.create_task(post(client, "low", **{"x-priority": "0"}))
        await in_queue(router)
        high = asyncio.create_task(post(client, "high", **{"x-priority": "5"}))
        answers = await asyncio.gather(blocker, low, high)
    assert [a.status_code for a in answers] == [200, 200, 200]
    order = [tag(r) for r in worker.requests]
    assert order == ["blocker", "high", "low"]
    assert wait_until(lambda: settled(router))
    m = metrics(router)
    assert value(m, "cache_router_flow_dispatched_total", band="5", flow="default") == 1
    assert value(m, "cache_router_flow_dispatched_total", band="0", flow="default") == 2
    assert value(m, "cache_router_flow_wait_seconds_count", band="5") == 1
    assert value(m, "cache_router_in_flight") == 0
    text = httpx.get(router.url + "/metrics", timeout=5).text
    assert "# TYPE cache_router_flow_queued gauge" in text


async def test_shedding_and_the_queue_limit_answer_429_with_retry_after(
    fake_workers, router_server
):
    (worker,) = fake_workers(1, delay=1.0)
    router = router_server(workers=[worker.url], flow_queue_max=1, **FLOW)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        blocker = asyncio.create_task(post(client, "blocker"))
        await arrived(worker)
        shed = await post(client, "shed", **{"x-priority": "-1"})
        queued = asyncio.create_task(
            post(client, "queued", **{"x-llm-d-inference-fairness-id": "t1"})
        )
        await in_queue(router)
        over = await post(client, "over", **{"x-llm-d-inference-fairness-id": "t2"})
        flow_view = (await client.get("/workers/flow")).json()
        rest = await asyncio.gather(blocker, queued)
    for refused, code in ((shed, "flow_shed"), (over, "flow_queue_full")):
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == code and error["type"] == "rate_limit_error"
    assert [r.status_code for r in rest] == [200, 200]
    assert flow_view["queued"] == 1 and flow_view["bands"]["0"]["flows"]["t1"]["queued"] == 1
    assert wait_until(lambda: settled(router))
    m = metrics(router)
    rejected = "cache_router_flow_rejected_total"
    assert value(m, rejected, band="-1", flow="default", reason="shed") == 1
    assert value(m, rejected, band="0", flow="t2", reason="queue_full") == 1
    assert value(m, "cache_router_flow_dispatched_total", band="0", flow="t1") == 1
    assert value(m, "cache_router_requests_total", worker="none", policy="ttft", status="429") == 2


async def test_a_request_past_its_ttl_is_refused(fake_workers, router_server):
    (worker,) = fake_workers(1, delay=1.0)
    router = router_server(workers=[worker.url], flow_queue_ttl_s=0.2, **FLOW)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        blocker = asyncio.create_task(post(client, "blocker"))
        await arrived(worker)
        late = await post(client, "late")
        assert (await blocker).status_code == 200
    assert late.status_code == 429 and late.json()["error"]["code"] == "flow_ttl"
    assert wait_until(lambda: settled(router))
    m = metrics(router)
    assert value(m, "cache_router_flow_rejected_total", band="0", flow="default", reason="ttl") == 1


async def test_a_client_gone_while_queued_leaves_nothing_behind(fake_workers, router_server):
    (worker,) = fake_workers(1, delay=1.0)
    router = router_server(workers=[worker.url], **FLOW)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        blocker = asyncio.create_task(post(client, "blocker"))
        await arrived(worker)
        with pytest.raises(httpx.TimeoutException):
            await client.post("/v1/completions", json=body("gone"), timeout=0.2)
        assert (await blocker).status_code == 200
    assert wait_until(lambda: settled(router))
    m = metrics(router)
    reason = "client_disconnect"
    assert (
        value(m, "cache_router_flow_rejected_total", band="0", flow="default", reason=reason) == 1
    )
    assert [tag(r) for r in worker.requests] == ["blocker"]
    # counted in requests_total like a client that leaves mid-body: every request is there
    status = {"status": reason}
    assert value(m, "cache_router_requests_total", worker="none", policy="ttft", **status) == 1
    assert value(m, "cache_router_endpoint_requests_total", endpoint="completion", **status) == 1


async def test_a_model_no_worker_serves_is_a_404_at_once_even_while_others_wait(
    fake_workers, router_server
):
    """No wait can make a worker serve the model: the pick's 404 now, not a 429 after the
    TTL behind the queue's head."""
    (worker,) = fake_workers(1, delay=1.0)
    router = router_server(workers=[worker.url], **FLOW)
    assert wait_until(lambda: all(w.models for w in router.app.pool.workers))
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        blocker = asyncio.create_task(post(client, "blocker"))
        await arrived(worker)
        queued = asyncio.create_task(post(client, "queued", **{"x-priority": "1"}))
        for _ in range(250):  # (on this loop: the queued request is sent meanwhile)
            if len(router.app.core.flow.queue) == 1:
                break
            await asyncio.sleep(0.02)
        unknown = {**body("unknown"), "model": "no-such-model"}
        answer = await client.post("/v1/completions", json=unknown)
        assert len(router.app.core.flow.queue) == 1  # answered while the other still waits
        assert [(await r).status_code for r in (blocker, queued)] == [200, 200]
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    assert wait_until(lambda: settled(router))


def test_the_flow_gauges_read_0_when_nothing_waits(fake_workers, router_server):
    """An empty queue is a 0 sample (a series that vanishes reads as unknown, not empty),
    for every label pair counted so far."""
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], **FLOW)
    m = metrics(router)
    assert value(m, "cache_router_flow_queued", band="0", flow="default") == 0
    assert ("cache_router_flow_queued", (("band", "0"), ("flow", "default"))) in m
    assert ("cache_router_flow_queued_bytes", (("band", "0"),)) in m
    assert ("cache_router_flow_predicted_ttft_seconds", ()) in m
    answer = httpx.post(
        router.url + "/v1/completions", json=body("a"), headers={"x-priority": "3"}, timeout=5
    )
    assert answer.status_code == 200
    m = metrics(router)
    assert ("cache_router_flow_queued", (("band", "3"), ("flow", "default"))) in m
    assert value(m, "cache_router_flow_queued_bytes", band="3") == 0
    assert value(m, "cache_router_flow_predicted_ttft_seconds") > 0


async def test_no_worker_is_a_503_with_retry_after(router_server):
    router = router_server(workers=[], **FLOW)
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        answer = await post(client, "alone")
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["code"] == "no_healthy_worker"
    assert settled(router)


def test_off_by_default_no_queue_and_no_flow_metrics(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url])
    assert router.app.core.flow is None
    assert httpx.post(router.url + "/v1/completions", json=body("a"), timeout=5).status_code == 200
    assert "cache_router_flow_" not in httpx.get(router.url + "/metrics", timeout=5).text
    assert httpx.get(router.url + "/workers/flow", timeout=5).json() == {"enabled": False}


def test_on_with_its_defaults_an_idle_fleet_serves_at_once(fake_workers, router_server):
    """``--flow-control`` alone, as the docs ship it: the 2 s target, nothing queued on an
    idle fleet, the dispatch counted by band and flow."""
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], flow_control=True)
    for name in ("a", "b"):
        answer = httpx.post(router.url + "/v1/completions", json=body(name), timeout=5)
        assert answer.status_code == 200
    flow = httpx.get(router.url + "/workers/flow", timeout=5).json()
    assert flow["target_ttft_s"] == 2.0 and flow["queued"] == 0
    assert flow["dispatched"] == {"0": {"default": 2}} and flow["rejected"] == {}
    assert settled(router)


def test_flags_of_serve_and_epp():
    from router.cli import build_parser
    from router.service.command import settings_from_args

    for command in ("serve", "epp"):
        args = build_parser().parse_args(
            [
                command, "--worker", "http://a:1", "--flow-control",
                "--flow-target-ttft-s", "1.5", "--flow-objective", "interactive=1",
                "--flow-objective", "batch=-1", "--flow-weight", "gold=2",
                "--flow-fairness-header", "x-tenant",
            ]
        )  # fmt: skip
        s = settings_from_args(args)
        assert s.flow_control and s.flow_target_ttft_s == 1.5
        assert s.flow_objectives == {"interactive": 1, "batch": -1}
        assert s.flow_weights == {"gold": 2.0} and s.flow_fairness_header == "x-tenant"

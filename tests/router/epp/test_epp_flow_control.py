"""Flow control through the endpoint picker's real gRPC service: the ext_proc stream is held
until the request's turn (a higher priority first), a sheddable request is an immediate 429
with Retry-After, and a stream closed while queued leaves nothing behind.

As in tests/router/proxy/test_flow_control.py: 1000 prompt tokens a request at a configured
500 tokens/s against a 2.5 s target. Envoy moves no bytes here, so a booking's prefill
stays pending until its stream ends: the queue moves when streams close."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
from prometheus_client import generate_latest

sys.path.insert(0, str(Path(__file__).parent))

from ext_proc_support import (
    Picker,
    booked,
    header_of,
    read_until_closed,
    request_body,
    request_headers,
    routed_to,
    router_app,
    settled,
)
from flow_support import FLOW, flow_prompt


def prompt(tag: str) -> bytes:
    return orjson.dumps({"model": "fake-model", "prompt": flow_prompt(tag), "max_tokens": 4})


async def routed(call) -> bytes | None:
    """The endpoint the stream's answers name once routed (BUFFERED: after the body)."""
    while True:
        answer = await call.read()
        if answer.WhichOneof("response") in ("request_body", "immediate_response"):
            return routed_to(answer)


def messages(tag: str, priority: str | None = None) -> list:
    extra = [("x-priority", priority.encode())] if priority is not None else []
    return [request_headers("POST", "/v1/completions", extra=extra), request_body(prompt(tag))]


async def test_the_stream_is_held_until_its_turn_higher_priority_first(fake_workers) -> None:
    (worker,) = fake_workers(1)
    async with router_app([worker.url], **FLOW) as app, Picker(app) as picker:
        first = picker.hold(messages("first"))
        assert await asyncio.wait_for(routed(first), 5) is not None
        low = picker.hold(messages("low", "0"))
        low_answer = asyncio.ensure_future(routed(low))
        for _ in range(250):  # low queued before high is sent (a fixed sleep races a load)
            if len(app.core.flow.queue) >= 1:
                break
            await asyncio.sleep(0.02)
        high = picker.hold(messages("high", "5"))
        high_answer = asyncio.ensure_future(routed(high))
        await asyncio.sleep(0.2)
        assert not low_answer.done() and not high_answer.done()  # both held
        assert app.core.flow.queue.ahead_of(0) == 2
        # the first request's own prefill drains (the model's clock): the high one goes
        assert await asyncio.wait_for(high_answer, 5) is not None
        await asyncio.sleep(0.2)
        assert not low_answer.done()  # still behind the two booked prefills
        first.cancel()
        high.cancel()
        assert await asyncio.wait_for(low_answer, 5) is not None
        low.cancel()
        assert await settled(lambda: app.pool.stats.in_flight == 0 and booked(app) == 0)
        exposed = generate_latest(app.metrics.registry).decode()
        assert 'cache_router_flow_dispatched_total{band="5",flow="default"} 1.0' in exposed
        assert 'cache_router_flow_dispatched_total{band="0",flow="default"} 2.0' in exposed
        assert len(app.core.flow.queue) == 0


async def test_sheddable_is_an_immediate_429_and_a_closed_stream_leaves_the_queue(
    fake_workers,
) -> None:
    (worker,) = fake_workers(1)
    async with router_app([worker.url], **FLOW) as app, Picker(app) as picker:
        first = picker.hold(messages("first"))
        await asyncio.wait_for(routed(first), 5)
        answers = await asyncio.wait_for(read_until_closed(picker.hold(messages("shed", "-1"))), 5)
        refused = answers[-1].immediate_response
        assert refused.status.code == 429 and refused.details == "flow_shed"
        assert header_of(refused, "retry-after") == b"1"
        assert orjson.loads(refused.body)["error"]["code"] == "flow_shed"
        waiting = picker.hold(messages("waiting"))
        assert await settled(lambda: len(app.core.flow.queue) == 1)
        waiting.cancel()  # the client (Envoy) gives up while it is queued
        assert await settled(lambda: len(app.core.flow.queue) == 0)
        first.cancel()
        assert await settled(lambda: app.pool.stats.in_flight == 0 and booked(app) == 0)
        exposed = generate_latest(app.metrics.registry).decode()
        shed = 'cache_router_flow_rejected_total{band="-1",flow="default",reason="shed"} 1.0'
        gone = 'reason="client_disconnect"} 1.0'
        assert shed in exposed and gone in exposed
        # the closed stream counts in requests_total too (worker "none"), as serve counts it
        left = '{policy="ttft",status="client_disconnect",worker="none"} 1.0'
        assert "cache_router_requests_total" + left in exposed

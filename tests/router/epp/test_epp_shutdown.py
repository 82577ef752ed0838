"""The endpoint picker at shutdown, through its real gRPC service: when the drain starts
(``RouterApp.drain``, what the server runs at SIGTERM), each ext_proc stream held in flow
control's queue is answered an ImmediateResponse 503 with Retry-After at once, later ones
too, and a stream already routed goes on; nothing stays in flight or booked.

The saturation is tests/router/epp/test_epp_flow_control.py's: one routed request's
prefill (1000 tokens at 500 tokens/s) holds the others past the 2.5 s target."""

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


def messages(tag: str) -> list:
    body = orjson.dumps({"model": "fake-model", "prompt": flow_prompt(tag), "max_tokens": 4})
    return [request_headers("POST", "/v1/completions"), request_body(body)]


async def routed(call) -> bytes | None:
    """The endpoint the stream's answers name once routed (BUFFERED: after the body)."""
    while True:
        answer = await call.read()
        if answer.WhichOneof("response") in ("request_body", "immediate_response"):
            return routed_to(answer)


async def refused_for_shutdown(call) -> None:
    """The stream ends with the 503 ``shutdown`` ImmediateResponse, Retry-After, JSON."""
    answers = await asyncio.wait_for(read_until_closed(call), 5)
    refused = answers[-1].immediate_response
    assert refused.status.code == 503 and refused.details == "shutdown", answers[-1]
    assert header_of(refused, "retry-after") == b"1"
    assert header_of(refused, "content-type") == b"application/json"
    assert orjson.loads(refused.body)["error"]["code"] == "shutdown"


async def test_drain_answers_the_streams_held_in_the_queue_503_at_once(fake_workers) -> None:
    (worker,) = fake_workers(1)
    async with router_app([worker.url], **FLOW) as app, Picker(app) as picker:
        first = picker.hold(messages("first"))
        assert await asyncio.wait_for(routed(first), 5) is not None
        held = [picker.hold(messages(f"held-{i}")) for i in range(2)]
        assert await settled(lambda: len(app.core.flow.queue) == 2)
        app.drain()  # SIGTERM (router.service.server.Server.shutdown)
        for call in held:
            await refused_for_shutdown(call)
        await refused_for_shutdown(picker.hold(messages("late")))  # and what comes later
        assert app.pool.stats.in_flight == 1  # the routed one goes on while the drain lasts
        first.cancel()
        assert await settled(lambda: app.pool.stats.in_flight == 0 and booked(app) == 0)
        assert len(app.core.flow.queue) == 0
        exposed = generate_latest(app.metrics.registry).decode()
        shut = 'cache_router_flow_rejected_total{band="0",flow="default",reason="shutdown"} 3.0'
        assert shut in exposed

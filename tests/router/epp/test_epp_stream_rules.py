"""The rules of one ext_proc stream that a gateway relies on, each through the real gRPC service
(grpc.aio server and client on 127.0.0.1, the router core in front of sim workers): a stream
routes and books once; ``serve``'s admission limits hold (429 in flight, 413 body, 503 open
streams); ``GET /v1/models`` is ``serve``'s answer; an ImmediateResponse ends the stream; a
response ``:status`` that is no number is an unreadable answer, not a crash."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client import generate_latest

sys.path.insert(0, str(Path(__file__).parent))

from ext_proc_support import (
    Picker,
    booked,
    header_of,
    kinds,
    read_until_closed,
    released,
    request_body,
    request_headers,
    response_body,
    response_headers,
    routed_to,
    router_app,
    settled,
)

from router.epp.processor import RequestStream
from traces.live.fleet import Service, sim_workers

PROMPT = b'{"model": "sim-model", "prompt": "hello there", "max_tokens": 2}'
USAGE = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}'


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(2, ["--time-scale", "50", "--log-level", "warning"]) as started:
        yield started


def urls(workers: list[Service]) -> list[str]:
    return [w.url for w in workers]


# ---- a stream routes once --------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, routed_as",
    [("BUFFERED", "request_body"), ("FULL_DUPLEX_STREAMED", "request_headers")],
)
async def test_a_second_end_of_the_body_never_routes_again(workers, mode, routed_as) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        before = released(app)
        answers = await picker.exchange([
            request_headers("POST", "/v1/completions", request_mode=mode),
            request_body(PROMPT), request_body(PROMPT),
            response_headers(b"200"), response_body(USAGE),
        ])  # fmt: skip
        routed = [a for a in answers if routed_to(a) is not None]
        assert [a.WhichOneof("response") for a in routed] == [routed_as]
        last = answers[-1].immediate_response
        assert last.status.code == 400 and last.details == "invalid_stream"
        assert booked(app) == 0 and app.pool.stats.in_flight == 0
        assert released(app) - before == 1  # the one booking, released once


async def test_a_body_after_a_bodiless_request_or_headers_twice_is_refused(workers) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        headers = request_headers("POST", "/v1/completions")
        for messages in (
            [request_headers("GET", "/v1/responses/resp_x", end=True), request_body(PROMPT)],
            [headers, request_body(PROMPT), headers, request_body(PROMPT)],
        ):
            answers = await picker.exchange(messages)
            assert sum(routed_to(a) is not None for a in answers) <= 1
            assert answers[-1].immediate_response.status.code in (400, 404)
            assert booked(app) == 0 and app.pool.stats.in_flight == 0


# ---- serve's admission limits ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
async def test_a_body_past_max_body_bytes_is_a_413_at_once(workers, mode) -> None:
    limit = 64 << 10
    async with router_app(urls(workers), max_body_bytes=limit) as app, Picker(app) as picker:
        piece = b"a" * (16 << 10)
        pieces = [request_body(piece, end=False) for _ in range(40)]  # never an end
        call = picker.hold([request_headers("POST", "/v1/completions", request_mode=mode), *pieces])
        answers = await asyncio.wait_for(read_until_closed(call), 10)  # closed by the EPP
        last = answers[-1].immediate_response
        assert last.status.code == 413 and last.details == "request_too_large"
        assert b"exceeds" in last.body
        assert await settled(lambda: picker.processor.streams == 0)
        assert app.pool.stats.in_flight == 0 and booked(app) == 0


async def test_the_default_body_limit_holds(workers) -> None:
    """As ``epp`` ships (``--max-body-bytes`` unset): a full-duplex body that never ends is
    refused once it passes the default limit, with nothing kept."""
    async with router_app(urls(workers)) as app:
        limit = app.settings.max_body_bytes
        stream = RequestStream(app.core, "x-session-id", picker_endpoints())
        piece = b"c" * (1 << 20)
        sent = 0

        async def messages():
            nonlocal sent
            yield request_headers("POST", "/v1/completions", request_mode="FULL_DUPLEX_STREAMED")
            while sent <= limit + len(piece):
                sent += len(piece)
                yield request_body(piece, end=False)
            raise AssertionError("the stream read on past the default limit")

        answers = [a async for a in stream.run(messages())]
        assert answers[-1].immediate_response.status.code == 413
        assert limit < sent <= limit + len(piece) and stream.body == []
        assert app.pool.stats.in_flight == 0 and booked(app) == 0


async def test_a_refused_body_is_dropped(workers) -> None:
    """Driven on its own (no gRPC) to see what the stream keeps: nothing, once refused."""
    limit = 64 << 10
    async with router_app(urls(workers), max_body_bytes=limit) as app:
        stream = RequestStream(app.core, "x-session-id", picker_endpoints())
        kept: list[int] = []

        async def messages():
            yield request_headers("POST", "/v1/completions", request_mode="FULL_DUPLEX_STREAMED")
            for _ in range(10):
                kept.append(sum(map(len, stream.body)))
                yield request_body(b"b" * (24 << 10), end=False)
            raise AssertionError("the stream read on after its 413")

        answers = [a async for a in stream.run(messages())]
        assert answers[-1].immediate_response.status.code == 413
        assert max(kept) <= limit and stream.body == []
        assert app.pool.stats.in_flight == 0


def picker_endpoints():
    from router.epp.endpoints import Endpoints

    return Endpoints(5.0)


async def test_max_inflight_is_serves_429_and_the_gauge_counts(workers) -> None:
    async with router_app(urls(workers), max_inflight=3) as app, Picker(app) as picker:
        calls, firsts = [], []
        for i in range(5):
            prompt = b'{"model": "sim-model", "prompt": "held %d"}' % i
            call = picker.hold([request_headers("POST", "/v1/completions"), request_body(prompt)])
            calls.append(call)
            firsts.append(await asyncio.wait_for(call.read(), 10))
        refused = [a.immediate_response for a in firsts if a.HasField("immediate_response")]
        assert len(refused) == 2
        assert all(r.status.code == 429 and r.details == "router_overloaded" for r in refused)
        assert all(header_of(r, "retry-after") == b"1" for r in refused)
        assert app.pool.stats.in_flight == 3
        exposed = generate_latest(app.metrics.registry).decode()
        assert "cache_router_in_flight 3.0" in exposed
        assert 'cache_router_rejected_total{reason="inflight"} 2.0' in exposed
        for call in calls:
            call.cancel()
        assert await settled(lambda: app.pool.stats.in_flight == 0 and booked(app) == 0)
        assert await settled(lambda: picker.processor.streams == 0)


async def test_in_flight_ends_with_the_response_error_or_cancel(workers) -> None:
    async with router_app(urls(workers), max_inflight=1) as app, Picker(app) as picker:
        headers = request_headers("POST", "/v1/completions")
        done = [headers, request_body(PROMPT), response_headers(b"200"), response_body(USAGE)]
        call = picker.hold(done)  # the response complete, the stream still open
        for _ in done:
            await asyncio.wait_for(call.read(), 10)
        assert app.pool.stats.in_flight == 0
        call.cancel()
        await picker.exchange([headers, request_body(b"{nope")])  # a 400
        assert app.pool.stats.in_flight == 0
        call = picker.hold([headers])  # cancelled before its body
        await asyncio.wait_for(call.read(), 10)
        assert app.pool.stats.in_flight == 1
        call.cancel()
        assert await settled(lambda: app.pool.stats.in_flight == 0)
        answers = await picker.exchange([headers, request_body(PROMPT)])  # admitted again
        assert routed_to(answers[-1]) is not None


async def test_open_streams_past_max_connections_get_serves_503(workers) -> None:
    async with router_app(urls(workers), max_connections=2) as app, Picker(app) as picker:
        headers = request_headers("POST", "/v1/completions")
        held = [picker.hold([headers]) for _ in range(2)]
        for call in held:
            await asyncio.wait_for(call.read(), 10)
        answers = await picker.exchange([headers, request_body(PROMPT)])
        (refused,) = [a.immediate_response for a in answers]
        assert refused.status.code == 503 and refused.details == "connections"
        assert header_of(refused, "retry-after") == b"1"
        assert app.pool.stats.rejected == {"connections": 1}
        for call in held:
            call.cancel()
        assert await settled(lambda: picker.processor.streams == 0)
        answers = await picker.exchange([headers, request_body(PROMPT)])
        assert routed_to(answers[-1]) is not None
        assert await settled(lambda: app.pool.stats.in_flight == 0 and booked(app) == 0)


# ---- GET /v1/models ----------------------------------------------------------------------


async def test_get_v1_models_is_serves_answer(workers) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        answers = await picker.exchange(
            [request_headers("GET", "/v1/models?x=1", end=True), request_body(b"ignored")]
        )
        (answer,) = [a.immediate_response for a in answers]
        assert answer.status.code == 200
        assert header_of(answer, "content-type") == b"application/json"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            served = await client.get("/v1/models")
        assert served.status_code == 200
        listed = orjson.loads(answer.body)
        assert [m["id"] for m in listed["data"]] == ["sim-model"]
        assert listed == served.json()
        assert app.pool.stats.unrouted == {}


# ---- an ImmediateResponse ends the stream; a :status that is no number --------------------


async def test_an_immediate_response_ends_the_stream_and_counts_once(workers) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        call = picker.hold([
            request_headers("GET", "/v1/nowhere"), request_body(b"x"),
            response_headers(b"200"), response_body(b"y"),
        ])  # fmt: skip
        answers = await asyncio.wait_for(read_until_closed(call), 10)  # closed by the EPP
        assert kinds(answers) == ["immediate_response"]
        assert answers[0].immediate_response.status.code == 404
        assert app.pool.stats.unrouted == {"404": 1}


async def test_a_huge_unrouted_path_is_not_echoed_whole(workers) -> None:
    path = "/v1/" + "p" * (1 << 20)
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        answers = await picker.exchange([request_headers("GET", path, end=True)])
        refused = answers[-1].immediate_response
        assert refused.status.code == 404 and len(refused.body) < 1024
        assert b"characters)" in refused.body


async def test_a_failed_pick_counts_as_unrouted(workers) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        unknown = b'{"model": "nobody", "prompt": "x"}'
        answers = await picker.exchange([request_headers("POST", "/v1/completions"),
                                         request_body(unknown)])  # fmt: skip
        assert answers[-1].immediate_response.status.code == 404
        assert app.pool.stats.unrouted == {"404": 1}
        assert app.pool.stats.endpoint("completion") == {"404": 1}


async def test_a_status_that_is_no_number_is_an_unreadable_answer(workers, caplog) -> None:
    async with router_app(urls(workers)) as app, Picker(app) as picker:
        caplog.set_level(logging.ERROR, logger="cache_router")
        answers = await picker.exchange([
            request_headers("POST", "/v1/completions"), request_body(PROMPT),
            response_headers(b"banana"), response_body(USAGE),
        ])  # fmt: skip
        assert kinds(answers) == ["request_headers", "request_body",
                                  "response_headers", "response_body"]  # fmt: skip
        assert caplog.records == []  # no traceback
        outcomes = {k: v for w in app.pool.workers for k, v in w.stats.requests.items()}
        assert outcomes == {"502": 1}
        assert booked(app) == 0 and app.pool.stats.in_flight == 0

"""router.service.server.RouterCycle: the response head rides with the first body piece (one
write), a head alone still goes out, and the disconnect callback fires exactly once; and the
scope RouterProtocol builds for plain requests is the one uvicorn builds."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from router.config import load_settings
from router.fleet.stats import PoolStats
from router.service.server import RouterCycle, Server, build_config, client_channel


class Transport:
    """Records writes; what uvicorn's cycle and flow control call on a transport."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(method: str = "POST", keep_alive: bool = True) -> tuple[RouterCycle, Transport, list]:
    transport = Transport()
    done: list[bool] = []
    plain = RequestResponseCycle(
        scope={"type": "http", "method": method, "path": "/", "headers": []},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: done.append(True),
    )
    return RouterCycle.adopt(plain), transport, done


def start(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http.response.start", "status": 200, "headers": headers}


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def test_head_and_body_go_out_in_one_write():
    c, transport, done = cycle()
    await c.send(start([(b"content-type", b"application/json"), (b"content-length", b"2")]))
    assert transport.writes == []  # held
    await c.send(body(b"{}"))
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    ]
    assert c.response_complete and done == [True]
    await asyncio.sleep(0)  # the scheduled flush finds nothing left to write
    assert len(transport.writes) == 1


async def test_a_stream_is_chunked_and_its_later_pieces_follow():
    c, transport, _ = cycle()
    await c.send(start([(b"content-type", b"text/event-stream")]))
    await c.send(body(b"data: 1\n\n", more=True))
    await c.send(body(b"data: 2\n\n", more=True))
    await c.send(body(b""))
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n",
        b"9\r\ndata: 2\n\n\r\n",
        b"0\r\n\r\n",
    ]


async def test_a_head_alone_goes_out_on_the_next_loop_iteration():
    c, transport, _ = cycle()
    await c.send(start([(b"content-length", b"5")]))
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"]
    await c.send(body(b"hello"))
    assert transport.writes[1:] == [b"hello"]


async def test_connection_close_is_kept_and_the_transport_closed_after_the_write():
    c, transport, _ = cycle(keep_alive=False)
    await c.send(start([(b"content-length", b"2")]))
    await c.send(body(b"ok"))
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    ]
    assert transport.closed


async def test_a_head_request_takes_uvicorns_path():
    c, transport, _ = cycle(method="HEAD")
    await c.send(start([(b"content-length", b"2")]))
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"]


async def test_nothing_is_written_after_a_disconnect():
    c, transport, _ = cycle()
    await c.send(start([(b"content-length", b"2")]))
    c.disconnected = True
    await c.send(body(b"ok"))
    await asyncio.sleep(0)
    assert transport.writes == []


async def test_the_disconnect_callback_fires_once_and_can_be_withdrawn():
    c, _, _ = cycle()
    calls: list[str] = []
    channel = client_channel(c.send)
    assert channel is c
    channel.on_disconnect(lambda: calls.append("a"))
    c.disconnected = True
    c.disconnected = True
    assert calls == ["a"]
    channel.on_disconnect(lambda: calls.append("late"))  # already gone: called at once
    assert calls == ["a", "late"]
    d, _, _ = cycle()
    d.on_disconnect(lambda: calls.append("withdrawn"))
    d.on_disconnect(None)
    d.disconnected = True
    assert calls == ["a", "late"]


def test_other_servers_have_no_channel():
    async def send(message: Any) -> None: ...

    assert client_channel(send) is None


async def test_respond_writes_head_and_first_piece_at_once_without_a_later_flush():
    c, transport, done = cycle()
    await c.respond(
        200, [(b"content-length", b"2"), (b"x-cache-router-worker", b"w")], b"ok", False
    )
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-cache-router-worker: w\r\n\r\nok"
    ]
    assert c.response_complete and done == [True]
    await asyncio.sleep(0)
    assert len(transport.writes) == 1


async def test_respond_starts_a_stream_that_send_continues():
    c, transport, done = cycle()
    await c.respond(200, [(b"content-type", b"text/event-stream")], b"data: 1\n\n", True)
    await c.send(body(b""))
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n",
        b"0\r\n\r\n",
    ]
    assert done == [True]


async def test_respond_takes_the_checked_path_for_a_head_request_and_after_a_disconnect():
    c, transport, _ = cycle(method="HEAD")
    await c.respond(200, [(b"content-length", b"2")], b"ok", False)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"]
    d, transport, _ = cycle()
    d.disconnected = True
    await d.respond(200, [(b"content-length", b"2")], b"ok", False)
    await asyncio.sleep(0)
    assert transport.writes == []


class _Recorder:
    """An ASGI app that records each request's scope and answers 200; also the stand-in
    router context RouterProtocol reads its limits from (no direct path: ASGI for all)."""

    def __init__(self) -> None:
        self.settings = load_settings(workers=["http://127.0.0.1:9"])
        self.forwarder = None
        self.pool = type("Pool", (), {"stats": PoolStats(), "workers": []})()
        self.draining = False
        self.scopes: list[dict[str, Any]] = []

    def drain(self) -> None:
        self.draining = True

    def drain_ended(self) -> None:
        pass

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.scopes.append(scope)
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _scopes_seen(server_for, requests: list[bytes]) -> list[dict[str, Any]]:
    """Serve ``requests`` (one connection each) with the server ``server_for(app)`` gives."""
    app = _Recorder()
    server = server_for(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
            for raw in requests:
                reader, writer = await asyncio.open_connection(*sock.getsockname())
                writer.write(raw)
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"HTTP/1.1 100"):  # expect: 100-continue
                    head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()  # closed by the server already; a no-op then
    # the addresses differ between the two servers (ports), nothing else may
    return [
        {k: v for k, v in scope.items() if k not in ("client", "server")} for scope in app.scopes
    ]


async def test_plain_requests_get_the_scope_uvicorn_gives():
    # RouterProtocol inlines uvicorn's request start: a newer uvicorn that changes its own
    # must fail here, not drift silently
    requests = [
        b"POST /v1/completions?x=1&y=%20 HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}",
        b"GET /v1/%63hat/a%2Fb HTTP/1.1\r\nhost: a\r\nx-Mixed-Case: V\r\n\r\n",
        b"POST /generate HTTP/1.0\r\ncontent-length: 0\r\n\r\n",
        b"POST /v1/x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        b"PATCH / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\nz",
    ]

    def ours(app):
        return Server(build_config(app, app.settings, log_level="warning"), app)

    def uvicorns(app):
        config = uvicorn.Config(app, http="httptools", lifespan="on", log_level="warning")
        return uvicorn.Server(config)

    got, expected = await _scopes_seen(ours, requests), await _scopes_seen(uvicorns, requests)
    assert len(got) == len(requests)
    assert got == expected


async def test_run_direct_has_run_asgis_safety_net(caplog):
    # a generation request's handler is called directly (no ASGI app in between); what
    # uvicorn's run_asgi guarantees must still hold
    async def raises_before_answering(scope, receive, send, endpoint, channel):
        assert channel is c and endpoint == "completion" and scope is c.scope
        raise RuntimeError("bug")

    c, transport, done = cycle()
    await c.run_direct(raises_before_answering, "completion")
    assert transport.writes[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert done == [True] and "Exception in ASGI application" in caplog.text

    async def raises_mid_response(scope, receive, send, endpoint, channel):
        await channel.respond(200, [(b"content-length", b"4")], b"ab", True)
        raise RuntimeError("bug")

    c, transport, done = cycle()
    await c.run_direct(raises_mid_response, "chat")
    assert transport.closed and len(transport.writes) == 1  # no second response after a head

    async def never_answers(scope, receive, send, endpoint, channel):
        return None

    c, transport, done = cycle()
    await c.run_direct(never_answers, "chat")
    assert transport.writes[0].startswith(b"HTTP/1.1 500")

    async def answers(scope, receive, send, endpoint, channel):
        await channel.respond(200, [(b"content-length", b"2")], b"ok", False)

    c, transport, done = cycle()
    await c.run_direct(answers, "chat")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    assert done == [True] and not transport.closed
    c.on_response()  # disabled once the handler is over (as run_asgi does)
    assert done == [True]


async def test_whole_body_is_handed_over_once_and_only_when_complete():
    c, _, _ = cycle()
    c.body += b"{}"
    c.message_event.set()
    assert c.whole_body() is None  # more may follow
    c.more_body = False
    assert c.whole_body() == b"{}"
    assert c.whole_body() is None  # taken; receive() would wait for the next message


async def test_respond_frames_forwarded_headers_as_uvicorns_head_does():
    # respond() builds the forwarder's head without uvicorn's per-header checks; the bytes
    # must be the ones the checked path (send) writes for the same response
    cases = [
        (200, [(b"content-type", b"application/json"), (b"content-length", b"2")], b"ok"),
        (200, [(b"content-type", b"text/event-stream")], b"data: 1\n\n"),  # chunked
        (404, [(b"content-length", b"2"), (b"x-cache-router-worker", b"http://w")], b"no"),
        (204, [(b"date", b"today")], b""),
    ]
    for keep_alive in (True, False):
        for status, headers, data in cases:
            ours, ours_t, _ = cycle(keep_alive=keep_alive)
            await ours.respond(status, headers, data, False)
            theirs, theirs_t, _ = cycle(keep_alive=keep_alive)
            await theirs.send({"type": "http.response.start", "status": status, "headers": headers})
            await theirs.send(body(data))
            assert ours_t.writes == theirs_t.writes, (status, headers, keep_alive)
            assert ours.response_complete and ours_t.closed is (not keep_alive)

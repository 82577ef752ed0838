"""The acceptor takes every pending connection per readiness event, and an accept error
pauses it instead of spinning."""

from __future__ import annotations

import asyncio
import socket
from functools import partial

import pytest
import uvloop

from router.service import accept
from router.service.accept import Acceptor


class Made(asyncio.Protocol):
    """Records itself in ``made`` once its connection is set up."""

    def __init__(self, made: list[Made]) -> None:
        self.made = made

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.made.append(self)


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def clients(port: int, n: int) -> list[socket.socket]:
    """``n`` connections the kernel completed (a listening socket takes them before accept)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


async def until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run_on_uvloop(test) -> None:
    """The router's loop: uvloop (whose own servers accept one connection per iteration)."""
    uvloop.run(test())


def test_every_pending_connection_is_accepted_in_one_readiness_call() -> None:
    async def test() -> None:
        made: list[Made] = []
        acceptor = Acceptor(
            asyncio.get_running_loop(), listener(), partial(Made, made), backlog=4096
        )
        port = acceptor.sockets[0].getsockname()[1]
        conns = clients(port, 50)  # no await yet: the loop has not polled the listener
        acceptor._ready()  # one readiness event
        assert acceptor.accepted == 50
        await until(lambda: len(made) == 50)
        nodelay = [
            p.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for p in made
        ]
        assert all(nodelay)  # as the loop's own servers set it
        acceptor._ready()  # nothing pending: returns at once
        assert acceptor.accepted == 50
        # each accepted socket is a working connection
        conns[0].sendall(b"x")
        acceptor.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1)
        for conn in conns:
            conn.close()
        for protocol in made:
            protocol.transport.close()

    run_on_uvloop(test)


def test_a_batch_bounds_one_call_and_the_rest_follow_on_the_next_events() -> None:
    async def test() -> None:
        made: list[Made] = []
        acceptor = Acceptor(
            asyncio.get_running_loop(), listener(), partial(Made, made), backlog=4096, batch=8
        )
        conns = clients(acceptor.sockets[0].getsockname()[1], 20)
        acceptor._ready()
        assert acceptor.accepted == 8
        await until(lambda: len(made) == 20)  # the loop's next readiness events take the rest
        acceptor.close()
        for conn in conns:
            conn.close()
        for protocol in made:
            protocol.transport.close()

    run_on_uvloop(test)


class FailingOnce(socket.socket):
    """A listening socket whose first accept fails as if the process had no descriptors left."""

    failed = False

    def accept(self):
        if not self.failed:
            self.failed = True
            raise OSError(24, "Too many open files")
        return super().accept()


def test_an_accept_error_pauses_accepting_then_it_resumes(monkeypatch) -> None:
    monkeypatch.setattr(accept, "RETRY_AFTER_ERROR_S", 0.2)

    async def test() -> None:
        made: list[Made] = []
        sock = FailingOnce()
        sock.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        acceptor = Acceptor(loop, sock, partial(Made, made), backlog=4096)
        conn = clients(sock.getsockname()[1], 1)[0]
        start = loop.time()
        await until(lambda: len(made) == 1)
        assert sock.failed
        assert loop.time() - start >= 0.15  # paused, not spinning on the ready socket
        acceptor.close()
        conn.close()
        made[0].transport.close()

    run_on_uvloop(test)

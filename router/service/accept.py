"""Accept every pending client connection each time a listening socket is ready.

libuv, under uvloop, accepts one connection per loop iteration since 1.45 (libuv PR #3696)
and relies on level-triggered polling for the next. On an idle router that costs nothing.
Under load, one iteration runs the callbacks of every request that is ready, which takes
tens of ms at 128 concurrent requests. A burst of new connections then waits one iteration
each: a load balancer reconnecting, a client pool opening, a benchmark starting. On one
core, 128 connections opened together on a busy router waited up to 1.1 s to be accepted,
although none of their requests took more than 0.12 s inside the router. That alone set
the p99 of a 4 s run at 128 connections to 360-710 ms.

:class:`Acceptor` serves a listening socket in place of the loop's own server. When the
socket is ready it accepts everything pending, up to the backlog, and hands each socket to
``loop.connect_accepted_socket`` with the server's protocol. uvicorn's lifecycle is kept:
the :class:`~router.service.server.Server` lists the acceptors as its servers, so shutdown
closes them first, as it would close its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("cache_router.server")

RETRY_AFTER_ERROR_S = 1.0  # asyncio pauses as long after EMFILE and the like


class Acceptor:
    """Accepts every pending connection of ``sock`` per readiness event (see the module doc).

    Offers what uvicorn uses of the servers it starts: ``sockets``, ``close()`` and
    ``wait_closed()``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        backlog: int,
        batch: int | None = None,
    ) -> None:
        self.loop = loop
        self.sockets = [sock]
        self.factory = protocol_factory
        self.batch = batch or backlog  # accepts per readiness event, as asyncio's servers
        self.tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self.closed = False
        self.accepted = 0
        self._setting_up: set[asyncio.Task] = set()  # referenced until connection_made
        sock.setblocking(False)
        sock.listen(backlog)  # uvicorn binds; the loop's create_server would listen
        self._fd = sock.fileno()
        loop.add_reader(self._fd, self._ready)

    def _ready(self) -> None:
        """Accept up to ``batch`` connections (all there are, but for a flood)."""
        sock = self.sockets[0]
        for _ in range(self.batch):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while it waited: next one
                continue
            except OSError as exc:
                # out of descriptors or memory (or a socket gone wrong): a level-triggered
                # socket would call back at once, so pause instead of spinning
                log.error("accept: %s; accepting again in %g s", exc, RETRY_AFTER_ERROR_S)
                self.loop.remove_reader(self._fd)
                self.loop.call_later(RETRY_AFTER_ERROR_S, self._resume)
                return
            self.accepted += 1
            if self.tcp:
                try:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:  # already reset by the client
                    conn.close()
                    continue
            task = self.loop.create_task(self._connect(conn))
            self._setting_up.add(task)
            task.add_done_callback(self._setting_up.discard)

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self._fd, self._ready)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except OSError as exc:  # the connection died before it was set up
            log.debug("accepted connection lost before set-up: %s", exc)
            conn.close()

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections stay open)."""
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self._fd)
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        """Nothing to wait for: accepted connections are the server state's to track."""

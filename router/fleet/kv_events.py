"""Precise mode's sockets: subscribe to every worker's KV events and feed its index.

The index, the decoding and the sequence bookkeeping are pure and live in
:mod:`router.cache.kv_index` (the simulator can use them too); this module owns the ZMQ
sockets and follows the pool's membership.

Endpoints. For ``endpoint: tcp://HOST:PORT`` vLLM *connects* its PUB socket, so the router
*binds* one SUB socket per worker, on ``kv_events_bind_host`` at the worker's port +
``kv_events_port_offset``; that admits one router. With ``kv_events_connect`` the direction is
vLLM's default one (``endpoint: tcp://*:PORT``: the worker binds its publisher) and the router
*connects* its SUB socket to the worker's host at that port, so every router replica can
subscribe to the same worker. With ``replay_endpoint`` set vLLM binds a ROUTER socket that resends
buffered batches from a given ``seq``; the router asks it at the worker's host, port +
``kv_events_replay_offset`` (0: no replay). The answer to the DEALER's ``[b"", start]`` is one
``[b"", seq, payload]`` per batch and ``[b"", -1, b""]`` at the end, as vLLM's and SGLang's
``ZmqEventPublisher`` send it; a topic frame before ``seq`` is accepted too, so ``seq`` and
``payload`` are read as the last two frames.

Events are decoded and applied on the event loop (pyzmq's asyncio sockets): a batch is a few
microseconds of dict updates per block, and the shadows are single-threaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from router.cache.kv_index import (
    END_SEQ,
    REPLAY_MAX_S,
    REPLAY_TIMEOUT_S,
    KVEventFeed,
    decode_batch,
)
from router.fleet import periodic
from router.fleet.pool import Worker, WorkerPool

log = logging.getLogger("cache_router.kv_events")


def endpoints(
    url: str, bind_host: str, port_offset: int, replay_offset: int, connect: bool = False
) -> tuple[str, str]:
    """(SUB endpoint, replay endpoint or "") for the worker at ``url``; the SUB endpoint is
    bound here, or with ``connect`` the worker's own publisher to connect to."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "127.0.0.1"
    bind = f"tcp://{host if connect else bind_host}:{port + port_offset}"
    replay = f"tcp://{host}:{port + replay_offset}" if replay_offset else ""
    return bind, replay


class KVEventSubscriber:
    """One worker's SUB socket (bound, or connected to the worker's publisher), replay
    requests, and its :class:`KVEventFeed`."""

    def __init__(
        self, ctx: Any, worker: Worker, bind: str, replay: str, connect: bool = False
    ) -> None:
        index = worker.state.kv_index
        if index is None:
            raise ValueError("the worker has no KV index (kv_events is off)")
        self.ctx = ctx
        self.worker = worker
        self.bind = bind
        self.connect = connect
        self.replay_endpoint = replay
        self.feed = KVEventFeed(index)
        self.connected = 0  # publishers connected (socket monitor)
        self.messages = 0
        # receive time - publish time (the batch's ts; same clock assumed) of the last 256
        # live batches: a backlog vLLM queued while no router listened ages out of it
        self.lags: deque[float] = deque(maxlen=256)
        self.errors = 0
        self.last_error: str | None = None
        self._tasks: set[asyncio.Task] = set()
        self._sub: Any = None

    def describe(self) -> dict[str, Any]:
        return {
            "endpoint": self.bind,
            "replay_endpoint": self.replay_endpoint or None,
            "connected": self.connected > 0,
            "messages": self.messages,
            "lag_s_max": round(max(self.lags), 4) if self.lags else None,
            "lag_s_p50": round(statistics.median(self.lags), 4) if self.lags else None,
            "last_seq": self.feed.last_seq,
            "replaying": self.feed.replaying,
            "errors": self.errors,
            "last_error": self.last_error,
            **self.feed.index.describe(),
        }

    def start(self) -> None:
        import zmq

        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVHWM, 0)  # never drop on our side; gaps are replayed anyway
        sub.setsockopt(zmq.LINGER, 0)
        # the monitor exists before the bind: vLLM's publisher retries its connect every
        # 100 ms and must not complete its handshake unseen
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            if self.connect:
                sub.connect(self.bind)
            else:
                sub.bind(self.bind)
        except zmq.ZMQError:
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)
            raise
        self._sub = sub
        self._spawn(self._receive())
        self._spawn(self._monitor(monitor))
        if self.replay_endpoint:  # catch up now: the worker may hold blocks already
            self.feed.replaying = True
            self._spawn(self._replay(0))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                self._sub.disable_monitor()
            self._sub.close(0)
            self._sub = None

    async def _receive(self) -> None:
        while True:
            parts = await self._sub.recv_multipart()
            self.messages += 1
            try:
                if len(parts) < 3:
                    raise ValueError(f"expected (topic, seq, payload), got {len(parts)} frames")
                seq = int.from_bytes(parts[1], "big", signed=True)
                ts, events = decode_batch(parts[-1])
            except ValueError as exc:
                self.errors += 1
                self.last_error = str(exc)
                continue
            if ts:
                self.lags.append(time.time() - ts)
            start = self.feed.live(seq, ts, events)
            if start is not None:
                if self.replay_endpoint:
                    self._spawn(self._replay(start))
                else:
                    self.feed.replayed(start, None)

    async def _monitor(self, monitor: Any) -> None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        try:
            while True:
                message = parse_monitor_message(await monitor.recv_multipart())
                if message["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.connected += 1
                elif message["event"] == zmq.EVENT_DISCONNECTED:
                    self.connected = max(0, self.connected - 1)
        finally:
            monitor.close(0)

    async def _replay(self, from_seq: int) -> None:
        """Ask the worker's replay socket for batches from ``from_seq`` (a fresh DEALER each
        time, so a late answer to an abandoned request can never be mistaken for this one)."""
        import zmq

        batches: list[tuple[int, float, list[dict[str, Any]]]] | None = []
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", from_seq.to_bytes(8, "big")])
            deadline = time.monotonic() + REPLAY_MAX_S
            while True:
                left = min(REPLAY_TIMEOUT_S, deadline - time.monotonic())
                if left <= 0 or not await sock.poll(left * 1000):
                    batches = None  # no (complete) answer: the gap stays open
                    break
                parts = await sock.recv_multipart()
                if len(parts) < 3:  # [b"", (topic,) seq, payload]: see the module docstring
                    continue
                seq = int.from_bytes(parts[-2], "big", signed=True)
                if seq == END_SEQ:
                    break
                ts, events = decode_batch(parts[-1])
                batches.append((seq, ts, events))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # whatever went wrong, the feed must leave replaying
            self.errors += 1
            self.last_error = f"replay: {type(exc).__name__}: {exc}"
            batches = None
        finally:
            sock.close(0)
        self.feed.replayed(from_seq, batches)


class KVEventsManager:
    """Subscribes to every pool worker's events; follows workers added and removed."""

    RECONCILE_S = 1.0

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        s = pool.settings
        self.bind_host = s.kv_events_bind_host
        self.port_offset = s.kv_events_port_offset
        self.replay_offset = s.kv_events_replay_offset
        self.connect = s.kv_events_connect
        self.subscribers: dict[str, KVEventSubscriber] = {}
        self._bind_failed: set[str] = set()
        self._ctx: Any = None
        self._task: asyncio.Task | None = None

    def subscriber(self, url: str) -> KVEventSubscriber | None:
        return self.subscribers.get(url)

    async def reconcile(self) -> None:
        """Subscribe to new workers, drop removed ones."""
        current = {w.url: w for w in self.pool.workers}
        for url in list(self.subscribers):
            if url not in current:
                sub = self.subscribers.pop(url)
                sub.worker.kv_events = None
                await sub.stop()
        for url, worker in current.items():
            old = self.subscribers.get(url)
            if old is not None and old.worker is not worker:  # removed, then added again
                del self.subscribers[url]
                await old.stop()
            if url in self.subscribers or worker.state.kv_index is None:
                continue
            bind, replay = endpoints(
                url, self.bind_host, self.port_offset, self.replay_offset, self.connect
            )
            sub = KVEventSubscriber(self._ctx, worker, bind, replay, self.connect)
            try:
                sub.start()
            except Exception as exc:  # port taken, bad address: the estimate, and retries
                worker.last_error = f"kv events: cannot bind {bind}: {exc}"
                level = logging.DEBUG if url in self._bind_failed else logging.WARNING
                log.log(level, "kv events for %s: cannot bind %s (retrying): %s", url, bind, exc)
                self._bind_failed.add(url)
                await sub.stop()
                continue
            self._bind_failed.discard(url)
            self.subscribers[url] = sub
            worker.kv_events = sub
            how = "connected to" if self.connect else "bound"
            log.info("kv events for %s: %s %s (replay %s)", url, how, bind, replay or "off")

    async def _run(self) -> None:
        await periodic.every(self.RECONCILE_S, self.reconcile, log, "kv events reconcile")

    async def start(self) -> None:
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        await self.reconcile()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await periodic.cancel(task)
        for sub in list(self.subscribers.values()):
            sub.worker.kv_events = None
            await sub.stop()
        self.subscribers.clear()
        if self._ctx is not None:
            # destroy, not term: term() would block the event loop for good if any socket
            # were still open
            self._ctx.destroy(linger=0)
            self._ctx = None

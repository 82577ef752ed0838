"""The sim worker's KV event publisher: ZMQ PUB + replay ROUTER, as vLLM and SGLang run it.

Configured like the engines' ``--kv-events-config`` (``publisher: zmq``, ``endpoint``,
``replay_endpoint``, ``buffer_steps``, ``hwm``, ``topic``), and on the wire the same as both:

- every batch goes out on the PUB socket as the multipart message ``[topic, seq, payload]``,
  ``seq`` an 8-byte big-endian counter from 0, ``payload`` the flavor's msgpack batch
  (:mod:`traces.sim_worker.kv_event_wire`);
- the ROUTER socket at ``replay_endpoint`` answers a request ``[identity, b"", start_seq]``
  with every buffered batch from ``start_seq`` on, ``[identity, b"", seq, payload]`` each, then
  ``[identity, b"", -1 (signed, 8 bytes), b""]``; the last ``buffer_steps`` batches are kept;
- the PUB endpoint is bound when it names no host (``*``, ``::``, ``0.0.0.0``) or is
  ``ipc://`` / ``inproc://``, and connected otherwise (the engines' rule; the router then binds,
  ``cache-router serve --kv-events``); ``bind=True`` binds a named host too (a test's
  127.0.0.1, where the router connects with ``--kv-events-connect``).

``drop``: sequence numbers published to the replay buffer but never sent, a lost batch on
demand for tests (a subscriber sees a gap and must replay or fall back).

The sockets live in one daemon thread (ZMQ sockets are not thread-safe): the event loop only
puts payloads on a queue, so publishing never blocks a request.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from traces.sim_worker.kv_event_wire import FLAVORS, Flavor, encode_batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.02
"""The thread's longest wait for a batch before it looks at the replay socket again."""


@dataclass(frozen=True)
class PublisherConfig:
    """The engines' ``--kv-events-config`` keys, plus ``bind`` and ``drop`` (see module)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    flavor: Flavor = "vllm"
    bind: bool | None = None  # None: the engines' rule (module docstring)
    drop: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}, not {self.flavor!r}")
        if not self.endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"endpoint must be tcp://, ipc:// or inproc://, not {self.endpoint}")
        if self.buffer_steps < 1:
            raise ValueError("buffer_steps must be at least 1")

    @property
    def binds(self) -> bool:
        if self.bind is not None:
            return self.bind
        e = self.endpoint
        return any(w in e for w in ("*", "::", "0.0.0.0")) or e.startswith(("ipc:", "inproc:"))


_ENGINE_KEYS = {"endpoint", "replay_endpoint", "topic", "buffer_steps", "hwm"}
_IGNORED_KEYS = {"publisher", "enable_kv_cache_events", "max_queue_size"}


def config_from_json(
    raw: dict[str, Any], flavor: Flavor, bind: bool | None, drop: Collection[int] = ()
) -> PublisherConfig | None:
    """A ``--kv-events-config`` object (vLLM's or SGLang's keys); None when it publishes
    nothing (``publisher`` other than ``zmq``, or vLLM's ``enable_kv_cache_events`` false)."""
    unknown = set(raw) - _ENGINE_KEYS - _IGNORED_KEYS
    if unknown:
        raise ValueError(f"unknown --kv-events-config keys: {sorted(unknown)}")
    if raw.get("publisher", "zmq") != "zmq" or raw.get("enable_kv_cache_events") is False:
        return None
    if "endpoint" not in raw:
        raise ValueError("--kv-events-config needs an endpoint")
    kept = {k: v for k, v in raw.items() if k in _ENGINE_KEYS}
    return PublisherConfig(**kept, flavor=flavor, bind=bind, drop=frozenset(drop))


class KVEventPublisher:
    """Publishes batches of worker-model events; :meth:`close` stops the thread."""

    def __init__(self, config: PublisherConfig) -> None:
        import zmq

        self.config = config
        self.published = 0  # batches numbered (sent or dropped)
        self.dropped = 0
        self.replays = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            if config.binds:
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            if config.replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()

    def publish(self, events: list[dict[str, Any]]) -> None:
        """One engine step's events (any thread; never blocks)."""
        if events:
            self._queue.put(encode_batch(self.config.flavor, events))

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then close the sockets (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)

    # ---- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._serve_replays()
                try:
                    payload = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if payload is None:
                    return
                self._send(payload)
        except Exception:  # a socket error must not pass silently
            log.exception("kv event publisher failed")
        finally:
            self._close_sockets()

    def _send(self, payload: bytes) -> None:
        seq = self.published
        self.published += 1
        self._buffer.append((seq, payload))
        if seq in self.config.drop:
            self.dropped += 1
            return
        self._pub.send_multipart([self.config.topic.encode(), seq.to_bytes(8, "big"), payload])

    def _serve_replays(self) -> None:
        sock = self._replay
        while sock is not None and sock.poll(0):
            frames = sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("ignoring a malformed replay request (%d frames)", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            self.replays += 1
            for seq, payload in list(self._buffer):
                if seq >= start:
                    sock.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
            sock.send_multipart([identity, b"", END_SEQ, b""])

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(0)
        self._ctx.term()

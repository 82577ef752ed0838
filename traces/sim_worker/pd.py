"""Disaggregated prefill/decode for the simulated worker: vLLM's and SGLang's protocols.

A worker started with ``--role prefill`` or ``--role decode`` plays one side of PD serving in
the protocol of its ``--flavor``; ``--role both`` (the default) ignores every field below.

vLLM (the NixlConnector, as vLLM's ``toy_proxy_server.py`` drives it): the router first sends
the request to a prefill worker with ``"kv_transfer_params": {"do_remote_decode": true, ...}``
(``max_tokens`` 1, not streamed); the prefill answers as usual plus a top-level
``kv_transfer_params`` (``do_remote_prefill``, ``remote_engine_id``, ``remote_block_ids``,
``remote_host``, ``remote_port``, ``remote_request_id``, ``tp_size``) and holds the KV for
``--kv-hold-s``. The router sends the request to a decode worker with those params as its
``kv_transfer_params``; the decode pulls them from the prefill's ``POST /sim/kv_pull``
(NIXL's read, here an HTTP call: ``{"remote_engine_id", "remote_request_id",
"remote_block_ids"}`` -> ``{"tokens": N}``, one pull, 404 when unknown), asking only for the
blocks it lacks in its own prefix cache.

SGLang (``mini_lb``): the router sends the same body to a prefill and a decode worker at
once, with ``bootstrap_host``, ``bootstrap_port`` (the prefill's
``--disaggregation-bootstrap-port``) and ``bootstrap_room`` (a random int). The prefill
registers the room at arrival, runs the prompt as a one-token request and marks the room
ready when that finishes; its bootstrap listener (a second socket) answers
``GET /sim/room/{room}`` with ``{"ready": bool, "tokens": N}`` (404 unknown; dropped on the
first ready read, or after ``--kv-hold-s``). The decode polls it until ready (``POLL_S``,
at most ``--kv-wait-timeout-s`` of real time).

Either way the decode then waits the transfer, ``latency + tokens * bytes_per_token /
bandwidth`` model seconds for the prompt tokens it does not have cached (real seconds: that
over ``--time-scale``, as every model cost), and runs the request with
``SimRequest.kv_transferred``: its blocks take memory and enter its cache, no prompt token
is computed. Hold and wait bounds are real time: they are timeouts, not model costs. A
failed transfer is a 503 (OpenAI-style body) naming the prefill worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import math
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import httpx
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from router.cache.lora import adapter_blocks
from traces.sim import kv_transfer
from traces.sim_worker.api import ApiError, GenRequest
from traces.sim_worker.engine import RealTimeWorker
from traces.trace.record import BLOCK_TOKENS

log = logging.getLogger(__name__)

Role = Literal["both", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("both", "prefill", "decode")

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
POLL_S = 0.005  # a SGLang decode's poll of the bootstrap room (real seconds)
PULL_TIMEOUT_S = 5.0  # one HTTP call to a prefill worker (pull, poll)
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
_WILDCARD = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class PdConfig:
    """One worker's side of disaggregated serving (``role`` both: aggregated, as before)."""

    role: Role = "both"
    # the KV transfer's cost, model time (traces/sim/kv_transfer.py)
    kv_transfer_latency_s: float = kv_transfer.LATENCY_S
    kv_transfer_gbps: float = kv_transfer.GBPS
    kv_bytes_per_token: int = kv_transfer.BYTES_PER_TOKEN
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # SGLang prefill's listener; 0: any free
    kv_hold_s: float = 60.0  # real seconds a prefill keeps KV for its decode
    kv_wait_timeout_s: float = 30.0  # real seconds a SGLang decode polls for its room
    host: str = "127.0.0.1"  # the worker's bind host (the bootstrap listener binds it too)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {self.role!r}")
        kv_transfer.check(self)
        if not 0 <= self.bootstrap_port < 65536:
            raise ValueError("the bootstrap port must be in [0, 65535]")
        if not (self.kv_hold_s > 0 and self.kv_wait_timeout_s > 0):
            raise ValueError("KV hold and wait timeouts must be positive")

    def transfer_s(self, tokens: int) -> float:
        """Model seconds to move the KV of ``tokens`` tokens."""
        return kv_transfer.seconds(self, tokens)


@dataclass
class PdStats:
    sent: int = 0
    sent_tokens: int = 0
    received: int = 0
    received_tokens: int = 0
    failures: int = 0  # decodes whose transfer failed; prefills' KV never pulled (expired)


@dataclass
class Leg:
    """What the worker's role makes of one generation request."""

    gen: GenRequest
    kv_transferred: bool = False  # decode: the prompt's KV arrived from the prefill
    on_end: Callable[[bool], None] | None = None  # prefill: the KV is ready (True) or lost
    extra: dict[str, Any] = field(default_factory=dict)  # added to a non-streamed body


@dataclass
class _Held:
    """KV a prefill worker holds for a decode: a vLLM transfer or a SGLang room."""

    tokens: int
    expires: float  # loop time
    ready: bool = False
    block_ids: list[int] = field(default_factory=list)


def _loopback(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unavailable(message: str) -> ApiError:
    return ApiError(message, 503, "ServiceUnavailableError")


class Disaggregation:
    """The PD side of one sim worker: checks the protocol fields, holds the prefill's KV,
    pulls (vLLM) or polls (SGLang) it on the decode and waits out the transfer."""

    def __init__(self, config: PdConfig, flavor: str, worker: RealTimeWorker) -> None:
        self.config = config
        self.flavor = flavor
        self.worker = worker
        self.engine_id = str(uuid.uuid4())
        self.stats = PdStats()
        self.held: dict[str | int, _Held] = {}  # vLLM: by request id; SGLang: by room
        self._next_block = 0
        self.bootstrap: BootstrapServer | None = None
        if config.role == "prefill" and flavor == "sglang":
            self.bootstrap = BootstrapServer(config.host, config.bootstrap_port, self.room)

    @property
    def mode(self) -> str:
        """SGLang's ``disaggregation_mode``: "null" when aggregated."""
        return "null" if self.config.role == "both" else self.config.role

    async def start(self) -> None:
        if self.bootstrap is not None:
            await self.bootstrap.start()

    def close(self) -> None:
        if self.bootstrap is not None:
            self.bootstrap.close()

    # ---- requests ----------------------------------------------------------------------

    async def leg(
        self,
        body: dict[str, Any],
        gen: GenRequest,
        adapter: str | None,
        request_id: str,
        server: tuple[str, int] | None,
    ) -> Leg:
        """Check ``body``'s PD fields for this role; a decode gets its KV first (may take
        the transfer time, or fail with a 503)."""
        role, sglang = self.config.role, self.flavor == "sglang"
        if role == "both":
            return Leg(gen)
        if role == "prefill":
            if sglang:
                return self._sglang_prefill(body, gen, server)
            return self._vllm_prefill(body, gen, request_id, server)
        if sglang:
            tokens = await self._sglang_pull(body, gen, adapter)
        else:
            tokens = await self._vllm_pull(body, gen, adapter, request_id)
        await asyncio.sleep(self.config.transfer_s(tokens) / self.worker.scale)
        self.stats.received += 1
        self.stats.received_tokens += tokens
        return Leg(gen, kv_transferred=True)

    def _hold(self, key: str | int, held: _Held, now: bool) -> Callable[[bool], None]:
        """The callback the prefill's end calls: ``held`` is ready (True) or lost; ``now``:
        registered (not ready) at once, as a SGLang room is."""
        if now:
            self.held[key] = held

        def end(ok: bool) -> None:
            if not ok:
                self.held.pop(key, None)
                return
            held.ready, held.expires = True, self.worker.clock() + self.config.kv_hold_s
            self.held[key] = held

        return end

    def _purge(self) -> None:
        now = self.worker.clock()
        for key in [k for k, h in self.held.items() if h.expires <= now]:
            held = self.held.pop(key)
            if held.ready:
                self.stats.failures += 1
                log.info("KV of %r expired on the prefill worker, never pulled", key)

    def _cached_tokens(self, gen: GenRequest, adapter: str | None) -> int:
        """Prompt tokens a decode has in its own prefix cache now (not transferred)."""
        self.worker.sync()
        blocks = gen.prompt.blocks
        if adapter is not None:
            blocks = tuple(adapter_blocks(blocks, adapter))
        hit = self.worker.model.cached_prefix_blocks(blocks)
        return min(hit * BLOCK_TOKENS, gen.prompt.input_length)

    def _failed(self, message: str) -> ApiError:
        self.stats.failures += 1
        log.warning("KV transfer failed: %s", message)
        return _unavailable(message)

    # ---- vLLM --------------------------------------------------------------------------

    def _vllm_prefill(
        self, body: dict[str, Any], gen: GenRequest, request_id: str, server: Any
    ) -> Leg:
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict) or params.get("do_remote_decode") is not True:
            got = "none" if params is None else json.dumps(params)[:200]
            raise ApiError(
                "this is a prefill worker (--role prefill, vLLM's NixlConnector protocol): a "
                'request must carry "kv_transfer_params" with "do_remote_decode": true '
                f"(got kv_transfer_params: {got})"
            )
        if gen.stream:
            raise ApiError("a prefill worker answers non-streamed: 'stream' must be false")
        n = math.ceil(gen.prompt.input_length / BLOCK_TOKENS)
        ids = list(range(self._next_block, self._next_block + n))
        self._next_block += n
        host, port = server if server else (self.config.host, 0)
        held = _Held(gen.prompt.input_length, 0.0, ready=False, block_ids=ids)
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": ids,
            "remote_host": host,
            "remote_port": port,
            "remote_request_id": request_id,
            "tp_size": 1,
        }
        self._purge()
        return Leg(
            gen, on_end=self._hold(request_id, held, False), extra={"kv_transfer_params": params}
        )

    async def _vllm_pull(
        self, body: dict[str, Any], gen: GenRequest, adapter: str | None, request_id: str
    ) -> int:
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
            raise ApiError(
                "this is a decode worker (--role decode, vLLM's NixlConnector protocol): a "
                'request must carry "kv_transfer_params" with "do_remote_prefill": true and '
                "the prefill worker's remote_engine_id, remote_block_ids, remote_host, "
                "remote_port (its response's kv_transfer_params)"
            )
        ids = params.get("remote_block_ids")
        checks = {
            "remote_engine_id": isinstance(params.get("remote_engine_id"), str),
            "remote_block_ids": isinstance(ids, list) and all(_is_int(i) for i in ids),
            "remote_host": isinstance(params.get("remote_host"), str),
            "remote_port": _is_int(params.get("remote_port")),
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ApiError(
                f"kv_transfer_params: {', '.join(bad)} missing or of the wrong type (a decode "
                "worker needs the prefill worker's kv_transfer_params)"
            )
        rid = params.get("remote_request_id") or request_id
        skip = self._cached_tokens(gen, adapter) // BLOCK_TOKENS
        prefill = f"http://{_url_host(params['remote_host'])}:{params['remote_port']}"
        pull = {
            "remote_engine_id": params["remote_engine_id"],
            "remote_request_id": rid,
            "remote_block_ids": ids[skip:],
        }
        try:
            async with httpx.AsyncClient(timeout=PULL_TIMEOUT_S, trust_env=False) as client:
                r = await client.post(prefill + "/sim/kv_pull", json=pull)
        except httpx.HTTPError as exc:
            raise self._failed(f"KV pull from prefill worker {prefill} failed: {exc!r}") from None
        tokens = _json(r).get("tokens") if r.status_code == 200 else None
        if not _is_int(tokens):
            raise self._failed(
                f"prefill worker {prefill} has no KV for request {rid!r} "
                f"(HTTP {r.status_code}: {_message(r)})"
            )
        return tokens

    def kv_pull(self, body: dict[str, Any]) -> dict[str, Any]:
        """A decode's pull of held KV (``POST /sim/kv_pull``): one pull, then it is gone."""
        engine, rid = body.get("remote_engine_id"), body.get("remote_request_id")
        ids = body.get("remote_block_ids")
        if ids is not None and not (isinstance(ids, list) and all(_is_int(i) for i in ids)):
            raise ApiError("'remote_block_ids' must be a list of ints")
        self._purge()
        held = self.held.get(rid) if engine == self.engine_id and isinstance(rid, str) else None
        if held is None or not held.ready:
            raise ApiError(
                f"no KV held for request {rid!r} of engine {engine!r} (this engine is "
                f"{self.engine_id}; unknown, already pulled or expired)",
                404,
                "NotFoundError",
            )
        index = {b: i for i, b in enumerate(held.block_ids)}
        if ids is None:
            ids = held.block_ids
        if any(b not in index for b in ids):
            raise ApiError(f"block ids not of request {rid!r}", 404, "NotFoundError")
        last = held.tokens - BLOCK_TOKENS * (len(held.block_ids) - 1)
        tokens = sum(last if index[b] == len(index) - 1 else BLOCK_TOKENS for b in ids)
        del self.held[rid]
        self.stats.sent += 1
        self.stats.sent_tokens += tokens
        return {"tokens": tokens}

    # ---- SGLang ------------------------------------------------------------------------

    def _bootstrap_fields(self, body: dict[str, Any]) -> tuple[str, int, int]:
        host, port, room = (body.get(k) for k in BOOTSTRAP_FIELDS)
        if not (isinstance(host, str) and _is_int(port) and _is_int(room) and 0 <= room < 2**64):
            raise ApiError(
                f"this is a {self.config.role} worker (--role {self.config.role}, SGLang's "
                "disaggregation protocol): a request must carry bootstrap_host (string), "
                "bootstrap_port (int) and bootstrap_room (int in [0, 2**63)) of its prefill "
                f"worker (got {host!r}, {port!r}, {room!r})"
            )
        return host, port, room

    def _sglang_prefill(self, body: dict[str, Any], gen: GenRequest, server: Any) -> Leg:
        host, port, room = self._bootstrap_fields(body)
        assert self.bootstrap is not None
        mine = {_loopback(self.config.host)}
        if server:
            mine.add(_loopback(server[0]))
        own = self.config.host in _WILDCARD or _loopback(host) in mine
        if not own or port != self.bootstrap.port:
            raise ApiError(
                f"bootstrap_host/bootstrap_port {host}:{port} are not this prefill worker's "
                f"(its bootstrap server is {self.config.host}:{self.bootstrap.port})"
            )
        self._purge()
        now = self.worker.clock()
        held = _Held(gen.prompt.input_length, now + self.config.kv_hold_s, ready=False)
        return Leg(replace(gen, max_tokens=1), on_end=self._hold(room, held, True))

    def room(self, room: int, cached: int) -> tuple[int, dict[str, Any]]:
        """``GET /sim/room/{room}`` on the bootstrap listener: consumed on a ready read
        (``cached``: prompt tokens the decode has itself, not sent)."""
        self._purge()
        held = self.held.get(room)
        if held is None:
            return 404, ApiError(f"unknown bootstrap room {room}", 404, "NotFoundError").body()
        if held.ready:
            del self.held[room]
            self.stats.sent += 1
            self.stats.sent_tokens += max(0, held.tokens - cached)
        return 200, {"ready": held.ready, "tokens": held.tokens}

    async def _sglang_pull(self, body: dict[str, Any], gen: GenRequest, adapter: str | None) -> int:
        host, port, room = self._bootstrap_fields(body)
        url = f"http://{_url_host(host)}:{port}/sim/room/{room}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.kv_wait_timeout_s
        timeout = min(PULL_TIMEOUT_S, self.config.kv_wait_timeout_s)
        seen = False
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            while True:
                cached = self._cached_tokens(gen, adapter)
                try:
                    r = await client.get(url, params={"cached_tokens": cached})
                except httpx.ConnectError as exc:
                    raise self._failed(
                        f"prefill worker's bootstrap server {host}:{port} unreachable: {exc!r}"
                    ) from None
                except httpx.HTTPError:
                    r = None  # a slow answer: poll again until the deadline
                if r is not None and r.status_code == 200:
                    state = _json(r)
                    if state.get("ready") and _is_int(state.get("tokens")):
                        return max(0, state["tokens"] - cached)
                    seen = True
                elif r is not None and (r.status_code != 404 or seen):
                    raise self._failed(
                        f"bootstrap room {room} on prefill worker {host}:{port} lost "
                        f"(HTTP {r.status_code}: {_message(r)})"
                    )
                if loop.time() >= deadline:
                    raise self._failed(
                        f"bootstrap room {room} on prefill worker {host}:{port} not ready "
                        f"after {self.config.kv_wait_timeout_s:g} s"
                    )
                await asyncio.sleep(POLL_S)


def _json(r: httpx.Response) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        body = r.json()
        if isinstance(body, dict):
            return body
    return {}


def _message(r: httpx.Response) -> str:
    error = _json(r).get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return r.text[:200]


# ---- SGLang's bootstrap listener -------------------------------------------------------


class BootstrapServer:
    """A second listening socket (bound at construction, so port 0 resolves at once) with a
    minimal HTTP/1.1 server: ``GET /sim/room/{room}[?cached_tokens=N]`` and ``GET /health``.
    Connections made before :meth:`start` wait in the backlog."""

    IDLE_S = 30.0

    def __init__(
        self, host: str, port: int, room: Callable[[int, int], tuple[int, dict[str, Any]]]
    ) -> None:
        host = _loopback(host)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self.room = room
        self._server: asyncio.Future[asyncio.Server] | None = None

    async def start(self) -> None:
        if self._server is None:
            self._server = asyncio.ensure_future(asyncio.start_server(self._serve, sock=self.sock))
        await self._server

    def close(self) -> None:
        if self._server is not None and self._server.done() and not self._server.exception():
            self._server.result().close()
        self.sock.close()

    def route(self, method: str, target: str) -> tuple[int, dict[str, Any]]:
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        if url.path == "/health":
            return 200, {}
        if len(parts) != 3 or parts[:2] != ["sim", "room"]:
            return 404, ApiError(f"Not Found: {url.path}", 404, "NotFoundError").body()
        if method != "GET":
            return 405, ApiError("Method Not Allowed", 405, "MethodNotAllowedError").body()
        try:
            room = int(parts[2])
            cached = int(parse_qs(url.query).get("cached_tokens", ["0"])[0])
        except ValueError:
            return 400, ApiError("room and cached_tokens must be integers").body()
        return self.room(room, cached)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await asyncio.wait_for(reader.readline(), self.IDLE_S)
                if not line:
                    break
                headers = dict(_headers(await _head_lines(reader)))
                length = int(headers.get("content-length") or 0)
                if length:
                    await reader.readexactly(length)
                request = line.decode("latin-1").split()
                if len(request) == 3:
                    status, body = self.route(request[0], request[1])
                else:
                    status, body = 400, ApiError("malformed request line").body()
                close = headers.get("connection", "").lower() == "close"
                payload = json.dumps(body).encode()
                head = (
                    f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
                    "content-type: application/json\r\n"
                    f"content-length: {len(payload)}\r\n"
                    f"connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                )
                writer.write(head.encode() + payload)
                await writer.drain()
                if close:
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def _head_lines(reader: asyncio.StreamReader) -> list[bytes]:
    lines = []
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return lines
        lines.append(line)
        if len(lines) > 100:
            raise ValueError("too many header lines")


def _headers(lines: list[bytes]) -> Iterator[tuple[str, str]]:
    for line in lines:
        key, _, value = line.decode("latin-1").partition(":")
        yield key.strip().lower(), value.strip()


# ---- metrics ---------------------------------------------------------------------------


class PdCollector(Collector):
    """``sim:kv_transfers_total{direction}``, ``sim:kv_transfer_tokens_total{direction}``
    (sent: prefill, received: decode) and ``sim:kv_transfer_failures_total``."""

    def __init__(self, pd: Disaggregation) -> None:
        self.pd = pd

    def collect(self) -> Iterator[Metric]:
        self.pd._purge()
        stats = self.pd.stats
        transfers = CounterMetricFamily(
            "sim:kv_transfers", "KV transfers of disaggregated serving.", labels=["direction"]
        )
        tokens = CounterMetricFamily(
            "sim:kv_transfer_tokens",
            "Prompt tokens whose KV was transferred.",
            labels=["direction"],
        )
        for direction, n, t in (
            ("sent", stats.sent, stats.sent_tokens),
            ("received", stats.received, stats.received_tokens),
        ):
            transfers.add_metric([direction], n)
            tokens.add_metric([direction], t)
        yield transfers
        yield tokens
        failures = CounterMetricFamily(
            "sim:kv_transfer_failures",
            "KV transfers that failed: a decode's pull or wait, a prefill's KV never pulled.",
        )
        failures.add_metric([], stats.failures)
        yield failures

"""A worker of a disaggregated fleet whose answer the test sets: a real asyncio HTTP/1.1 server
on 127.0.0.1, for the P/D fault tests and the P/D fuzz suite (where sim workers are too slow
to start per case and cannot misbehave on demand).

Its ``ok`` behaviour is the engines' protocol as the router's legs expect it, checked:

- vLLM prefill: the body must be a one-token, unstreamed request asking for a remote decode;
  the answer carries ``kv_transfer_params``, kept in the shared :class:`Handoff` under the
  request's ``X-Request-Id`` (``null_kv``: ``null`` there, a connector that needs none);
- vLLM decode: 400 unless the request carries exactly the params its prefill gave (none
  where the prefill gave ``null``): a decode leg sent wrong is seen, not guessed;
- SGLang prefill: the bootstrap fields must be there; it marks the room ready, then answers;
- SGLang decode: the same fields; it waits for its room (as the engine waits for the KV),
  at most ``kv_wait_s``, then answers: 503 when the KV will not come.

Every other behaviour is one way a worker fails (:data:`FAILURES`). A failing SGLang prefill
marks its room failed at once, so its decode's 503 races the prefill's own failure to the
router; a hung one never marks it, so its decode waits. Everything runs on one
:class:`WorkerLoop` (an event loop in a thread); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson

MODEL = "pd-model"
TEXT_PIECES = ("hel", "lo ", "wor", "ld")
TEXT = "".join(TEXT_PIECES)
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions"})

OK, NULL_KV, HANG = "ok", "null_kv", "hang"
RESET, CLOSE = "reset", "close"  # once the request is read: RST, or FIN without an answer
CUT_HEADERS, CUT_BODY = "cut_headers", "cut_body"  # headers (and half the body), then closed
STATUSES = ("status:500", "status:502", "status:503")
GARBAGE = {
    "garbage:not_json": b'{"id": "x", "kv_transfer_params": {not json',
    "garbage:not_object": b'["a", 1]',
    "garbage:empty": b"",
    "garbage:kv_not_object": orjson.dumps(
        {"id": "c", "object": "chat.completion", "choices": [], "kv_transfer_params": "kv"}
    ),
    "garbage:kv_list": orjson.dumps({"id": "c", "choices": [], "kv_transfer_params": [1, 2]}),
    "garbage:no_kv": orjson.dumps(
        {
            "id": "c",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    ),
}
FAILURES = (RESET, CLOSE, HANG, CUT_HEADERS, CUT_BODY, *STATUSES, *GARBAGE)


class WorkerLoop:
    """An event loop in a daemon thread, for the workers (and any coroutine the test runs)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="pd")
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what still runs there (connections held open, a hung answer), then stop."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_all(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


@dataclass
class Handoff:
    """What passes between the two legs of a pair, as the engines pass it: vLLM's params by
    request id, SGLang's rooms by (bootstrap port, room): True ready, False failed."""

    params: dict[str, Any] = field(default_factory=dict)
    rooms: dict[tuple[int, int], asyncio.Future] = field(default_factory=dict)

    def room(self, key: tuple[int, int]) -> asyncio.Future:
        future = self.rooms.get(key)
        if future is None:
            future = self.rooms[key] = asyncio.get_running_loop().create_future()
        return future

    def settle_room(self, key: tuple[int, int] | None, ready: bool) -> None:
        if key is not None and not self.room(key).done():
            self.room(key).set_result(ready)

    def clear(self) -> None:
        self.params.clear()
        self.rooms.clear()


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}


class PdWorker:
    """One worker (``role`` prefill or decode, ``flavor`` vllm or sglang) answering each
    generation request as ``behaviour`` says; ``requests`` counts them."""

    def __init__(
        self,
        role: str,
        flavor: str,
        handoff: Handoff,
        bootstrap_port: int = 0,
        kv_wait_s: float = 2.0,
        model: str = MODEL,
        pace_s: float = 0.0,
    ) -> None:
        self.role, self.flavor, self.handoff = role, flavor, handoff
        self.model = model
        self.bootstrap_port = bootstrap_port
        self.kv_wait_s = kv_wait_s
        self.pace_s = pace_s  # an answer's head, then its body, each this long after the last
        self.behaviour = OK
        self.requests = 0
        self.refused: list[str] = []  # why an ``ok`` worker refused a leg (the router's fault)
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> PdWorker:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    # ---- HTTP ------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while (request := await _read_request(reader)) is not None:
                if not await self._answer(request, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # the loop closing: nothing to report
            pass
        finally:
            writer.close()

    async def _answer(self, request: Request, reader, writer) -> bool:
        """Answer one request; False: the connection is to be closed."""
        if request.path not in GENERATION:
            status, body = (200, b"") if request.path == "/health" else (404, b"{}")
            if request.path == "/v1/models":
                status, body = 200, orjson.dumps({"object": "list", "data": [{"id": self.model}]})
            writer.write(_head(status, "application/json", len(body)) + body)
            await writer.drain()
            return True
        self.requests += 1
        behaviour, body = self.behaviour, request.json()
        room = self._room_key(body)
        if behaviour in (OK, NULL_KV) or behaviour in GARBAGE:
            answer = await self._ok(request, body, room)
            if behaviour in GARBAGE:
                answer = (200, "application/json", GARBAGE[behaviour], None)
            return await _send(writer, *answer, pace=self.pace_s)
        if behaviour == HANG:  # (a hung prefill never says its KV failed)
            with contextlib.suppress(ConnectionError):
                while await reader.read(1 << 16):
                    pass
            return False
        self.handoff.settle_room(room if self.role == "prefill" else None, False)
        if behaviour == RESET:
            writer.transport.abort()
            return False
        if behaviour == CLOSE:
            return False
        if behaviour.startswith("status:"):
            error = _error(f"{self.role} worker failed", "server_error")
            return await _send(writer, int(behaviour[7:]), "application/json", error, None)
        _, content_type, whole, _ = _answer_body(request.path, body, self.role)
        writer.write(_head(200, content_type, len(whole)))
        if behaviour == CUT_BODY:
            writer.write(whole[: len(whole) // 2])
        await writer.drain()
        return False

    # ---- the protocols ---------------------------------------------------------------------

    def _room_key(self, body: dict[str, Any]) -> tuple[int, int] | None:
        port, room = body.get("bootstrap_port"), body.get("bootstrap_room")
        if self.flavor != "sglang" or not isinstance(port, int) or not isinstance(room, int):
            return None
        return port, room

    async def _ok(self, request: Request, body: dict[str, Any], room) -> tuple:
        """The protocol's answer (status, content type, body, SSE pieces or None)."""
        why = self._refusal(request, body, room)
        if why is not None:
            self.refused.append(why)
            self.handoff.settle_room(room if self.role == "prefill" else None, False)
            return 400, "application/json", _error(why, "invalid_request_error"), None
        if self.flavor == "sglang" and self.role == "decode":
            try:
                ready = await asyncio.wait_for(
                    asyncio.shield(self.handoff.room(room)), self.kv_wait_s
                )
            except TimeoutError:
                ready = False
            if not ready:
                return 503, "application/json", _error("KV transfer failed", "server_error"), None
        answer = _answer_body(request.path, body, self.role)
        if self.role == "prefill" and self.flavor == "vllm":
            params = None
            if self.behaviour != NULL_KV:
                rid = request.headers.get("x-request-id", "")
                params = {"do_remote_prefill": True, "remote_engine_id": self.url,
                          "remote_block_ids": [1, 2], "remote_host": "127.0.0.1",
                          "remote_port": self.port, "remote_request_id": rid}  # fmt: skip
            self.handoff.params[request.headers.get("x-request-id", "")] = params
            data = orjson.loads(answer[2])
            answer = (200, "application/json", orjson.dumps({**data, "kv_transfer_params": params}),
                      None)  # fmt: skip
        self.handoff.settle_room(room if self.role == "prefill" else None, True)
        return answer

    def _refusal(self, request: Request, body: dict[str, Any], room) -> str | None:
        """Why this leg is not what the engine's protocol sends (None: it is)."""
        if self.flavor == "sglang":
            host = body.get("bootstrap_host")
            if room is None or host != "127.0.0.1":
                return "no bootstrap_host / bootstrap_port / bootstrap_room"
            if self.role == "prefill" and room[0] != self.bootstrap_port:
                return f"bootstrap_port {room[0]} is not this worker's {self.bootstrap_port}"
            return None
        params = body.get("kv_transfer_params")
        if self.role == "prefill":
            if not isinstance(params, dict) or params.get("do_remote_decode") is not True:
                return "a prefill leg must ask for a remote decode"
            if body.get("stream") or body.get("max_tokens") != 1:
                return "a prefill leg is one token, not streamed"
            return None
        rid = request.headers.get("x-request-id", "")
        if rid not in self.handoff.params:
            return f"no prefill leg ran for request id {rid!r}"
        if params != self.handoff.params[rid]:
            return f"kv_transfer_params {params!r} are not its prefill's"
        return None


# ---- bytes ---------------------------------------------------------------------------------


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return Request(method, path.split("?", 1)[0], headers, body)


def _head(status: int, content_type: str, length: int | None) -> bytes:
    framing = b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    return b"HTTP/1.1 %d X\r\ncontent-type: %s\r\n%s\r\n\r\n" % (
        status,
        content_type.encode(),
        framing,
    )


def _error(message: str, type_: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": type_}})


def _answer_body(path: str, body: dict[str, Any], role: str) -> tuple:
    """A completion of :data:`TEXT` (one token for a prefill leg): (200, content type, the
    whole body, its SSE events or None). A stream is SSE, ending in a usage chunk when asked."""
    chat = path == "/v1/chat/completions"
    pieces = TEXT_PIECES[:1] if role == "prefill" and not body.get("stream") else TEXT_PIECES
    usage = {"prompt_tokens": 5, "completion_tokens": len(pieces), "total_tokens": 5 + len(pieces),
             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    if not body.get("stream"):
        text = "".join(pieces)
        choice = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        data = {"id": "cmpl-pd", "object": "chat.completion" if chat else "text_completion",
                "model": MODEL, "choices": [choice], "usage": usage}  # fmt: skip
        return 200, "application/json", orjson.dumps(data), None
    events = []
    for piece in pieces:
        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
        events.append({"id": "cmpl-pd", "model": MODEL, "choices": [choice]})
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        events.append({"id": "cmpl-pd", "model": MODEL, "choices": [], "usage": usage})
    sse = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    return 200, "text/event-stream", b"".join(sse), sse


async def _send(
    writer: asyncio.StreamWriter, status, content_type, whole, sse, pace: float = 0.0
) -> bool:
    """Write an answer; with ``pace``, its head and then its body each ``pace`` seconds
    after the last (a slow worker that is never silent for long)."""
    if sse is None:
        head, body = _head(status, content_type, len(whole)), whole
    else:
        head = _head(status, content_type, None)
        body = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in sse) + b"0\r\n\r\n"
    if pace:
        for piece in (head, body):
            await asyncio.sleep(pace)
            writer.write(piece)
    else:
        writer.write(head + body)
    await writer.drain()
    return True


def sse_text(body: bytes) -> tuple[str, list[dict], bool]:
    """A client's SSE body: the text of its deltas, its error events, whether it ended with
    ``[DONE]``."""
    text, errors, done = [], [], False
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        event = orjson.loads(data)
        if "error" in event:
            errors.append(event["error"])
        for choice in event.get("choices") or ():
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(text), errors, done

"""A small OpenAI / SGLang-compatible worker for the proxy tests, on 127.0.0.1.

It runs its own event loop in a thread (asyncio protocols + httptools), so a test can start,
kill (abort every connection, stop listening: what a crash looks like from outside) and
restart it on the same port. It keeps a real prefix cache (the project's radix tree) over
pseudo-tokens (4 UTF-8 bytes a token, or the client's token ids) and reports
``usage.prompt_tokens_details.cached_tokens`` (vLLM) and ``meta_info.cached_tokens``
(SGLang).

Knobs, as attributes or per request as headers (``x-fake-<name>``):
``delay`` (s before the first byte), ``chunk_delay`` (s between stream chunks), ``chunks``
(content chunks), ``status`` (answer this status with an error body), ``reset`` (close the
connection without answering), ``hang`` (never answer), ``report_cached`` (0/1).

Endpoints: POST /v1/chat/completions, /v1/completions, /generate, /tokenize;
GET /health, /v1/models.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from typing import Any

import httptools
import numpy as np

from router.cache.radix_tree import RadixTree

MODEL = "fake-model"


def pseudo_tokens(text: str) -> np.ndarray:
    """4 UTF-8 bytes a token (zero-padded), the same approximation the proxy uses."""
    data = text.encode("utf-8", "surrogatepass")
    data += b"\0" * (-len(data) % 4)
    return np.frombuffer(data, dtype="<u4")


def chat_text(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role')}|>\n{content or ''}\n")
    return "".join(parts) + "<|assistant|>\n"


class _Request:
    __slots__ = ("body", "headers", "method", "url")

    def __init__(self) -> None:
        self.url = b""
        self.method = b""
        self.headers: dict[str, str] = {}
        self.body = bytearray()


class _Conn(asyncio.Protocol):
    def __init__(self, worker: FakeWorker, life: int) -> None:
        self.worker = worker
        self.life = life  # the worker's life (start) that accepted this connection
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.request: _Request | None = None
        self.queue: deque[_Request] = deque()
        self.busy = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.life != self.worker._life:
            # accepted by the kernel before a kill, made here after it: a crashed process
            # would never answer it (asyncio makes accepted connections in a later task)
            transport.abort()
            return
        self.worker._conns.add(self)
        self.worker.accepted += 1

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.worker._conns.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.abort()

    def on_message_begin(self) -> None:
        self.request = _Request()

    def on_url(self, url: bytes) -> None:
        self.request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # latin-1, as HTTP servers read header bytes (vLLM's uvicorn too): never fails
        self.request.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.request.body += body

    def on_message_complete(self) -> None:
        self.request.method = self.parser.get_method()
        self.queue.append(self.request)
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self.queue and not self.closed:
                await self.worker._handle(self, self.queue.popleft())
        finally:
            self.busy = False

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)


def _response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    return (
        f"HTTP/1.1 {status} {reason.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nx-fake-worker: yes\r\n\r\n"
    ).encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class FakeWorker:
    """The fake worker; ``start()`` it, then use ``url``; ``kill()`` / ``start()`` at will."""

    def __init__(self, name: str = "w", cache_tokens: int | None = None, **knobs: Any) -> None:
        self.name = name
        self.delay = 0.0
        self.chunk_delay = 0.0
        self.chunks = 4
        self.status = 0
        self.reset = False
        self.hang = False
        self.report_cached = True
        self.healthy = True
        self.metrics_text: str | None = None  # GET /metrics answers this when set
        # GET /v1/models' entries (vLLM's shape: an adapter has "parent"); a request naming
        # another model is answered 404, as vLLM does
        self.models: list[dict[str, Any]] = [{"id": MODEL, "object": "model", "parent": None}]
        for key, value in knobs.items():
            if not hasattr(self, key):
                raise TypeError(f"unknown knob {key}")
            setattr(self, key, value)
        self.cache = RadixTree(capacity_tokens=cache_tokens)
        self.requests: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.completed = 0
        self.cancelled = 0  # responses cut because the client (the proxy) went away
        self.in_flight = 0
        self.prefilling = 0  # generation requests in their ``delay`` (nothing answered yet)
        self.streaming = 0  # streams whose head is sent and whose end is not
        self.accepted = 0  # connections accepted (keep-alive reuse shows here)
        self.port = 0
        self._conns: set[_Conn] = set()
        self._server: asyncio.AbstractServer | None = None
        self._life = 0  # bumped by every kill: connections of an earlier life are refused
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=name)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> FakeWorker:
        """Listen (again) on the same port (an ephemeral one the first time)."""

        async def listen() -> None:
            life = self._life
            self._server = await self._loop.create_server(
                lambda: _Conn(self, life), "127.0.0.1", self.port, reuse_address=True, backlog=4096
            )
            self.port = self._server.sockets[0].getsockname()[1]

        self._call(listen())
        return self

    def kill(self) -> None:
        """Stop listening and abort every connection, as a crashed process would."""

        async def die() -> None:
            self._life += 1
            if self._server is not None:
                self._server.close()
                self._server = None
            for conn in list(self._conns):
                conn.transport.abort()

        self._call(die())

    def close(self) -> None:
        """Kill, then stop the thread (only what this object started)."""
        self.kill()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def reset_cache(self) -> None:
        self._call(self._reset_cache())

    async def _reset_cache(self) -> None:
        self.cache.reset()

    # ---- request handling ----------------------------------------------------------------

    def _knob(self, req: _Request, name: str, kind=float):
        value = req.headers.get("x-fake-" + name.replace("_", "-"))
        return kind(value) if value is not None else getattr(self, name)

    async def _handle(self, conn: _Conn, req: _Request) -> None:
        path = req.url.split(b"?")[0].decode()
        method = req.method.decode()
        if method == "GET":
            if path == "/health":
                conn.write(_response(200 if self.healthy else 503, b"{}"))
            elif path == "/v1/models":
                body = {"object": "list", "data": self.models}
                conn.write(_response(200, json.dumps(body).encode()))
            elif path == "/metrics" and self.metrics_text is not None:
                conn.write(_response(200, self.metrics_text.encode(), "text/plain"))
            else:
                conn.write(_response(404, b'{"error": "not found"}'))
            return
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            conn.write(_response(400, b'{"error": {"message": "bad json"}}'))
            return
        query = req.url.partition(b"?")[2].decode()
        self.requests.append(
            {
                "path": path,
                "query": query,
                "headers": dict(req.headers),
                "body": body,
                "worker": self.name,
            }
        )
        if path == "/tokenize":
            tokens = self._tokens(body)
            out = {"count": len(tokens), "max_model_len": 131072, "tokens": tokens.tolist()}
            conn.write(_response(200, json.dumps(out).encode()))
            return
        if path not in ("/v1/chat/completions", "/v1/completions", "/generate"):
            conn.write(_response(404, b'{"error": "not found"}'))
            return
        self.in_flight += 1
        try:
            await self._generate(conn, req, path, body)
        finally:
            self.in_flight -= 1

    def _tokens(self, body: dict[str, Any]) -> np.ndarray:
        if "messages" in body:
            return pseudo_tokens(chat_text(body["messages"]))
        prompt = body.get("prompt", body.get("text", body.get("input_ids", "")))
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return np.asarray(prompt, dtype=np.uint32)
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        return pseudo_tokens(prompt)

    async def _generate(self, conn: _Conn, req: _Request, path: str, body: dict) -> None:
        model = body.get("model")
        if isinstance(model, str) and model not in {m.get("id") for m in self.models}:
            error = {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
            conn.write(_response(404, json.dumps(error).encode()))
            return
        if self._knob(req, "reset", int):
            conn.transport.abort()
            return
        if self._knob(req, "hang", int):
            while not conn.closed:  # until the client gives up
                await asyncio.sleep(0.02)
            self.cancelled += 1
            return
        status = self._knob(req, "status", int)
        delay = self._knob(req, "delay")
        if delay:
            self.prefilling += 1
            try:
                await asyncio.sleep(delay)
            finally:
                self.prefilling -= 1
        if conn.closed:
            self.cancelled += 1
            return
        if status:
            error = {"error": {"message": f"fake error {status}", "type": "fake", "code": status}}
            conn.write(_response(status, json.dumps(error).encode()))
            return
        tokens = self._tokens(body)
        cached = min(self.cache.prefix_length(tokens), len(tokens))
        self.cache.insert(tokens)
        prompt_tokens = len(tokens)
        report = bool(self._knob(req, "report_cached", int))
        chunks = self._knob(req, "chunks", int)
        if body.get("stream"):
            self.streaming += 1
            try:
                await self._stream(conn, req, path, body, prompt_tokens, cached, report, chunks)
            finally:
                self.streaming -= 1
        else:
            conn.write(
                _response(
                    200,
                    json.dumps(self._whole(path, prompt_tokens, cached, report, chunks)).encode(),
                )
            )
            self.completed += 1

    def _usage(self, prompt_tokens: int, cached: int, report: bool, completion: int) -> dict:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        if report:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _whole(self, path: str, prompt_tokens: int, cached: int, report: bool, n: int) -> dict:
        text = " tok" * n
        if path == "/generate":
            meta = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "finish_reason": {"type": "length"},
            }
            if report:
                meta["cached_tokens"] = cached
            return {"text": text, "meta_info": meta}
        usage = self._usage(prompt_tokens, cached, report, n)
        if path == "/v1/chat/completions":
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
            }
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": MODEL,
            "usage": usage,
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}],
        }

    async def _stream(self, conn, req, path, body, prompt_tokens, cached, report, n) -> None:
        conn.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        chunk_delay = self._knob(req, "chunk_delay")
        options = body.get("stream_options") or {}
        created = int(time.time())
        for i in range(n):
            if i and chunk_delay:
                await asyncio.sleep(chunk_delay)
            if conn.closed:
                self.cancelled += 1
                return
            last = i == n - 1
            if path == "/generate":
                meta = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": i + 1,
                    "finish_reason": {"type": "length"} if last else None,
                }
                if report:
                    meta["cached_tokens"] = cached
                event = {"text": " tok" * (i + 1), "meta_info": meta}
            elif path == "/v1/chat/completions":
                delta = {"role": "assistant", "content": " tok"} if i == 0 else {"content": " tok"}
                event = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
                    ],
                }
            else:
                event = {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "created": created,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "text": " tok",
                            "logprobs": None,
                            "finish_reason": "length" if last else None,
                        }
                    ],
                }
            conn.write(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
        if path != "/generate" and options.get("include_usage"):
            event = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL,
                "choices": [],
                "usage": self._usage(prompt_tokens, cached, report, n),
            }
            conn.write(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
        conn.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.completed += 1

"""The sim worker's Responses API and embeddings, with vLLM's rules.

``POST /v1/responses`` (streamed or not), ``GET``/``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel`` and ``GET /v1/responses/{id}/input_items``. Like vLLM
(``VLLM_ENABLE_RESPONSES_API_STORE=1``), stored responses live in this server's memory only:
a ``previous_response_id`` or a call on an id this server did not make gets 404, which is
the rule a router in front of several workers has to respect. A continuation's prompt is
the stored conversation (each turn's input items and its answer) followed by the new
input, so the worker's prefix cache sees a conversation grow as on a real engine.

``POST /v1/embeddings``: one prefill per input through the same model (no output token),
a deterministic vector per input. ``POST /v1/audio/transcriptions``: the upload read as it
arrives (its size, digest and when its first byte came, so a test can tell a body streamed
through a router from one held whole), the form's ``model`` checked.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from router.core.parse import form_model
from traces.sim_worker.api import ApiError, chat_text, output_tokens, prompt_from_text
from traces.sim_worker.engine import RealTimeWorker, WorkerUnavailable

DEFAULT_MAX_OUTPUT_TOKENS = 16
EMBEDDING_DIM = 8
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class Stored:
    """One response kept by this server: its body, and the conversation up to and with it."""

    body: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, str]]  # chat messages: earlier turns, this input, the answer
    running: bool = False
    cancelled: bool = False


@dataclass
class ResponsesApi:
    """The handlers, over one worker model; ``check_model`` as the other endpoints check a
    request's model (the LoRA adapter it runs, None for the base model; 404 for another)."""

    worker: RealTimeWorker
    model_name: str
    check_model: Callable[[str | None], str | None]
    context_len: int
    ids: Any  # a random.Random: response and item ids
    store: dict[str, Stored] = field(default_factory=dict)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self.ids.getrandbits(96):024x}"

    def _stored(self, request: Request) -> Stored:
        response_id = request.path_params["response_id"]
        stored = self.store.get(response_id)
        if stored is None:
            raise ApiError(f"Response with id '{response_id}' not found.", 404, "NotFoundError")
        return stored

    async def create(self, request: Request) -> Response:
        body = await _json(request)
        adapter = self.check_model(_model(body))
        items = _input_items(body.get("input"))
        previous_id = body.get("previous_response_id")
        history: list[dict[str, str]] = []
        if previous_id is not None:
            previous = self.store.get(previous_id)
            if previous is None:
                raise ApiError(
                    f"Previous response with id '{previous_id}' not found.", 404, "NotFoundError"
                )
            history = list(previous.conversation)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ApiError("'instructions' must be a string")
        turn = history + [_message(item) for item in items]
        messages = ([{"role": "system", "content": instructions}] if instructions else []) + turn
        prompt = prompt_from_text(chat_text(messages))
        max_tokens = body.get("max_output_tokens") or DEFAULT_MAX_OUTPUT_TOKENS
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError("'max_output_tokens' must be a positive integer")
        if prompt.input_length + max_tokens > self.context_len:
            raise ApiError(
                f"This model's maximum context length is {self.context_len} tokens; the "
                f"request needs {prompt.input_length + max_tokens}."
            )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError("'stream' must be a boolean")
        try:
            handle = self.worker.submit(
                prompt.blocks, prompt.input_length, max_tokens, prompt.tokens, adapter
            )
        except WorkerUnavailable as exc:
            raise ApiError(f"worker unavailable: {exc}", 503, "ServiceUnavailableError") from None
        text = "".join(output_tokens(max_tokens))
        response_id = self._new_id("resp")
        head = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": adapter or self.model_name,
            "instructions": instructions,
            "previous_response_id": previous_id,
            "max_output_tokens": max_tokens,
            "store": body.get("store", True) is not False,
        }
        stored = Stored(
            {**head, "status": "in_progress", "output": [], "usage": None},
            items,
            [*turn, {"role": "assistant", "content": text}],
            running=True,
        )
        if head["store"]:
            self.store[response_id] = stored

        def finished() -> dict[str, Any]:
            req = handle.request
            message = {
                "type": "message",
                "id": self._new_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
            usage = {
                "input_tokens": req.input_length,
                "input_tokens_details": {"cached_tokens": req.cached_tokens},
                "output_tokens": req.output_length,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": req.input_length + req.output_length,
            }
            status = "cancelled" if stored.cancelled else "completed"
            stored.body = {**head, "status": status, "output": [message], "usage": usage}
            stored.running = False
            return stored.body

        if stream:
            return StreamingResponse(
                self._events(stored, handle, max_tokens, finished),
                media_type="text/event-stream",
            )
        try:
            await handle.done
        except WorkerUnavailable as exc:
            raise ApiError(f"worker unavailable: {exc}", 503, "ServiceUnavailableError") from None
        return JSONResponse(finished())

    async def _events(self, stored: Stored, handle, n: int, finished) -> AsyncIterator[bytes]:
        """OpenAI's event sequence: created, one text delta per token, completed."""
        seq = 0

        def event(kind: str, **data: Any) -> bytes:
            nonlocal seq
            seq += 1
            payload = {"type": kind, "sequence_number": seq, **data}
            return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

        yield event("response.created", response=stored.body)
        tokens = output_tokens(n)
        sent = 0
        async for ready in self.worker.progress(handle):
            for i in range(sent, ready):
                yield event("response.output_text.delta", output_index=0, delta=tokens[i])
            sent = ready
        yield event("response.completed", response=finished())

    async def retrieve(self, request: Request) -> Response:
        return JSONResponse(self._stored(request).body)

    async def delete(self, request: Request) -> Response:
        stored = self._stored(request)
        del self.store[stored.body["id"]]
        return JSONResponse({"id": stored.body["id"], "object": "response", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        stored = self._stored(request)
        if not stored.running:
            raise ApiError(f"Response '{stored.body['id']}' is not running; nothing to cancel.")
        stored.cancelled = True
        return JSONResponse({**stored.body, "status": "cancelled"})

    async def input_items(self, request: Request) -> Response:
        items = self._stored(request).input_items
        return JSONResponse(
            {
                "object": "list",
                "data": items,
                "first_id": items[0].get("id") if items else None,
                "last_id": items[-1].get("id") if items else None,
                "has_more": False,
            }
        )

    async def embeddings(self, request: Request) -> Response:
        body = await _json(request)
        adapter = self.check_model(_model(body))
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if (
            not isinstance(inputs, list)
            or not inputs
            or not all(isinstance(x, str) for x in inputs)
        ):
            raise ApiError("'input' must be text or a non-empty list of texts")
        data, total = [], 0
        for i, text in enumerate(inputs):
            prompt = prompt_from_text(text)
            try:  # a prefill and one token: the load an embedding brings
                handle = self.worker.submit(
                    prompt.blocks, prompt.input_length, 1, prompt.tokens, adapter
                )
                await handle.done
            except WorkerUnavailable as exc:
                raise ApiError(
                    f"worker unavailable: {exc}", 503, "ServiceUnavailableError"
                ) from None
            total += prompt.input_length
            digest = hashlib.blake2b(text.encode(), digest_size=EMBEDDING_DIM).digest()
            vector = [round(b / 255 - 0.5, 6) for b in digest]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        usage = {"prompt_tokens": total, "total_tokens": total}
        return JSONResponse(
            {"object": "list", "data": data, "model": adapter or self.model_name, "usage": usage}
        )


async def transcriptions(request: Request, model_name: str) -> Response:
    """An audio upload, read piece by piece: its size, sha256 and first byte's arrival."""
    digest = hashlib.sha256()
    size = 0
    first_at = None
    head = b""
    async for piece in request.stream():
        if piece and first_at is None:
            first_at = time.time()
        digest.update(piece)
        size += len(piece)
        if len(head) < 65536:
            head += piece[: 65536 - len(head)]
    model = form_model(head)
    if model is not None and model != model_name:
        raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    return JSONResponse(
        {
            "text": f"{size} bytes",
            "bytes": size,
            "sha256": digest.hexdigest(),
            "first_byte_at": first_at,
        }
    )


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("'model' must be a string")
    return model


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise ApiError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def _input_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value or not all(isinstance(i, dict) for i in value):
        raise ApiError("'input' must be text or a non-empty list of items")
    return value


def _message(item: dict[str, Any]) -> dict[str, str]:
    """An input item as a chat message of text (the sim worker serves text only)."""
    if item.get("type", "message") != "message" or not isinstance(item.get("role"), str):
        return {"role": "user", "content": json.dumps(item, sort_keys=True)}
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS):
                raise ApiError("input content: only text parts are supported")
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise ApiError("an input message's content must be text or a list of text parts")
    return {"role": item["role"], "content": content or ""}

"""Client request bodies → what routing needs: the prompt, the session, the stream flags.

Parsed once per request (orjson), validated just enough to route it; everything else is
the worker's business and travels in the original body bytes. The three generation APIs:

- ``/v1/chat/completions``: ``messages`` (non-empty list of objects with a ``role``);
- ``/v1/completions``: ``prompt`` as text, token ids, or a batch of either;
- ``/generate`` (SGLang): ``text`` or ``input_ids`` (single or batch).

A batch routes on its first prompt (the blocks) and books the sum of the lengths.
The session id comes from the configured header, else the body's ``session_id``, else its
``user`` (the OpenAI field for the end user, the usual handle on a conversation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.proxy.errors import BadRequest

CHAT = "chat"
COMPLETION = "completion"
GENERATE = "generate"

GENERATION_PATHS: dict[str, str] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/generate": GENERATE,
}

Prompt = str | list[int]


@dataclass(slots=True)
class ParsedRequest:
    """One generation request as the router sees it."""

    kind: str
    body: dict[str, Any]
    prompts: list[Prompt]  # completion / generate; empty for chat
    messages: list[dict[str, Any]] | None  # chat
    stream: bool
    wants_usage: bool  # the client itself asked for stream usage
    session_id: str | None
    max_tokens: int
    model: str | None = None  # the model (or LoRA adapter) it names; None: any worker's


def parse_request(kind: str, raw: bytes, session_header_value: str | None) -> ParsedRequest:
    """Validate ``raw`` for ``kind``; raise :class:`BadRequest` with a useful message."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", code="invalid_type")
    messages = None
    prompts: list[Prompt] = []
    if kind == CHAT:
        messages = _messages(body)
    elif kind == COMPLETION:
        prompts = _prompts(body.get("prompt"), "prompt")
    else:
        if body.get("input_ids") is not None:
            prompts = _prompts(body["input_ids"], "input_ids", ids_only=True)
        elif body.get("text") is not None:
            prompts = _prompts(body["text"], "text", text_only=True)
        else:
            raise BadRequest("missing 'text' or 'input_ids'", code="missing_field")
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", code="invalid_type")
    return ParsedRequest(
        kind=kind,
        body=body,
        prompts=prompts,
        messages=messages,
        stream=stream,
        wants_usage=wants_usage,
        session_id=_session(session_header_value, body),
        max_tokens=_max_tokens(body),
        model=model or None,
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("missing 'messages'", code="missing_field")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", code="invalid_type")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", code="invalid_type")
    return messages


def _prompts(
    value: Any, name: str, *, ids_only: bool = False, text_only: bool = False
) -> list[Prompt]:
    if value is None:
        raise BadRequest(f"missing '{name}'", code="missing_field")
    if isinstance(value, str) and not ids_only:
        return [value]
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, int) and not text_only:
            return [value]  # ids are checked when packed (router.proxy.tokenize), in C
        if isinstance(first, str) and not ids_only and all(isinstance(v, str) for v in value):
            return list(value)
        if isinstance(first, list) and not text_only:
            for i, ids in enumerate(value):
                if not isinstance(ids, list) or not ids:
                    raise BadRequest(f"'{name}[{i}]' must be a non-empty list of token ids")
            return list(value)
    kinds = "token ids" if ids_only else "text" if text_only else "text or token ids"
    raise BadRequest(f"'{name}' must be non-empty {kinds}", code="invalid_type")


def _session(header_value: str | None, body: dict[str, Any]) -> str | None:
    if header_value:
        return header_value
    for key in ("session_id", "user"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        params = body.get("sampling_params")
        if isinstance(params, dict):
            value = params.get("max_new_tokens")
    return value if isinstance(value, int) and value > 0 else 0

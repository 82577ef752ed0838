"""Client request bodies → what routing needs: the prompt, the session, the stream flags.

Parsed once per request (orjson), validated just enough to route it; everything else is
the worker's business and travels in the original body bytes. The generation APIs:

- ``/v1/chat/completions``: ``messages`` (non-empty list of objects with a ``role``);
- ``/v1/completions``: ``prompt`` as text, token ids, or a batch of either;
- ``/generate`` (SGLang): ``text`` or ``input_ids`` (single or batch);
- ``/v1/responses`` (OpenAI's Responses API): ``input`` (text or a list of items) and
  ``instructions``, read as the chat messages the engine makes of them (vLLM does the same),
  so the shadows see one prompt shape for both APIs; ``previous_response_id`` names the
  stored response it continues (:mod:`router.fleet.response_owners`).

The engines' other endpoints (:data:`OTHER_PATHS`: embeddings, rerank, score, pooling,
classify, tokenize, audio) and the calls on a stored response (``/v1/responses/{id}`` and
below) are routed without a prompt (:func:`parse_other`): only their ``model`` is read (from
a JSON body), and the picker places them by load.

A batch routes on its first prompt (the blocks) and books the sum of the lengths.
The session id comes from the configured header, else the body's ``session_id``, else its
``user`` (the OpenAI field for the end user, the usual handle on a conversation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from router.core.errors import BadRequest

CHAT = "chat"
COMPLETION = "completion"
GENERATE = "generate"
RESPONSES = "responses"

GENERATION_PATHS: dict[str, str] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/generate": GENERATE,
    "/v1/responses": RESPONSES,
}

# the engines' other POST endpoints (vLLM's and SGLang's names), routed by model and load
EMBEDDINGS = "embeddings"
AUDIO = "audio"
OTHER_PATHS: dict[str, str] = {
    "/v1/embeddings": EMBEDDINGS,
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/rerank": "rerank",
    "/v1/score": "score",
    "/score": "score",
    "/pooling": "pooling",
    "/classify": "classify",
    "/v1/classify": "classify",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/v1/audio/transcriptions": AUDIO,
    "/v1/audio/translations": AUDIO,
}
STREAMED_BODIES = frozenset({AUDIO})  # uploads sent on as they arrive, never held whole
# GET/DELETE /v1/responses/{id}, POST .../cancel, GET .../input_items
RESPONSE_CALL = "response_call"
_RESPONSES_PREFIX = "/v1/responses/"
_RESPONSE_CALLS = {("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("GET", "/input_items")}

Prompt = str | list[int]


@dataclass(slots=True)
class ParsedRequest:
    """One generation request as the router sees it."""

    kind: str
    body: dict[str, Any]
    prompts: list[Prompt]  # completion / generate; empty for chat and responses
    messages: list[dict[str, Any]] | None  # chat and responses
    stream: bool
    wants_usage: bool  # the client itself asked for stream usage
    session_id: str | None
    max_tokens: int
    # the model (or LoRA adapter) it names, ``""`` too (no worker serves it: a 404, as vLLM
    # answers); None: no ``model`` field, any worker's
    model: str | None = None
    # chat and responses: the chat request the prompt is read from (for responses, built
    # from ``instructions`` and ``input``); None for the others
    chat: dict[str, Any] | None = None
    stored_response_id: str | None = None  # the stored response it continues or acts on


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
    chat = None
    previous = None
    prompts: list[Prompt] = []
    if kind == CHAT:
        messages = _messages(body)
        chat = body
    elif kind == RESPONSES:
        messages = responses_messages(body)
        chat = {"messages": messages}
        if body.get("tools"):
            chat["tools"] = body["tools"]
        previous = body.get("previous_response_id")
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise BadRequest(
                "'previous_response_id' must be a non-empty string", code="invalid_type"
            )
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
        model=model,
        chat=chat,
        stored_response_id=previous,
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


def response_call_id(method: str, path: str) -> str | None:
    """The response id of a call on a stored response (retrieve, delete, cancel, input
    items); None for any other method and path."""
    if not path.startswith(_RESPONSES_PREFIX):
        return None
    response_id, _, rest = path[len(_RESPONSES_PREFIX) :].partition("/")
    if not response_id or (method, "/" + rest if rest else "") not in _RESPONSE_CALLS:
        return None
    return response_id


def routed_kind(method: str, path: str) -> str | None:
    """The core's endpoint for ``method path`` (generation, the engines' other endpoints, a
    call on a stored response); None for a path no front end routes (the admin side's)."""
    if method == "POST":
        kind = GENERATION_PATHS.get(path) or OTHER_PATHS.get(path)
        if kind is not None:
            return kind
    return RESPONSE_CALL if response_call_id(method, path) is not None else None


# a multipart form's ``model`` field: its part's headers, a blank line, the value
_FORM_MODEL = re.compile(rb'name="model"[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n([^\r\n]{1,256})\r\n')


def form_model(data: bytes) -> str | None:
    """The ``model`` field of a multipart form, if ``data`` (its first bytes) holds it."""
    found = _FORM_MODEL.search(data)
    return found.group(1).decode("utf-8", "replace") if found else None


def parse_other(
    kind: str, raw: bytes, content_type: bytes | None, session_header_value: str | None
) -> ParsedRequest:
    """A request routed without a prompt: the ``model`` of a JSON body (400 if the body is
    not JSON or names a model that is not a string); other bodies (multipart audio) as
    they are, but for a multipart form's ``model`` field found in ``raw`` (an upload's
    first bytes: clients put the form's fields before the file)."""
    body: dict[str, Any] = {}
    if content_type is not None and content_type.startswith(b"multipart/form-data"):
        model = form_model(raw)
        if model is not None:
            body = {"model": model}
        raw = b""
    if raw and (content_type is None or content_type.startswith(b"application/json")):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(
                f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from None
        if not isinstance(parsed, dict):
            raise BadRequest("request body must be a JSON object", code="invalid_json")
        body = parsed
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", code="invalid_type")
    stream = body.get("stream") is True
    return ParsedRequest(
        kind=kind,
        body=body,
        prompts=[],
        messages=None,
        stream=stream,
        wants_usage=False,
        session_id=_session(session_header_value, body),
        max_tokens=0,
        model=model,
    )


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses API request's ``instructions`` and ``input`` as chat messages: the system
    message, then each input item (a message as it is, text parts as chat text parts; a
    function call or its output as the assistant's tool call or the tool's message; any
    other item as a user message of its JSON)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", code="invalid_type")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if items is None:
        raise BadRequest("missing 'input'", code="missing_field")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be text or a non-empty list of items", code="invalid_type")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", code="invalid_type")
        messages.append(_input_item(item))
    return messages


_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _input_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str):
            raise BadRequest("an input message must have a 'role'", code="invalid_type")
        content = item.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": part["text"]}
                if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
                else part
                for part in content
            ]
        return {"role": role, "content": content}
    if kind == "function_call":
        function = {"name": item.get("name"), "arguments": item.get("arguments")}
        call = {"id": item.get("call_id"), "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else orjson.dumps(output).decode()
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": content}
    role = "assistant" if kind == "reasoning" else "user"
    return {"role": role, "content": orjson.dumps(item).decode()}


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
            return [value]  # ids are checked when packed (router.core.tokenize), in C
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

"""The simulated worker's wire format: request parsing and OpenAI / SGLang response bodies.

Pure functions, no I/O, so the HTTP layer (:mod:`traces.sim_worker.server`) stays a thin shell and
every field can be tested without a server.

Prompts become *blocks* the way the router sees them:

- Token ids (a completions prompt given as ids, SGLang's ``input_ids``):
  ``input_length = len(ids)``, blocks = :func:`router.cache.block_hash.hash_blocks` (512 ids each).
- Text: the router's default prefix-stable approximation, 4 UTF-8 bytes per "token":
  ``input_length = ceil(len(bytes) / 4)``, blocks = ``hash_bytes_blocks(bytes, 2048)``.
- Chat messages are serialized as ``"{role}\\n{content}\\n"`` per message, concatenated; no
  generation prompt is appended, so a later turn of a conversation *extends* the text of an
  earlier one and hits its blocks, as a real chat template does for all but its last tokens.

``/tokenize`` returns one id per 4-byte chunk: the chunk read as a little-endian uint32 (a
partial last chunk padded with zero bytes). The mapping is injective and prefix-stable (only
a partial last chunk can change when text is appended), and hashing these ids with
``hash_blocks`` gives exactly the text's block keys: a client that tokenizes through us and
sends ids hits the same cache as one that sends text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from router.cache.block_hash import (
    BLOCK_SIZE,
    TOKEN_BYTES,
    hash_blocks,
    hash_bytes_blocks,
    token_bytes,
)

Kind = Literal["chat", "completion", "generate"]

DEFAULT_MAX_TOKENS = 16
"""Output tokens when the request names none (OpenAI's completions default)."""

FINISH_REASON = "length"
"""Every simulated request generates exactly its max tokens."""


class ApiError(Exception):
    """A request the worker rejects, answered as ``{"error": {...}}`` with ``status``."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_

    def body(self) -> dict[str, Any]:
        """vLLM's error body (OpenAI's shape: message, type, param, code)."""
        error = {"message": self.message, "type": self.type, "param": None, "code": self.status}
        return {"error": error}


@dataclass(frozen=True)
class Prompt:
    """What the worker model needs from a prompt (``tokens``: its ids as uint32 LE bytes,
    what a KV event's ``token_ids`` carry)."""

    blocks: tuple[int, ...]
    input_length: int
    tokens: bytes = b""


@dataclass(frozen=True)
class GenRequest:
    """One parsed generation request, whatever endpoint it came through."""

    kind: Kind
    prompt: Prompt
    max_tokens: int
    stream: bool
    include_usage: bool
    model: str | None
    priority: int = 0  # vLLM's and SGLang's field: the engine's order (lower first)


# ---- prompts ---------------------------------------------------------------------------


def prompt_from_text(text: str) -> Prompt:
    """Blocks of 2048 UTF-8 bytes (512 four-byte "tokens"); see the module docstring."""
    data = text.encode()
    blocks = tuple(hash_bytes_blocks(data, BLOCK_SIZE * TOKEN_BYTES))
    padded = data + b"\0" * (-len(data) % TOKEN_BYTES)  # = text_token_ids(text) as bytes
    return Prompt(blocks, math.ceil(len(data) / 4), padded)


def prompt_from_ids(ids: list[int]) -> Prompt:
    """Blocks of 512 token ids, hashed as the router hashes client-supplied ids."""
    try:
        buf = token_bytes(ids)
    except ValueError as exc:
        raise ApiError(f"invalid token ids: {exc}") from None
    return Prompt(tuple(hash_blocks(buf)), len(ids), buf)


def text_token_ids(text: str) -> list[int]:
    """One id per 4-byte chunk of UTF-8 (little-endian uint32; see the module docstring)."""
    data = text.encode()
    data += b"\0" * (-len(data) % TOKEN_BYTES)
    return np.frombuffer(data, dtype="<u4").tolist()


def chat_text(messages: Any) -> str:
    """The stable serialization of chat messages: ``role\\ncontent\\n`` each, in order."""
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list")
    parts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a string 'role'")
        parts += (msg["role"], "\n", _content_text(msg.get("content"), i), "\n")
    return "".join(parts)


def _content_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ApiError(f"messages[{i}].content: only text parts are supported")
            if not isinstance(part.get("text"), str):
                raise ApiError(f"messages[{i}].content: a text part needs a string 'text'")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts")


def _single(value: Any, what: str) -> Any:
    """Unwrap a batch of one (``["text"]``, ``[[1, 2]]``); larger batches are not served."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        if len(value) != 1:
            raise ApiError(f"batched {what} are not supported; send one prompt per request")
        return value[0]
    return value


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def completion_prompt(value: Any, what: str = "prompt", text: bool = True) -> Prompt:
    """A completions ``prompt`` (or SGLang ``text`` / ``input_ids``): text or token ids."""
    value = _single(value, what)
    if isinstance(value, str) and text:
        prompt = prompt_from_text(value)
    elif _is_ids(value):
        prompt = prompt_from_ids(value)
    else:
        kinds = "a string or a list of token ids" if text else "a list of token ids"
        raise ApiError(f"'{what}' must be {kinds}")
    if prompt.input_length == 0:
        raise ApiError(f"'{what}' must not be empty")
    return prompt


# ---- requests --------------------------------------------------------------------------


def _get(body: dict[str, Any], key: str, type_: type, default: Any) -> Any:
    """``body[key]`` if present and not null, else ``default``; a wrong type is a 400."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, type_) or (isinstance(value, bool) and type_ is not bool):
        raise ApiError(f"'{key}' must be of type {type_.__name__}")
    return value


def _common(
    body: dict[str, Any], kind: Kind, prompt: Prompt, max_model_len: int, max_keys: tuple[str, ...]
) -> GenRequest:
    max_tokens = DEFAULT_MAX_TOKENS
    for key in max_keys:
        if body.get(key) is not None:
            max_tokens = _get(body, key, int, DEFAULT_MAX_TOKENS)
            break
    if max_tokens < 1:
        raise ApiError("max_tokens must be at least 1")
    if prompt.input_length + max_tokens > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt.input_length + max_tokens} tokens ({prompt.input_length} in the "
            f"prompt, {max_tokens} for the completion)."
        )
    if _get(body, "n", int, 1) != 1:
        raise ApiError("only n=1 is supported")
    stream = _get(body, "stream", bool, False)
    options = _get(body, "stream_options", dict, None)
    if options is not None and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    include_usage = bool(options and options.get("include_usage"))
    model = _get(body, "model", str, None)
    priority = _get(body, "priority", int, 0)
    return GenRequest(kind, prompt, max_tokens, stream, include_usage, model, priority)


def parse_completion(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """``POST /v1/completions`` (echo, logprobs, temperature ... are accepted and ignored)."""
    if body.get("prompt") is None:
        raise ApiError("'prompt' is required")
    prompt = completion_prompt(body["prompt"])
    return _common(body, "completion", prompt, max_model_len, ("max_tokens",))


def parse_chat(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """``POST /v1/chat/completions``."""
    prompt = prompt_from_text(chat_text(body.get("messages")))
    keys = ("max_completion_tokens", "max_tokens")
    return _common(body, "chat", prompt, max_model_len, keys)


def parse_generate(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """SGLang's ``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``."""
    if body.get("input_ids") is not None:
        prompt = completion_prompt(body["input_ids"], "input_ids", text=False)
    elif body.get("text") is not None:
        prompt = completion_prompt(body["text"], "text")
    else:
        raise ApiError("'text' or 'input_ids' is required")
    params = _get(body, "sampling_params", dict, {})
    flat = {
        "max_new_tokens": params.get("max_new_tokens"),
        "stream": body.get("stream"),
        "priority": body.get("priority"),
    }
    return _common(flat, "generate", prompt, max_model_len, ("max_new_tokens",))


def parse_tokenize(body: dict[str, Any]) -> list[int]:
    """vLLM's ``POST /tokenize``: ``prompt`` (text) or chat ``messages``."""
    if body.get("messages") is not None:
        return text_token_ids(chat_text(body["messages"]))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError("'prompt' (a string) or 'messages' is required")
    return text_token_ids(prompt)


# ---- responses -------------------------------------------------------------------------


def output_tokens(n: int) -> list[str]:
    """The deterministic filler a simulated request generates: `` tok0 tok1 ...``."""
    return [f" tok{i}" for i in range(n)]


@dataclass(frozen=True)
class Reply:
    """Builds every body of one response; ``cached_tokens`` is the worker model's truth."""

    kind: Kind
    id: str
    created: int
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # both tiers, as vLLM counts the connector's tokens in its own
    # of those, loaded from the CPU tier (None: the worker has no tier); an extension no
    # engine reports, so a replay can score the router's shadow of each tier
    cpu_cached_tokens: int | None = None

    def details(self) -> dict[str, int]:
        """``prompt_tokens_details`` (``input_tokens_details`` on the Responses API)."""
        if self.cpu_cached_tokens is None:
            return {"cached_tokens": self.cached_tokens}
        return {"cached_tokens": self.cached_tokens, "cpu_cached_tokens": self.cpu_cached_tokens}

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": self.details(),
        }

    def meta_info(self, completion_tokens: int, done: bool, latency: float) -> dict[str, Any]:
        """SGLang's ``meta_info`` (cached_tokens is what the router reads)."""
        return {
            "id": self.id,
            "finish_reason": {"type": FINISH_REASON, "length": completion_tokens} if done else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": round(latency, 6),
        }

    def full(self, text: str, latency: float) -> dict[str, Any]:
        """The non-streaming body."""
        if self.kind == "generate":
            meta = self.meta_info(self.completion_tokens, True, latency)
            return {"text": text, "meta_info": meta}
        if self.kind == "chat":
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text}
        choice.update(index=0, logprobs=None, finish_reason=FINISH_REASON)
        return {**self._head(""), "choices": [choice], "usage": self.usage()}

    def _head(self, suffix: str) -> dict[str, Any]:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj + suffix, "created": self.created, "model": self.model}

    def chunk(self, piece: str, finished: bool) -> dict[str, Any]:
        """One OpenAI stream chunk carrying ``piece`` (chat: a delta; completions: text)."""
        reason = FINISH_REASON if finished else None
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["delta"] = {"content": piece}
        else:
            choice["text"] = piece
        choice.update(logprobs=None, finish_reason=reason)
        return {**self._head(".chunk" if self.kind == "chat" else ""), "choices": [choice]}

    def role_chunk(self) -> dict[str, Any]:
        """vLLM opens a chat stream with the assistant role and empty content."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head(".chunk"), "choices": [choice]}

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        head = self._head(".chunk" if self.kind == "chat" else "")
        return {**head, "choices": [], "usage": self.usage()}

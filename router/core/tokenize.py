"""A parsed request → :class:`~policies.base.RequestFeatures`, computed once per request.

Token ids the client sends (``prompt`` / ``input_ids`` as ids) are used as they are, in every
mode. Otherwise the prompt text becomes tokens in one of three ways (``--tokenizer``):

``approx`` (default, needs nothing)
    The prompt's UTF-8 bytes stand for its tokens, :data:`APPROX_BYTES_PER_TOKEN` (4) bytes a
    token, about what BPE tokenizers give for English. Blocks are chained xxh3 hashes of
    ``block_size * 4`` byte slices (2,048 bytes for 512-token blocks), so equal text prefixes
    give equal blocks and a block stands for about 512 real tokens; ``input_length`` is
    ``ceil(bytes / 4)``. The radix shadow sees each 4-byte group as one pseudo-token. Chat
    messages are serialized role by role (tools first, then each message's role, content
    and tool calls, with separator bytes no text contains) without a generation prompt, so a
    later turn's serialization extends the earlier turn's: the conversation keeps its blocks.
    Estimates are in these approximate tokens; the worker's reports are rescaled to them
    with the worker's own prompt token count (:mod:`router.cache.feedback`).

``PATH`` (exact)
    A Hugging Face tokenizer (``tokenizer.json``) loaded with the ``tokenizers`` package, and
    the model's chat template rendered with jinja2 (:mod:`router.core.hf_tokenizer`), as vLLM does.

``worker`` (exact)
    Ask a healthy worker's ``/tokenize`` (vLLM's API); answers are cached by prompt in a
    bounded LRU. If the worker cannot answer, the request falls back to ``approx``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import numpy as np
import orjson
import xxhash

from policies.base import RequestFeatures
from router.cache.block_hash import (
    TOKEN_BYTES,
    TextBytes,
    hash_blocks,
    hash_bytes_blocks,
    token_bytes,
)
from router.core.errors import BadRequest
from router.core.parse import ParsedRequest

APPROX_BYTES_PER_TOKEN = TOKEN_BYTES
"""Approximate mode: bytes of UTF-8 text per token (one pseudo-token = one uint32)."""

_REC, _UNIT = b"\x1e", b"\x1f"  # ASCII record / unit separators: never in chat text
_SORTED = orjson.OPT_SORT_KEYS


class Tokenized(NamedTuple):
    """A prompt as token ids (uint32 LE bytes), its blocks, and its length in tokens."""

    tokens: bytes
    blocks: list[int]
    input_length: int
    exact: bool


def from_ids(ids: list[int], block_size: int) -> Tokenized:
    """Client token ids, packed in C; bad ids are the client's error (400)."""
    try:
        buf = token_bytes(ids)
    except ValueError as exc:
        raise BadRequest(f"invalid token ids: {exc}", code="invalid_type") from None
    return Tokenized(buf, hash_blocks(buf, block_size), len(buf) // TOKEN_BYTES, True)


def from_text_bytes(data: bytes, block_size: int) -> Tokenized:
    """The approximation: 4 bytes a token, blocks of ``block_size * 4`` bytes."""
    blocks = hash_bytes_blocks(data, block_size * APPROX_BYTES_PER_TOKEN)
    usable = len(data) - len(data) % TOKEN_BYTES
    tokens = TextBytes(data[:usable])  # marked: approximate, not token ids
    return Tokenized(tokens, blocks, math.ceil(len(data) / APPROX_BYTES_PER_TOKEN), False)


def serialize_chat(body: dict[str, Any]) -> bytes:
    """Prefix-stable bytes of a chat request: turn n+1's bytes extend turn n's."""
    parts: list[bytes] = []
    tools = body.get("tools")
    if tools:
        parts += (_REC, b"tools", _UNIT, orjson.dumps(tools, option=_SORTED))
    for message in body["messages"]:
        parts += (_REC, message["role"].encode("utf-8", "surrogatepass"), _UNIT)
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content.encode("utf-8", "surrogatepass"))
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str) and part.get("type", "text") == "text":
                    parts.append(text.encode("utf-8", "surrogatepass"))
                else:  # images, audio...: their JSON, so different media differ
                    parts.append(orjson.dumps(part, option=_SORTED))
        elif content is not None:
            parts.append(orjson.dumps(content, option=_SORTED))
        for key in ("tool_calls", "tool_call_id", "name"):
            value = message.get(key)
            if value is not None:
                parts += (_UNIT, key.encode(), _UNIT, orjson.dumps(value, option=_SORTED))
    return b"".join(parts)


def approx_length(prompt: str | list[int]) -> int:
    """Cheap length of a batch's extra prompt (ids exactly, text approximately)."""
    if isinstance(prompt, str):
        return math.ceil(len(prompt.encode("utf-8", "surrogatepass")) / APPROX_BYTES_PER_TOKEN)
    return len(prompt)


class ApproxTokenizer:
    """``--tokenizer approx``: text bytes as tokens; no files, no calls."""

    name = "approx"

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def text(self, request: ParsedRequest) -> Tokenized:
        if request.chat is not None:
            data = serialize_chat(request.chat)
        else:
            data = request.prompts[0].encode("utf-8", "surrogatepass")
        return from_text_bytes(data, self.block_size)

    def now(self, request: ParsedRequest) -> Tokenized:
        return self.text(request)

    async def tokenize(self, request: ParsedRequest) -> Tokenized:
        return self.text(request)


class LocalTokenizer:
    """``--tokenizer PATH``: the model's own tokenizer and chat template, in process."""

    name = "local"

    def __init__(self, path: str, block_size: int) -> None:
        from router.core.hf_tokenizer import HFTokenizer

        self.hf = HFTokenizer(path)
        self.block_size = block_size

    def ids(self, request: ParsedRequest) -> np.ndarray:
        if request.chat is not None:
            text = self.hf.render_chat(request.chat)
            return self.hf.encode(text, add_special_tokens=False)
        return self.hf.encode(request.prompts[0], add_special_tokens=True)

    def now(self, request: ParsedRequest) -> Tokenized:
        buf = token_bytes(self.ids(request))
        return Tokenized(buf, hash_blocks(buf, self.block_size), len(buf) // TOKEN_BYTES, True)

    async def tokenize(self, request: ParsedRequest) -> Tokenized:
        return self.now(request)


AskWorker = Callable[[str, bytes], Awaitable[bytes | None]]
"""(path, JSON body) → a healthy worker's response body, or None if none could answer."""


class WorkerTokenizer:
    """``--tokenizer worker``: the worker's ``/tokenize``, with a bounded LRU of answers."""

    name = "worker"

    def __init__(
        self,
        ask: AskWorker,
        path: str,
        block_size: int,
        cache_bytes: int = 64 << 20,
        stats: dict[str, int] | None = None,
    ) -> None:
        self.ask = ask
        self.path = path
        self.block_size = block_size
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[bytes, bytes] = OrderedDict()
        self._cached_bytes = 0
        self._approx = ApproxTokenizer(block_size)
        self.stats = stats if stats is not None else {}

    def _query(self, request: ParsedRequest) -> dict[str, Any]:
        body = request.body
        query: dict[str, Any] = {}
        if "model" in body:
            query["model"] = body["model"]
        if request.chat is not None:
            body = request.chat
            query["messages"] = body["messages"]
            query["add_generation_prompt"] = body.get("add_generation_prompt", True)
            for key in ("tools", "chat_template", "chat_template_kwargs", "continue_final_message"):
                if key in body:
                    query[key] = body[key]
        else:
            query["prompt"] = request.prompts[0]
        return query

    def now(self, request: ParsedRequest) -> None:
        """Never without a call: :meth:`tokenize` asks the worker (or its cache)."""
        return None

    async def tokenize(self, request: ParsedRequest) -> Tokenized:
        query = orjson.dumps(self._query(request), option=_SORTED)
        key = xxhash.xxh3_128_digest(query)
        buf = self._cache.get(key)
        if buf is not None:
            self._cache.move_to_end(key)
            self._count("cache_hit")
        else:
            buf = await self._fetch(query)
            if buf is None:
                self._count("fallback")
                return self._approx.text(request)
            self._count("worker")
            self._remember(key, buf)
        return Tokenized(buf, hash_blocks(buf, self.block_size), len(buf) // TOKEN_BYTES, True)

    def _count(self, result: str) -> None:
        self.stats[result] = self.stats.get(result, 0) + 1

    async def _fetch(self, query: bytes) -> bytes | None:
        answer = await self.ask(self.path, query)
        if answer is None:
            return None
        try:
            data = orjson.loads(answer)
            ids = data.get("tokens", data.get("input_ids"))
            return token_bytes(ids) if isinstance(ids, list) else None
        except (orjson.JSONDecodeError, ValueError, AttributeError):
            return None

    def _remember(self, key: bytes, buf: bytes) -> None:
        if len(buf) > self.cache_bytes:
            return
        self._cache[key] = buf
        self._cached_bytes += len(buf)
        while self._cached_bytes > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)


Tokenizer = ApproxTokenizer | LocalTokenizer | WorkerTokenizer


def make_tokenizer(
    spec: str, block_size: int, ask: AskWorker | None = None, **worker_options: Any
) -> Tokenizer:
    """The tokenizer for ``--tokenizer`` ``spec`` (approx, worker, or a path);
    ``worker_options`` (path, cache_bytes, stats) configure the ``worker`` mode only."""
    if spec == "approx":
        return ApproxTokenizer(block_size)
    if spec == "worker":
        if ask is None:
            raise ValueError("--tokenizer worker needs a way to reach the workers")
        return WorkerTokenizer(ask, block_size=block_size, **worker_options)
    return LocalTokenizer(spec, block_size)


def tokens_now(request: ParsedRequest, tokenizer: Tokenizer, block_size: int) -> Tokenized | None:
    """The prompt's tokens without waiting: ids the client sent, or a tokenizer that needs no
    call (approx, local); None: ``await tokenizer.tokenize(request)``. (The proxy's hot path
    then runs no coroutine for this.)"""
    first = request.prompts[0] if request.prompts else None
    if isinstance(first, list):
        return from_ids(first, block_size)
    return tokenizer.now(request)


def features_of(request: ParsedRequest, tok: Tokenized, block_size: int) -> RequestFeatures:
    """The request's features (blocks, length, session, tokens) from its first prompt's
    tokens; a batch's further prompts add their approximate length."""
    length = tok.input_length
    for extra in request.prompts[1:]:
        length += approx_length(extra)
    return RequestFeatures(
        blocks=tok.blocks,
        input_length=length,
        session_id=request.session_id,
        tokens=tok.tokens,
        block_size=block_size,
        model=request.model,
    )

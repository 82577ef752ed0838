"""Reading the worker's own count of cached prompt tokens from its responses.

vLLM (``--enable-prompt-tokens-details``) reports ``usage.prompt_tokens_details.cached_tokens``
(``usage.input_tokens_details.cached_tokens`` on the Responses API);
SGLang reports ``meta_info.cached_tokens`` (``/generate``) and the OpenAI ``usage`` shape on
its OpenAI API. JSON encodes quotes inside strings as ``\\"``, so an unescaped
``"cached_tokens": N`` can only be a key: a regex over the bytes finds it without parsing
the body, and a batch's counts add up.

Streams: :class:`StreamScanner` forwards whole SSE events as they arrive (a partial event is
held until its end: a client cannot use half an event), finds the counts in the event that
carries them, and drops the usage-only chunk (``"choices": []``) that the router asked the
worker for when the client did not ask for it itself.

Response ids: :class:`ResponseIdReader` finds a Responses API id in an answer read in pieces
of any size (an id may straddle two reads), keeping only the last few bytes of each piece.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import orjson

_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
# of those, the ones the worker loaded from its CPU KV tier: the sim worker's extension of
# ``prompt_tokens_details`` (vLLM and SGLang report only the sum)
_CPU_CACHED = re.compile(rb'"cpu_cached_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')  # chat, responses
# the whitespace is bounded so that a match is too: a reader keeps fewer bytes than one
_RESPONSE_ID = re.compile(rb'"id"\s{0,16}:\s{0,16}"(resp_[^"\\]{1,200})"')
_RESPONSE_ID_SPAN = 4 + 16 + 1 + 16 + 1 + 5 + 200 + 1  # the longest match
RESPONSE_ID_WITHIN = 64 << 10  # a response's id comes first: looked for in these bytes only
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
MAX_SCANNED_BODY = 4 << 20  # a non-streamed body longer than this is not scanned for usage
MAX_PENDING = 1 << 20  # an "event" this long without a blank line is not SSE: pass it on


class Usage(NamedTuple):
    """Cached prompt tokens the worker reported, and its prompt token count when given."""

    cached_tokens: int
    prompt_tokens: int | None
    cpu_cached_tokens: int | None = None  # of cached_tokens, loaded from the CPU tier


def response_id_in(data: bytes) -> str | None:
    """The first Responses API id (``resp_...``) in ``data``: a response body's own id comes
    before its output items' (``msg_...``, ``fc_...``), a stream's in its first event."""
    found = _RESPONSE_ID.search(data)
    return found.group(1).decode("ascii", "replace") if found else None


class ResponseIdReader:
    """The response id of an answer fed in pieces, as :func:`response_id_in` finds it in the
    answer's first ``RESPONSE_ID_WITHIN`` bytes whole: each piece is searched after the last
    bytes of the ones before (one match's length less one), so an id split between two reads
    is found, and nothing more is kept."""

    __slots__ = ("left", "tail")

    def __init__(self) -> None:
        self.tail = b""
        self.left = RESPONSE_ID_WITHIN  # bytes still to look in; 0: done

    @property
    def done(self) -> bool:
        """Found, or past the bytes where an id comes: feeding more finds nothing."""
        return self.left <= 0

    def feed(self, data: bytes) -> str | None:
        """The id, when ``data`` completes it (once); None before that, and after."""
        if self.left <= 0:
            return None
        data = data[: self.left]
        self.left -= len(data)
        window = self.tail + data if self.tail else data
        found = _RESPONSE_ID.search(window)
        if found is not None:
            self.left = 0
        self.tail = window[-(_RESPONSE_ID_SPAN - 1) :] if self.left > 0 else b""
        return found.group(1).decode("ascii", "replace") if found is not None else None


def scan_body(data: bytes) -> Usage | None:
    """Counts in a whole (non-streamed) response body; None when it reports nothing."""
    cached = _CACHED.findall(data)
    if not cached:
        return None
    prompt = _PROMPT.findall(data)
    cpu = _CPU_CACHED.findall(data)
    return Usage(
        sum(map(int, cached)),
        sum(map(int, prompt)) if prompt else None,
        sum(map(int, cpu)) if cpu else None,
    )


def _first_usage(data: bytes) -> Usage | None:
    """Counts of the first event that has them (SGLang repeats them in every event)."""
    cached = _CACHED.search(data)
    if cached is None:
        return None
    start = data.rfind(b"\n\n", 0, cached.start()) + 1
    end = data.find(b"\n\n", cached.end())
    stop = end if end >= 0 else len(data)
    prompt = _PROMPT.search(data, start, stop)
    cpu = _CPU_CACHED.search(data, start, stop)
    return Usage(
        int(cached.group(1)),
        int(prompt.group(1)) if prompt else None,
        int(cpu.group(1)) if cpu else None,
    )


def _event_payload(event: bytes) -> bytes:
    return b"\n".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
    )


class StreamScanner:
    """Splits an SSE body into whole events, reads usage once, drops the injected chunk."""

    __slots__ = ("drop_usage_chunk", "pending", "usage")

    def __init__(self, drop_usage_chunk: bool) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        self.pending = b""
        self.usage: Usage | None = None

    def feed(self, data: bytes) -> bytes:
        """The whole events completed by ``data``, to forward now (possibly ``b""``)."""
        if self.pending:
            data = self.pending + data
        a = data.rfind(b"\n\n")
        b = data.rfind(b"\r\n\r\n")
        cut = max(a + 2 if a >= 0 else 0, b + 4 if b >= 0 else 0)
        if cut < len(data):
            if cut == 0 and len(data) > MAX_PENDING:
                self.pending = b""
                return data
            self.pending = data[cut:]
            data = data[:cut]
        else:
            self.pending = b""
        if data and (self.drop_usage_chunk or self.usage is None):
            data = self._scan(data)
        return data

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream."""
        rest, self.pending = self.pending, b""
        if rest and (self.drop_usage_chunk or self.usage is None):
            rest = self._scan(rest)
        return rest

    def _scan(self, data: bytes) -> bytes:
        if self.drop_usage_chunk:
            if _USAGE_OBJECT.search(data) is None:
                return data
            return self._drop_usage_events(data)
        found = _first_usage(data)
        if found is not None:
            self.usage = found
        return data

    def _drop_usage_events(self, data: bytes) -> bytes:
        kept: list[bytes] = []
        for event in re.split(rb"(?<=\n\n)|(?<=\r\n\r\n)", data):
            if not event or _USAGE_OBJECT.search(event) is None:
                kept.append(event)
                continue
            try:
                obj = orjson.loads(_event_payload(event))
            except orjson.JSONDecodeError:
                kept.append(event)
                continue
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict):
                found = _first_usage(event)
                if found is not None:
                    self.usage = found
                if not obj.get("choices"):
                    continue  # the usage-only chunk the client never asked for
            kept.append(event)
        return b"".join(kept)


class UsageReader:
    """The worker's counts, read from a response body as it passes through: an event stream
    event by event (:class:`StreamScanner`: whole events out, the injected usage chunk
    dropped when asked), any other successful body kept whole up to ``MAX_SCANNED_BODY`` and
    scanned at its end. One reader for ``serve``'s forwarder and the endpoint picker."""

    __slots__ = ("kept", "scanner", "size")

    def __init__(self, sse: bool, drop_usage_chunk: bool, ok: bool) -> None:
        self.scanner = StreamScanner(drop_usage_chunk) if sse else None
        self.kept: list[bytes] | None = [] if ok and not sse else None
        self.size = 0

    def feed(self, data: bytes, last: bool) -> bytes:
        """``data`` as the client gets it (whole events of a stream); ``last``: the body ends."""
        scanner = self.scanner
        if scanner is not None:
            data = scanner.feed(data)
            return data + scanner.flush() if last else data
        kept = self.kept
        if kept is not None:
            self.size += len(data)
            if self.size <= MAX_SCANNED_BODY:
                kept.append(data)
            else:
                self.kept = None
        return data

    def usage(self) -> Usage | None:
        """What the body reported (call after its last piece); None when nothing."""
        if self.scanner is not None:
            return self.scanner.usage
        kept = self.kept
        if not kept:
            return None
        return scan_body(kept[0] if len(kept) == 1 else b"".join(kept))


def asking_usage(body: dict) -> dict:
    """``body`` asking for the usage chunk at the end of its stream (where the cached tokens
    are reported), its other stream options kept."""
    options = body.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**body, "stream_options": options}

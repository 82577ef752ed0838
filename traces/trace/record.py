"""The one request record every trace format is normalized into.

Replay, the simulator and the trace tools only ever see :class:`TraceRequest`, so a new trace
format is one parser, not a change to every consumer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

BLOCK_TOKENS = 512
"""Tokens per block key (the router's shadow block size, seed 002)."""

MAX_COUNT = 2**32
"""The largest token count (or turn, block size) a trace line may give: no model's context
comes near it, so a larger one is a corrupt line, refused before a tool spends a second on it
(a 10**15-token prompt once kept the simulator's prefill loop busy for ever)."""

MAX_TIME = 1e13
"""The largest time a trace line may give, in the unit its format records (seconds, or
milliseconds for Mooncake): Unix time in either unit is far below it, and past it a float
no longer tells milliseconds apart."""


class TraceFormatError(ValueError):
    """A trace file that does not match the format it was read as."""


def count_value(value: object, what: str) -> int:
    """``value`` as a count in [0, :data:`MAX_COUNT`] (an integral float such as ``1e3``
    too), else a :class:`TraceFormatError` naming ``what``. Every format reads its token
    counts, turns and block sizes through this, so a bad value gets the same message in all."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise TraceFormatError(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise TraceFormatError(f"{what} must be >= 0, got {value!r}")
    if value > MAX_COUNT:
        raise TraceFormatError(f"{what} must be <= {MAX_COUNT} (2**32), got {value!r}")
    return int(value)


def time_value(value: object, what: str) -> float:
    """``value`` as a time in [0, :data:`MAX_TIME`], else a :class:`TraceFormatError` naming
    ``what``. Negative times are refused: rebased to the first request they would stretch
    the trace's span (and every rate and load ceiling measured over it) by a typo."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(f"{what} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceFormatError(f"{what} must be a finite number, got {value!r}")
    if value < 0:
        raise TraceFormatError(f"{what} must be >= 0, got {value!r}")
    if value > MAX_TIME:
        raise TraceFormatError(f"{what} must be <= {MAX_TIME:g}, got {value!r}")
    return float(value)


@dataclass(slots=True)
class TraceRequest:
    """One request of a trace.

    ``blocks`` are keys of consecutive 512-token blocks of the prompt, prefix-chained: two
    requests have equal key ``i`` exactly when their prompts agree up to and including block
    ``i``. ``arrival`` is in seconds from the first request of the trace; ``request_id`` is the
    request's position in arrival order.
    """

    arrival: float
    session_id: str
    turn: int
    input_length: int
    output_length: int
    blocks: tuple[int, ...]
    prompt: str | None = None
    messages: list | None = None
    request_id: int = 0
    # the client's pause between the previous turn's answer and this request, where the
    # format records it (Weka's ``think_time``); session pacing waits it after that answer
    think_s: float | None = None
    # the model the request names (a base model or a LoRA adapter), where the trace says;
    # None: the replay's / simulation's default model
    model: str | None = None
    # flow control (issue 44): the request's priority (``x-priority``: higher first,
    # negative = sheddable) and tenant (its flow, ``x-llm-d-inference-fairness-id``); None:
    # the replay sends no such header
    priority: int = 0
    tenant: str | None = None
    # where the request was read ("file:line", or a Weka file's session and request), for
    # errors about it found after parsing (a prompt longer than the workers' context)
    source: str = ""

    @property
    def context_tokens(self) -> int:
        """What an engine checks against its context length: prompt plus ``max_tokens`` (the
        output length, at least one token)."""
        return self.input_length + max(1, self.output_length)

    def where(self) -> str:
        """Its ``source``, or its position in arrival order where none was recorded."""
        return self.source or f"request {self.request_id}"


def first_too_long(requests: Iterable[TraceRequest], context_tokens: int) -> TraceRequest | None:
    """The first request (arrival order) no worker with ``context_tokens`` of context can take:
    an engine answers it 400 (vLLM past ``max_model_len``, which it caps at the KV capacity)."""
    return next((r for r in requests if r.context_tokens > context_tokens), None)


def finalize(requests: Iterable[TraceRequest]) -> list[TraceRequest]:
    """Sort by arrival (stable), rebase arrivals to start at 0 and number the requests.

    Formats disagree on the clock origin (0, Unix time, wall-clock dates); after this every
    trace starts at 0 and ``request_id`` is the arrival rank, which breaks arrival ties.
    """
    out = sorted(requests, key=lambda r: r.arrival)
    if not out:
        return out
    t0 = out[0].arrival
    for i, r in enumerate(out):
        r.arrival -= t0
        r.request_id = i
    return out

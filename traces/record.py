"""The one request record every trace format is normalized into.

Replay, the simulator and the trace tools only ever see :class:`TraceRequest`, so a new trace
format is one parser, not a change to every consumer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BLOCK_TOKENS = 512
"""Tokens per block key (the router's shadow block size, seed 002)."""


class TraceFormatError(ValueError):
    """A trace file that does not match the format it was read as."""


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

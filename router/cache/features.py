"""A request as the cache model and the pickers see it: its block keys and, when known, its
exact tokens. Computed once per request (the proxy's tokenizer, or the simulator from a
trace) and shared by the estimate, the booking and every picker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a picker knows about one request, computed once by the caller.

    ``blocks`` are chained block hashes (or trace block keys) of ``block_size`` tokens each;
    ``tokens`` (uint32 little-endian bytes) is present when the caller has exact token ids.
    ``model`` is the model the request names (None: any worker's); ``adapter`` is set when
    that model is a LoRA adapter, whose blocks are its own (:mod:`router.cache.lora`).
    ``arrival`` is when the request reached the router on the clock its bookings use (the
    simulator's virtual seconds); None: now, ``time.monotonic()``. Pickers whose state expires
    (the peers' TTL'd indexes) read it.
    """

    blocks: Sequence[int]
    input_length: int
    session_id: str | None = None
    tokens: bytes | None = None
    block_size: int = 512
    model: str | None = None
    adapter: str | None = None
    arrival: float | None = None

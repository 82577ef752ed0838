"""The project's own JSONL trace format (docs/trace-format.md); the synthetic generator and
``trace cap`` write it.

One JSON object per line::

    {"session_id": "s1", "turn_id": 1, "timestamp": 0.25, "input_length": 1800,
     "output_length": 120, "hash_ids": [11, 12, 13]}

``session_id`` (string or integer) and ``timestamp`` (seconds, any origin) are required, as are
``input_length`` and ``output_length``. The prompt is described by ``hash_ids`` of
``block_size``-token blocks (default 512; a divisor of 512 is re-chunked into 512-token keys),
and/or by ``prompt`` (text) or ``messages`` (chat messages), kept verbatim. Without
``hash_ids`` the request has no block keys. ``turn_id`` defaults to the 1-based position in its
session by arrival. ``model`` (optional) is the model the request names: a base model or a
LoRA adapter.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from traces.trace.blocks import block_keys
from traces.trace.formats._fields import ids_field, int_field, num_field, read_jsonl
from traces.trace.record import BLOCK_TOKENS, TraceFormatError, TraceRequest, finalize


def load(path: Path) -> list[TraceRequest]:
    """Load a generic JSONL trace."""
    out: list[TraceRequest] = []
    unnumbered: set[int] = set()  # id() of requests without turn_id
    for where, rec in read_jsonl(path):
        session = rec.get("session_id")
        if isinstance(session, bool) or not isinstance(session, str | int):
            raise TraceFormatError(f"{where}: field 'session_id' must be a string or integer")
        prompt, messages = rec.get("prompt"), rec.get("messages")
        if prompt is not None and not isinstance(prompt, str):
            raise TraceFormatError(f"{where}: field 'prompt' must be a string")
        if messages is not None and not isinstance(messages, list):
            raise TraceFormatError(f"{where}: field 'messages' must be a list")
        model = rec.get("model")
        if model is not None and not (isinstance(model, str) and model):
            raise TraceFormatError(f"{where}: field 'model' must be a non-empty string")
        length = int_field(rec, "input_length", where)
        ids = ids_field(rec, "hash_ids", where, required=False)
        try:
            blocks = block_keys(ids, int_field(rec, "block_size", where, BLOCK_TOKENS), length)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{where}: {exc}") from None
        req = TraceRequest(
            arrival=num_field(rec, "timestamp", where),
            session_id=str(session),
            turn=int_field(rec, "turn_id", where) if rec.get("turn_id") is not None else 0,
            input_length=length,
            output_length=int_field(rec, "output_length", where),
            blocks=blocks,
            prompt=prompt,
            messages=messages,
            model=model,
            source=where,
        )
        if rec.get("turn_id") is None:
            unnumbered.add(id(req))
        out.append(req)
    out = finalize(out)
    if unnumbered:
        position: dict[str, int] = defaultdict(int)
        for req in out:
            position[req.session_id] += 1
            if id(req) in unnumbered:
                req.turn = position[req.session_id]
    return out

"""Mooncake JSONL (FAST'25 traces): ``{timestamp, input_length, output_length, hash_ids}``.

``timestamp`` is in milliseconds; ``hash_ids`` are globally prefix-unique ids of 512-token
blocks, ``ceil(input_length / 512)`` of them (the last may cover a partial block). They are
chained like every other format's ids (:mod:`traces.trace.blocks`), which keeps their equality
pattern and gives all formats the same kind of key.

The traces carry no session ids: sessions and turns are inferred from shared block prefixes
(:mod:`traces.trace.sessions`: a request continues the earlier request with which it shares the
longest prefix of at least two blocks, since block 0 is a system prompt shared by all).
"""

from __future__ import annotations

from pathlib import Path

from traces.trace.blocks import block_keys
from traces.trace.formats._fields import ids_field, int_field, num_field, read_jsonl
from traces.trace.record import BLOCK_TOKENS, TraceRequest, finalize
from traces.trace.sessions import MIN_SHARED_BLOCKS, infer_sessions


def load(path: Path, min_shared_blocks: int = MIN_SHARED_BLOCKS) -> list[TraceRequest]:
    """Load a Mooncake trace, sessions inferred."""
    out = []
    for where, rec in read_jsonl(path):
        length = int_field(rec, "input_length", where)
        out.append(
            TraceRequest(
                arrival=num_field(rec, "timestamp", where) / 1000.0,
                session_id="",
                turn=0,
                input_length=length,
                output_length=int_field(rec, "output_length", where),
                blocks=block_keys(ids_field(rec, "hash_ids", where), BLOCK_TOKENS, length),
                source=where,
            )
        )
    out = finalize(out)
    infer_sessions(out, min_shared_blocks)
    return out

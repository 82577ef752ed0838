"""Write requests as the generic JSONL trace (docs/trace-format.md), loadable by every tool.

Block keys are written as ``hash_ids`` of 512-token blocks. Loading chains them again, so a
round trip keeps each key's *equality pattern* (which requests share which prefixes, hence
sessions and hit ceilings) but not the key values themselves.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import IO

from traces.trace.record import TraceRequest


def request_to_json(req: TraceRequest) -> dict:
    """One generic-JSONL object; ``timestamp`` is the arrival in seconds (µs precision)."""
    rec: dict = {
        "session_id": req.session_id,
        "turn_id": req.turn,
        "timestamp": round(req.arrival, 6),
        "input_length": req.input_length,
        "output_length": req.output_length,
    }
    if req.blocks:
        rec["hash_ids"] = list(req.blocks)
    if req.prompt is not None:
        rec["prompt"] = req.prompt
    if req.messages is not None:
        rec["messages"] = req.messages
    if req.model is not None:
        rec["model"] = req.model
    return rec


def write_jsonl(requests: Iterable[TraceRequest], path: str | os.PathLike) -> int:
    """Write ``requests`` in the given order to ``path`` ("-" = stdout); returns the count."""
    if str(path) == "-":
        return _write(requests, sys.stdout)
    with open(path, "w", encoding="utf-8") as target:
        return _write(requests, target)


def _write(requests: Iterable[TraceRequest], target: IO[str]) -> int:
    count = 0
    for req in requests:
        target.write(json.dumps(request_to_json(req), separators=(",", ":")))
        target.write("\n")
        count += 1
    return count

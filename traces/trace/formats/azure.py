"""Azure LLM inference traces (Splitwise, 2023), CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Lengths only: there are no block ids, so no prefix reuse (empty ``blocks``) and no sessions;
each request is its own session (``session_id`` = its arrival rank), turn 1. Timestamps are
wall-clock datetimes with 7 fractional digits; arrivals are seconds from the first.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

from traces.trace.record import TraceFormatError, TraceRequest, count_value, finalize

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_EPOCH = dt.datetime(1970, 1, 1)


def load(path: Path) -> list[TraceRequest]:
    """Load an Azure CSV trace."""
    out: list[TraceRequest] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COLUMNS:
            raise TraceFormatError(f"{path}: expected header {','.join(COLUMNS)}, got {header}")
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            where = f"{path}:{lineno}"
            try:
                stamp = dt.datetime.fromisoformat(row[0].strip())
                tokens = [int(cell) for cell in row[1:3]]
            except (ValueError, IndexError) as exc:
                raise TraceFormatError(f"{where}: bad row {row}: {exc}") from None
            if len(tokens) < 2:
                raise TraceFormatError(f"{where}: bad row {row}: expected {len(COLUMNS)} columns")
            out.append(
                TraceRequest(
                    arrival=(stamp.replace(tzinfo=None) - _EPOCH).total_seconds(),
                    session_id="",
                    turn=1,
                    input_length=count_value(tokens[0], f"{where}: {COLUMNS[1]}"),
                    output_length=count_value(tokens[1], f"{where}: {COLUMNS[2]}"),
                    blocks=(),
                    source=where,
                )
            )
    out = finalize(out)
    for r in out:
        r.session_id = str(r.request_id)
    return out

"""Azure LLM inference traces (Splitwise, 2023), CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

Lengths only: there are no block ids, so no prefix reuse (empty ``blocks``) and no sessions;
each request is its own session (``session_id`` = its arrival rank), turn 1. Timestamps are
wall-clock datetimes with 7 fractional digits; arrivals are seconds from the first.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

from traces.record import TraceFormatError, TraceRequest, finalize

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
            try:
                stamp = dt.datetime.fromisoformat(row[0].strip())
                out.append(
                    TraceRequest(
                        arrival=(stamp.replace(tzinfo=None) - _EPOCH).total_seconds(),
                        session_id="",
                        turn=1,
                        input_length=int(row[1]),
                        output_length=int(row[2]),
                        blocks=(),
                    )
                )
            except (ValueError, IndexError) as exc:
                raise TraceFormatError(f"{path}:{lineno}: bad row {row}: {exc}") from None
    out = finalize(out)
    for r in out:
        r.session_id = str(r.request_id)
    return out

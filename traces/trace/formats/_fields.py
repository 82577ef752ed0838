"""Reading JSONL records and their fields with errors that point at the offending line.

The checks themselves (range, type, finiteness) are :mod:`traces.trace.record`'s, shared with the
formats that are not JSONL, so every format refuses a bad value with the same words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traces.trace.record import TraceFormatError, count_value, time_value

_MISSING: Any = object()


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """Yield ``("file:line", record)`` for every non-blank line of a JSONL file."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{where}: invalid JSON: {exc.msg}") from None
            if not isinstance(rec, dict):
                raise TraceFormatError(f"{where}: expected a JSON object")
            yield where, rec


def int_field(rec: dict, key: str, where: str, default: Any = _MISSING) -> int:
    """A count field, :func:`traces.trace.record.count_value` (``default`` when absent, an error if
    no default)."""
    value = rec.get(key, default)
    if value is _MISSING:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    return count_value(value, f"{where}: field {key!r}")


def num_field(rec: dict, key: str, where: str) -> float:
    """A required time field (timestamps, durations), :func:`traces.trace.record.time_value`."""
    value = rec.get(key, _MISSING)
    if value is _MISSING:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    return time_value(value, f"{where}: field {key!r}")


def ids_field(rec: dict, key: str, where: str, required: bool = True) -> list[int]:
    """A list of block ids (empty when absent and not required)."""
    value = rec.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise TraceFormatError(f"{where}: missing field {key!r}")
        return []
    # block hashes are 64-bit; type, min and max at C speed (a trace has ~100k ids a second)
    if not isinstance(value, list) or (
        value and (set(map(type, value)) != {int} or min(value) < 0 or max(value) >= 2**64)
    ):
        raise TraceFormatError(f"{where}: field {key!r} must be a list of integers in [0, 2**64)")
    return value

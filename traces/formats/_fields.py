"""Reading JSONL records and their fields with errors that point at the offending line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traces.record import TraceFormatError

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
    """A non-negative integer field (``default`` when absent, an error if no default)."""
    value = rec.get(key, default)
    if value is _MISSING:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TraceFormatError(f"{where}: field {key!r} must be an integer, got {value!r}")
    if value < 0:
        raise TraceFormatError(f"{where}: field {key!r} must be >= 0, got {value!r}")
    return int(value)


def num_field(rec: dict, key: str, where: str) -> float:
    """A required finite number (timestamps)."""
    value = rec.get(key, _MISSING)
    if value is _MISSING:
        raise TraceFormatError(f"{where}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise TraceFormatError(f"{where}: field {key!r} must be a number, got {value!r}")
    return float(value)


def ids_field(rec: dict, key: str, where: str, required: bool = True) -> list[int]:
    """A list of block ids (empty when absent and not required)."""
    value = rec.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise TraceFormatError(f"{where}: missing field {key!r}")
        return []
    if not isinstance(value, list):
        raise TraceFormatError(f"{where}: field {key!r} must be a list of integers")
    return value

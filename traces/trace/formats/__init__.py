"""Trace formats, each normalized into :class:`traces.trace.record.TraceRequest` by one module.

:func:`load_trace` picks the parser from the path: a directory or a ``.json`` file is Weka
kv-cache-tester, a ``.csv`` file Azure; JSONL is told apart by the keys of its first record
(``chat_id`` + ``parent_chat_id`` → Bailian, ``session_id`` → generic, ``hash_ids`` +
``timestamp`` → Mooncake).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from traces.trace.formats import azure, bailian, generic, mooncake, weka
from traces.trace.record import TraceFormatError, TraceRequest

FORMATS: dict[str, Callable[[Path], list[TraceRequest]]] = {
    "mooncake": mooncake.load,
    "weka": weka.load,
    "bailian": bailian.load,
    "generic": generic.load,
    "azure": azure.load,
}


def load_trace(path: str | os.PathLike, fmt: str = "auto") -> list[TraceRequest]:
    """Load any supported trace as requests in arrival order (arrival 0 = first request)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; choose from {', '.join(FORMATS)}")
    return FORMATS[fmt](path)


def detect_format(path: Path) -> str:
    """The format name of a trace file or directory, from its extension or first record."""
    if path.is_dir():
        return "weka"
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "weka"
    first = _first_line(path)
    if suffix == ".csv" or first.startswith("TIMESTAMP"):
        return "azure"
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        if first.startswith("{"):  # a pretty-printed JSON document, not JSONL
            return "weka"
        raise TraceFormatError(f"{path}: not JSON lines, CSV or a Weka JSON file") from None
    if isinstance(rec, dict):
        if "chat_id" in rec and "parent_chat_id" in rec:
            return "bailian"
        if "session_id" in rec:
            return "generic"
        if "hash_ids" in rec and "timestamp" in rec:
            return "mooncake"
        if "requests" in rec:
            return "weka"
    raise TraceFormatError(
        f"{path}: cannot tell the trace format from its first record; pass the format"
    )


def _first_line(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return line.strip()
    raise TraceFormatError(f"{path}: empty trace")

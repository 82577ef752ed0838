"""Weka kv-cache-tester JSON: one file per agentic coding conversation.

A file is ``{id, block_size (64), hash_id_scope ("local"), requests: [...]}``; a request is
``{t (s from conversation start), type ("n" | "s"), in, out, hash_ids, ...}``, or a sub-agent
marker ``{type: "subagent", agent_id, t, duration_ms, requests: [...]}`` whose nested requests
have ``t`` relative to the sub-agent's own start.

Normalization:

- Session = the file (``id``); each sub-agent is its own session ``"<id>/<agent_id>"``, as the
  kv-cache-tester replays sub-agents as separate concurrent users. Turn = 1-based position in
  that session.
- The marker's ``t`` is when the sub-agent *finished*: in every sample, ``t - duration_ms/1000``
  is the parent's previous request time plus its ``api_time``, and concurrent sub-agents share
  that start. So nested requests arrive at ``parent_t0 + t - duration_ms/1000 + sub_t``.
- ``hash_ids`` are ids of 64-token blocks, unique only within the file (scope "local"): groups
  of eight become one 512-token key, chained from a root seeded with the file name
  (:mod:`traces.trace.blocks`); a file with ``hash_id_scope: "global"`` is chained from root 0.
- All conversations start at t=0, as recorded; a directory loads as all its files at once.
- ``think_time`` (the client's pause between an answer and its next request, as recorded)
  becomes ``think_s``: session pacing (:mod:`traces.trace.pacing`) waits it after the previous
  turn's answer, as the kv-cache-tester's own replay does (it sends a user's next request only
  after the previous one completed).
"""

from __future__ import annotations

import json
from pathlib import Path

from traces.trace.blocks import PrefixKeyer, scope_root
from traces.trace.formats._fields import ids_field, int_field, num_field
from traces.trace.record import TraceFormatError, TraceRequest, finalize

DEFAULT_BLOCK_SIZE = 64


def load(path: Path) -> list[TraceRequest]:
    """Load one Weka file, or every ``*.json`` file of a directory."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise TraceFormatError(f"{path}: no *.json trace files")
    out: list[TraceRequest] = []
    for file in files:
        out.extend(_load_file(file))
    return finalize(out)


def _load_file(path: Path) -> list[TraceRequest]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}: invalid JSON: {exc}") from None
    except RecursionError:
        raise TraceFormatError(f"{path}: JSON nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise TraceFormatError(f"{path}: expected an object with a 'requests' list")
    block_size = int_field(doc, "block_size", str(path), DEFAULT_BLOCK_SIZE)
    scope = "" if doc.get("hash_id_scope") == "global" else path.name
    out: list[TraceRequest] = []
    walker = _Walker(path, block_size, scope_root(scope), out)
    try:
        walker.walk(doc["requests"], str(doc.get("id") or path.stem), 0.0)
    except RecursionError:
        raise TraceFormatError(f"{path}: sub-agents nested too deeply") from None
    return out


class _Walker:
    """Flattens nested sub-agent requests into sessions with absolute arrival times."""

    def __init__(self, path: Path, block_size: int, root: int, out: list[TraceRequest]):
        self.path, self.block_size, self.root, self.out = path, block_size, root, out

    def walk(self, requests: list, session: str, t0: float) -> None:
        turn = 0
        keyer = PrefixKeyer(self.block_size, self.root)
        for i, req in enumerate(requests):
            where = f"{self.path}: {session} request {i}"
            if not isinstance(req, dict):
                raise TraceFormatError(f"{where}: expected an object")
            if req.get("type") == "subagent":
                start = t0 + num_field(req, "t", where) - _seconds(req, "duration_ms", where)
                agent = str(req.get("agent_id") or f"subagent{i}")
                self.walk(req.get("requests") or [], f"{session}/{agent}", start)
                continue
            turn += 1
            length = int_field(req, "in", where)
            ids = ids_field(req, "hash_ids", where, required=False)
            try:
                blocks = keyer(ids, length)
            except TraceFormatError as exc:  # a block_size that does not divide 512
                raise TraceFormatError(f"{where}: {exc}") from None
            self.out.append(
                TraceRequest(
                    arrival=t0 + num_field(req, "t", where),
                    session_id=session,
                    turn=turn,
                    input_length=length,
                    output_length=int_field(req, "out", where),
                    blocks=blocks,
                    think_s=_think(req, where),
                    source=where,
                )
            )


def _think(req: dict, where: str) -> float | None:
    """The client's pause before this request after the previous answer (``think_time``, s)."""
    return num_field(req, "think_time", where) if req.get("think_time") is not None else None


def _seconds(req: dict, key: str, where: str) -> float:
    """A sub-agent's optional duration in ms, as seconds (0 when absent)."""
    return num_field(req, key, where) / 1000.0 if req.get(key) is not None else 0.0

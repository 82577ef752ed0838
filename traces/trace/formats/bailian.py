"""Alibaba Bailian (Qwen) usage traces, JSONL.

A record is ``{chat_id, parent_chat_id (-1 for a root), timestamp (s), input_length,
output_length, type, turn, hash_ids}`` with ``hash_ids`` of 16-token blocks (salted SipHash
remapped to global sequential ids), as documented in alibaba-edu/qwen-bailian-usagetraces-anon.
No real sample is stored here (the files are Git LFS), so this follows that documentation.

Normalization:

- Session = the root of the ``parent_chat_id`` chain (a parent absent from the file makes its
  child a root, as happens at a trace's edges); ``session_id`` is the root's ``chat_id``.
- Turn = the record's ``turn``, or the depth in the chain when absent.
- Every 32 consecutive ids make one 512-token key (global scope, root 0); only groups that are
  whole 512-token blocks of the prompt count, so the last, padded 16-token block the dataset
  notes may change between turns never becomes a key unless the prompt ends on it.
"""

from __future__ import annotations

from pathlib import Path

from traces.trace.blocks import block_keys
from traces.trace.formats._fields import ids_field, int_field, num_field, read_jsonl
from traces.trace.record import TraceFormatError, TraceRequest, finalize

ID_TOKENS = 16


def load(path: Path) -> list[TraceRequest]:
    """Load a Bailian trace; sessions from the parent chain."""
    parent_of: dict[int, int] = {}
    rows: list[tuple[int, int | None, TraceRequest]] = []
    for where, rec in read_jsonl(path):
        chat = _chat_id(rec, "chat_id", where)
        if chat < 0:  # -1 is a root's parent
            raise TraceFormatError(f"{where}: field 'chat_id' must be >= 0, got {chat}")
        if chat in parent_of:
            raise TraceFormatError(f"{where}: duplicate chat_id {chat}")
        parent_of[chat] = _chat_id(rec, "parent_chat_id", where)
        length = int_field(rec, "input_length", where)
        turn = int_field(rec, "turn", where) if rec.get("turn") is not None else None
        req = TraceRequest(
            arrival=num_field(rec, "timestamp", where),
            session_id="",
            turn=0,
            input_length=length,
            output_length=int_field(rec, "output_length", where),
            blocks=block_keys(ids_field(rec, "hash_ids", where), ID_TOKENS, length),
            source=where,
        )
        rows.append((chat, turn, req))
    chains = _Chains(parent_of)
    for chat, turn, req in rows:
        try:
            root, depth = chains.root_and_depth(chat)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{req.source}: {exc}") from None
        req.session_id = str(root)
        req.turn = turn if turn is not None else depth
    return finalize(req for _, _, req in rows)


def _chat_id(rec: dict, key: str, where: str) -> int:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"{where}: field {key!r} must be an integer, got {value!r}")
    return value


class _Chains:
    """Root and 1-based depth of every chat in the parent forest, memoized, cycle-safe."""

    def __init__(self, parent_of: dict[int, int]):
        self.parent_of = parent_of
        self.memo: dict[int, tuple[int, int]] = {}

    def root_and_depth(self, chat: int) -> tuple[int, int]:
        path: list[int] = []
        on_path: set[int] = set()
        node = chat
        while node not in self.memo:
            parent = self.parent_of[node]
            if parent not in self.parent_of:  # -1 or a parent outside the file: a root
                self.memo[node] = (node, 1)
                break
            if node in on_path:
                raise TraceFormatError(f"parent_chat_id cycle through chat {node}")
            path.append(node)
            on_path.add(node)
            node = parent
        root, depth = self.memo[node]
        for child in reversed(path):
            depth += 1
            self.memo[child] = (root, depth)
        return self.memo[chat]

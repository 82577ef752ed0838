from pathlib import Path

import pytest

from traces.trace.formats import bailian, load_trace
from traces.trace.record import TraceFormatError


def test_sessions_from_parent_chain_and_turns(data: Path) -> None:
    requests = load_trace(data / "bailian_sample.jsonl")
    got = [(r.session_id, r.turn, r.arrival, len(r.blocks)) for r in requests]
    assert got == [
        ("1", 1, 0.0, 2),  # chat 1, root
        ("3", 1, 0.5, 1),  # chat 3, another root
        ("1", 2, 3.75, 3),  # chat 2 -> 1
        ("5", 3, 5.5, 0),  # parent 99 not in the file: a root; turn from the record
        ("1", 3, 8.5, 4),  # chat 4 -> 2 -> 1
        ("1", 4, 11.5, 4),  # chat 6 -> 4, no "turn": depth 4
    ]


def test_32_ids_per_key_global_scope(data: Path) -> None:
    c1, c3, c2, _, c4, c6 = load_trace(data / "bailian_sample.jsonl")
    assert c3.blocks[0] == c1.blocks[0]  # same first 32 ids, different chats: same key
    assert c2.blocks[:2] == c1.blocks
    assert c6.blocks == c4.blocks  # extra ids do not make a full 512-token block


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


ROW = '"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []'


def test_duplicate_chat_id(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f'{{"chat_id": 1, "parent_chat_id": -1, {ROW}}}',
        f'{{"chat_id": 1, "parent_chat_id": -1, {ROW}}}',
    )
    with pytest.raises(TraceFormatError, match=r"b\.jsonl:2: duplicate chat_id 1"):
        bailian.load(path)


def test_parent_cycle(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f'{{"chat_id": 1, "parent_chat_id": 2, {ROW}}}',
        f'{{"chat_id": 2, "parent_chat_id": 1, {ROW}}}',
    )
    with pytest.raises(TraceFormatError, match="cycle"):
        bailian.load(path)

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from traces.trace.formats import load_trace, mooncake
from traces.trace.record import TraceFormatError, TraceRequest


def raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_keys_mirror_ids(requests: list[TraceRequest], rows: list[dict]) -> None:
    """Mooncake ids are prefix-unique, so chained keys must map one-to-one onto them."""
    key_to_id: dict[int, int] = {}
    id_to_key: dict[int, int] = {}
    for req, row in zip(requests, rows, strict=True):
        assert len(req.blocks) == len(row["hash_ids"])
        for key, hid in zip(req.blocks, row["hash_ids"], strict=True):
            assert key_to_id.setdefault(key, hid) == hid
            assert id_to_key.setdefault(hid, key) == key


def test_conversation_trace(conversation: list[TraceRequest], shared: Callable) -> None:
    rows = raw(shared("conversation_trace.jsonl"))
    assert len(conversation) == len(rows) == 12_031
    for req, row in zip(conversation, rows, strict=True):  # the file is in time order
        assert req.arrival == row["timestamp"] / 1000
        assert (req.input_length, req.output_length) == (row["input_length"], row["output_length"])
        assert len(req.blocks) == math.ceil(req.input_length / 512)
    assert conversation[-1].arrival == pytest.approx(3536.999)
    assert [r.request_id for r in conversation] == list(range(len(rows)))
    assert_keys_mirror_ids(conversation, rows)


def test_conversation_trace_inferred_sessions(conversation: list[TraceRequest]) -> None:
    assert len({r.session_id for r in conversation}) == 7_373
    seen: dict[str, set[int]] = {}
    for req in conversation:
        keys = seen.setdefault(req.session_id, set())
        if req.turn == 1:
            assert not keys
        else:  # a later turn shares at least two leading blocks with its session's past
            assert req.blocks[0] in keys and req.blocks[1] in keys
        keys.update(req.blocks)


def test_synthetic_trace(shared: Callable) -> None:
    path = shared("synthetic_trace.jsonl")
    rows = raw(path)
    requests = load_trace(path)
    assert len(requests) == len(rows) == 3_993
    assert_keys_mirror_ids(requests, rows)
    assert len({r.session_id for r in requests}) == 2_245


def test_head_sample_without_shared(data: Path) -> None:
    path = data / "mooncake_conversation_head200.jsonl"
    requests = load_trace(path)
    rows = raw(path)
    assert len(requests) == 200
    assert [r.input_length for r in requests] == [row["input_length"] for row in rows]
    assert_keys_mirror_ids(requests, rows)
    assert all(r.blocks[0] == requests[0].blocks[0] for r in requests)  # shared system block


def test_min_shared_blocks_one_merges_everything(data: Path) -> None:
    requests = mooncake.load(data / "mooncake_conversation_head200.jsonl", min_shared_blocks=1)
    assert {r.session_id for r in requests} == {"0"}


def test_missing_field_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 5, "output_length": 1, "hash_ids": [0]}\n'
    )
    with pytest.raises(TraceFormatError, match=r"bad.jsonl:2: missing field 'input_length'"):
        mooncake.load(path)

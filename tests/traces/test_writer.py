import json
from collections.abc import Callable
from pathlib import Path

import pytest

from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest
from traces.trace.stats import hit_ceiling
from traces.trace.writer import request_to_json, write_jsonl


def assert_same_trace(a: list[TraceRequest], b: list[TraceRequest]) -> None:
    """Same requests, sessions and turns; block keys equal exactly where the originals were."""
    assert len(a) == len(b)
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for x, y in zip(a, b, strict=True):
        assert (x.session_id, x.turn, x.input_length, x.output_length) == (
            y.session_id,
            y.turn,
            y.input_length,
            y.output_length,
        )
        assert x.arrival == pytest.approx(y.arrival, abs=1e-6)
        assert (x.prompt, x.messages) == (y.prompt, y.messages)
        assert len(x.blocks) == len(y.blocks)
        for kx, ky in zip(x.blocks, y.blocks, strict=True):
            assert forward.setdefault(kx, ky) == ky
            assert backward.setdefault(ky, kx) == kx
    assert hit_ceiling(a) == hit_ceiling(b)


def test_round_trip_mooncake_sample(tmp_path: Path, data: Path) -> None:
    original = load_trace(data / "mooncake_conversation_head200.jsonl")
    out = tmp_path / "t.jsonl"
    assert write_jsonl(original, out) == 200
    assert_same_trace(original, load_trace(out))


def test_round_trip_real_traces(tmp_path: Path, shared: Callable, conversation) -> None:
    out = tmp_path / "t.jsonl"
    write_jsonl(conversation, out)
    assert_same_trace(conversation, load_trace(out))
    weka = load_trace(shared("weka_kv_cache_tester/trace_0010.json"))
    write_jsonl(weka, out)
    assert_same_trace(weka, load_trace(out))


def test_round_trip_prompts_and_messages(tmp_path: Path, data: Path) -> None:
    original = load_trace(data / "generic_sample.jsonl")
    out = tmp_path / "t.jsonl"
    write_jsonl(original, out)
    assert_same_trace(original, load_trace(out))


def test_record_fields_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    r = TraceRequest(1.2345678, "s", 2, 1000, 5, (11, 12), messages=[{"role": "user"}])
    assert request_to_json(r) == {
        "session_id": "s",
        "turn_id": 2,
        "timestamp": 1.234568,
        "input_length": 1000,
        "output_length": 5,
        "hash_ids": [11, 12],
        "messages": [{"role": "user"}],
    }
    write_jsonl([r, TraceRequest(2.0, "t", 1, 3, 1, ())], "-")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "hash_ids" not in json.loads(lines[1])

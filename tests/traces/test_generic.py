from pathlib import Path

import pytest

from traces.trace.blocks import block_keys
from traces.trace.formats import generic, load_trace
from traces.trace.record import TraceFormatError


def test_sample(data: Path) -> None:
    requests = load_trace(data / "generic_sample.jsonl")
    got = [(r.session_id, r.turn, r.arrival, r.input_length, len(r.blocks)) for r in requests]
    assert got == [
        ("a", 1, 0.0, 1500, 3),
        ("42", 1, 1.5, 20, 0),
        ("a", 2, 12.5, 1800, 4),
        ("c", 1, 13.0, 1100, 2),  # 17 ids of 64 tokens: two whole 512-token blocks
        ("42", 2, 20.0, 60, 0),
    ]
    a1, m1, a2, c, m2 = requests
    assert a1.blocks == block_keys([7, 8, 9], 512, 1500) == a2.blocks[:3]
    assert c.blocks == block_keys(list(range(1, 18)), 64, 1100)
    assert c.prompt == "text of the prompt" and c.messages is None
    assert m1.messages == [{"role": "user", "content": "hi"}] and m1.prompt is None
    assert len(m2.messages) == 3


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "'session_id'"),
        ('{"session_id": "s", "input_length": 1, "output_length": 1}', "missing field 'timestamp'"),
        ('{"session_id": "s", "timestamp": 0, "input_length": -1, "output_length": 1}', ">= 0"),
        ('{"session_id": "s", "timestamp": 0, "input_length": 1.5, "output_length": 1}', "integer"),
        (
            '{"session_id": "s", "timestamp": 0, "input_length": 1, "output_length": 1, '
            '"hash_ids": [1], "block_size": 100}',
            "must divide 512",
        ),
        (
            '{"session_id": "s", "timestamp": 0, "input_length": 1, "output_length": 1, '
            '"hash_ids": "1,2"}',
            "list of integers",
        ),
        (
            '{"session_id": "s", "timestamp": 0, "input_length": 1, "output_length": 1, '
            '"prompt": 3}',
            "'prompt' must be a string",
        ),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_records_name_file_and_line(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "t.jsonl"
    ok = '{"session_id": "s", "timestamp": 0, "input_length": 1, "output_length": 1}'
    path.write_text(ok + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match="t.jsonl:2: .*" + error.replace("'", ".")):
        generic.load(path)


def test_model_is_read_and_written(tmp_path: Path) -> None:
    from traces.trace.writer import write_jsonl

    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"session_id": "a", "timestamp": 0, "input_length": 600, "output_length": 1, '
        '"hash_ids": [1, 2], "model": "lora-1"}\n'
        '{"session_id": "b", "timestamp": 1, "input_length": 600, "output_length": 1}\n'
    )
    trace = generic.load(path)
    assert [r.model for r in trace] == ["lora-1", None]
    write_jsonl(trace, tmp_path / "u.jsonl")
    assert [r.model for r in generic.load(tmp_path / "u.jsonl")] == ["lora-1", None]
    path.write_text('{"session_id": "a", "timestamp": 0, "input_length": 1, '
                    '"output_length": 1, "model": 3}\n')  # fmt: skip
    with pytest.raises(TraceFormatError, match="model"):
        generic.load(path)

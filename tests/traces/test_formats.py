from pathlib import Path

import pytest

from traces.formats import FORMATS, detect_format, load_trace
from traces.record import TraceFormatError


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("mooncake_conversation_head200.jsonl", "mooncake"),
        ("weka", "weka"),
        ("weka/conv_a.json", "weka"),
        ("bailian_sample.jsonl", "bailian"),
        ("generic_sample.jsonl", "generic"),
        ("azure_conv_head100.csv", "azure"),
    ],
)
def test_detect_samples(data: Path, name: str, fmt: str) -> None:
    assert detect_format(data / name) == fmt
    assert load_trace(data / name, fmt) == load_trace(data / name)


def test_detect_by_content_without_extension(tmp_path: Path, data: Path) -> None:
    for name, fmt in [
        ("azure_conv_head100.csv", "azure"),
        ("weka/conv_a.json", "weka"),  # pretty-printed JSON
        ("bailian_sample.jsonl", "bailian"),
    ]:
        copy = tmp_path / f"trace_{fmt}.txt"
        copy.write_bytes((data / name).read_bytes())
        assert detect_format(copy) == fmt


def test_forced_format_and_errors(tmp_path: Path, data: Path) -> None:
    # the generic sample read as Mooncake fails on its first record (no hash_ids)
    with pytest.raises(TraceFormatError, match="missing field"):
        load_trace(data / "generic_sample.jsonl", "mooncake")
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(data / "generic_sample.jsonl", "nope")
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "absent.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceFormatError, match="empty"):
        load_trace(empty)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"foo": 1}\n')
    with pytest.raises(TraceFormatError, match="cannot tell"):
        load_trace(odd)
    assert set(FORMATS) == {"mooncake", "weka", "bailian", "generic", "azure"}

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from traces.trace.formats import azure, load_trace
from traces.trace.record import TraceFormatError


@pytest.mark.parametrize(
    ("name", "count", "span"),
    [
        ("AzureLLMInferenceTrace_conv.csv", 19_366, 3501.72),
        ("AzureLLMInferenceTrace_code.csv", 8_819, 3435.95),
    ],
)
def test_real_traces(shared: Callable, name: str, count: int, span: float) -> None:
    path = shared(name)
    rows = list(csv.DictReader(path.open()))
    requests = load_trace(path)
    assert len(requests) == len(rows) == count
    assert requests[0].arrival == 0.0
    assert requests[-1].arrival == pytest.approx(span, abs=0.01)
    assert all(r.blocks == () and r.turn == 1 for r in requests)
    assert len({r.session_id for r in requests}) == count
    # rows are in time order, so lengths line up one to one
    assert [r.input_length for r in requests] == [int(x["ContextTokens"]) for x in rows]
    assert [r.output_length for r in requests] == [int(x["GeneratedTokens"]) for x in rows]


def test_sample_sub_second_timestamps(data: Path) -> None:
    requests = load_trace(data / "azure_conv_head100.csv")
    assert len(requests) == 100
    # 18:15:46.6805900 -> 18:15:50.9951690 (7 fractional digits, 100 ns truncated)
    assert requests[1].arrival == pytest.approx(4.314579, abs=1e-6)


def test_bad_header_and_row(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("time,in,out\n")
    with pytest.raises(TraceFormatError, match="expected header"):
        azure.load(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,ten,4\n")
    with pytest.raises(TraceFormatError, match=r"a\.csv:2"):
        azure.load(path)

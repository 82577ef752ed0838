from pathlib import Path

import pytest

from traces.trace.formats import FORMATS, detect_format, load_trace
from traces.trace.record import TraceFormatError


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


# ---- every field of every format against bad values (issue 50) --------------------------
# Each case writes a trace of one good line and one line with ``field`` set to a value, and
# loads it: a value its kind accepts loads (a documented accept), any other is refused with
# a one-line TraceFormatError naming the file and the bad line, never another exception.

VALUES = {  # label -> the value's JSON text
    "negative": "-1",
    "zero": "0",
    "fraction": "2.5",
    "nan": "NaN",
    "inf": "Infinity",
    "-inf": "-Infinity",
    "1e14": "100000000000000",  # past 2**32 tokens and 1e13 s: no model, no clock
    "1e30": "1e30",
    "huge int": "1" + "0" * 400,
    "string": '"7"',
    "bool": "true",
    "null": "null",
    "list": "[1]",
    "object": "{}",
}
ACCEPTS = {  # a field's kind -> the labels it accepts; every other label is refused
    "count": {"zero"},  # tokens, turns: integers in [0, 2**32]
    "optional count": {"zero", "null"},  # null: absent (a default)
    "time": {"zero", "fraction"},  # finite, in [0, 1e13]: a negative one shifted the span
    "optional time": {"zero", "fraction", "null"},
    "id": {"zero", "1e14", "huge int"},  # Bailian's chat_id: an integer >= 0
    "parent id": {"negative", "zero", "1e14", "huge int"},  # parent_chat_id: -1 for a root
    "session": {"negative", "zero", "1e14", "huge int", "string"},  # a string or integer
    "block id": {"zero", "1e14"},  # one element of hash_ids: an integer in [0, 2**64)
    "block size": set(),  # a divisor of 512 (none of the labels)
}
JSONL = {  # format -> (a good line with one placeholder per field, {field: kind})
    "mooncake": (
        '{"timestamp": @timestamp, "input_length": @input_length, '
        '"output_length": @output_length, "hash_ids": [@hash_ids]}',
        {
            "timestamp": "time",
            "input_length": "count",
            "output_length": "count",
            "hash_ids": "block id",
        },
    ),
    "generic": (
        '{"session_id": @session_id, "turn_id": @turn_id, "timestamp": @timestamp, '
        '"input_length": @input_length, "output_length": @output_length, '
        '"hash_ids": [@hash_ids], "block_size": @block_size}',
        {
            "session_id": "session",
            "turn_id": "optional count",
            "timestamp": "time",
            "input_length": "count",
            "output_length": "count",
            "hash_ids": "block id",
            "block_size": "block size",
        },
    ),
    "bailian": (
        '{"chat_id": @chat_id, "parent_chat_id": @parent_chat_id, "timestamp": @timestamp, '
        '"input_length": @input_length, "output_length": @output_length, "turn": @turn, '
        '"hash_ids": [@hash_ids]}',
        {
            "chat_id": "id",
            "parent_chat_id": "parent id",
            "timestamp": "time",
            "input_length": "count",
            "output_length": "count",
            "turn": "optional count",
            "hash_ids": "block id",
        },
    ),
}
GOOD = {  # the good line's values, and the bad line's other fields
    "timestamp": "1",
    "input_length": "600",
    "output_length": "5",
    "hash_ids": "3",
    "session_id": '"s"',
    "turn_id": "1",
    "block_size": "512",
    "chat_id": "9",
    "parent_chat_id": "-1",
    "turn": "1",
}  # fmt: skip


def _fill(template: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):  # parent_chat_id before chat_id
        template = template.replace(f"@{name}", values[name])
    return template


def _verdict(path: Path, fmt: str, where: str, accepted: bool) -> str | None:
    """None when loading ``path`` did what was expected, else what it did."""
    try:
        load_trace(path, fmt)
    except TraceFormatError as exc:
        text = str(exc)
        if accepted:
            return f"refused: {text}"
        if "\n" in text or where not in text:
            return f"error not one line naming {where!r}: {text!r}"
        return None
    except Exception as exc:  # any other exception is the defect
        return f"{type(exc).__name__}: {exc}"
    return None if accepted else "accepted"


def _walk_jsonl(tmp_path: Path, fmt: str) -> tuple[int, list[str]]:
    template, fields = JSONL[fmt]
    good = _fill(template, GOOD | {"chat_id": "1"})
    tried, wrong = 0, []
    for field, kind in fields.items():
        for label, text in VALUES.items():
            path = tmp_path / f"{fmt}-{field}-{label.replace(' ', '_')}.jsonl"
            path.write_text(good + "\n" + _fill(template, GOOD | {field: text}) + "\n")
            tried += 1
            verdict = _verdict(path, fmt, f"{path}:2", label in ACCEPTS[kind])
            if verdict is not None:
                wrong.append(f"{fmt} {field}={label}: {verdict}")
    return tried, wrong


@pytest.mark.parametrize("fmt", sorted(JSONL))
def test_every_jsonl_field_refuses_bad_values_naming_the_line(tmp_path: Path, fmt: str) -> None:
    tried, wrong = _walk_jsonl(tmp_path, fmt)
    assert tried == len(JSONL[fmt][1]) * len(VALUES)
    assert wrong == []


WEKA_FIELDS = {  # a request's field -> kind; "sub:" a sub-agent marker's
    "t": "time", "in": "count", "out": "count", "hash_ids": "block id",
    "think_time": "optional time", "sub:t": "time", "sub:duration_ms": "optional time",
}  # fmt: skip


def _weka(field: str, text: str) -> str:
    good = {"t": "0", "in": "600", "out": "5", "hash_ids": "3", "think_time": "0"}
    bad = good | ({field: text} if not field.startswith("sub:") else {})
    sub = {"t": "40", "duration_ms": "1000"}
    if field.startswith("sub:"):
        sub[field[4:]] = text

    def request(v: dict[str, str]) -> str:
        return (
            f'{{"t": {v["t"]}, "type": "n", "in": {v["in"]}, "out": {v["out"]}, '
            f'"hash_ids": [{v["hash_ids"]}], "think_time": {v["think_time"]}}}'
        )

    marker = (
        f'{{"type": "subagent", "agent_id": "a1", "t": {sub["t"]}, '
        f'"duration_ms": {sub["duration_ms"]}, "requests": [{request(good)}]}}'
    )
    return (
        f'{{"id": "c", "block_size": 64, "requests": [{request(good)}, {request(bad)}, {marker}]}}'
    )


def test_every_weka_field_refuses_bad_values_naming_the_request(tmp_path: Path) -> None:
    tried, wrong = 0, []
    for field, kind in WEKA_FIELDS.items():
        where = "c request 2" if field.startswith("sub:") else "c request 1"
        for label, text in VALUES.items():
            path = tmp_path / f"weka-{field.replace(':', '_')}-{label.replace(' ', '_')}.json"
            path.write_text(_weka(field, text))
            tried += 1
            verdict = _verdict(path, "weka", f"{path}: {where}", label in ACCEPTS[kind])
            if verdict is not None:
                wrong.append(f"weka {field}={label}: {verdict}")
    for label, text in VALUES.items():  # the file's block size
        path = tmp_path / f"weka-block_size-{label.replace(' ', '_')}.json"
        path.write_text(_weka("t", "1").replace('"block_size": 64', f'"block_size": {text}'))
        tried += 1
        verdict = _verdict(path, "weka", str(path), False)  # no label divides 512
        if verdict is not None:
            wrong.append(f"weka block_size={label}: {verdict}")
    assert tried == (len(WEKA_FIELDS) + 1) * len(VALUES)
    assert wrong == []


AZURE_CELLS = {  # label -> the CSV cell's text
    "negative": "-1", "zero": "0", "fraction": "2.5", "nan": "NaN", "inf": "inf",
    "1e14": "100000000000000", "1e30": "1e30", "huge int": "1" + "0" * 400,
    "string": "seven", "empty": "", "bool": "true",
}  # fmt: skip


def test_every_azure_column_refuses_bad_values_naming_the_row(tmp_path: Path) -> None:
    good = ["2023-11-16 18:15:46.6805900", "600", "5"]
    tried, wrong = 0, []
    for column in range(3):
        for label, text in AZURE_CELLS.items():
            row = list(good)
            row[column] = text
            path = tmp_path / f"azure-{column}-{label.replace(' ', '_')}.csv"
            path.write_text(
                "TIMESTAMP,ContextTokens,GeneratedTokens\n" + ",".join(good) + "\n"
                + ",".join(row) + "\n"
            )  # fmt: skip
            tried += 1
            accepted = column > 0 and label == "zero"  # a time stamp must be a date
            verdict = _verdict(path, "azure", f"{path}:3", accepted)
            if verdict is not None:
                wrong.append(f"azure column {column}={label}: {verdict}")
    assert tried == 3 * len(AZURE_CELLS)
    assert wrong == []


def test_a_bailian_cycle_names_a_line(tmp_path: Path) -> None:
    path = tmp_path / "cycle.jsonl"
    line = (
        '{{"chat_id": {}, "parent_chat_id": {}, "timestamp": 0, "input_length": 1, '
        '"output_length": 1, "hash_ids": []}}'
    )
    path.write_text(line.format(1, 2) + "\n" + line.format(2, 1) + "\n")
    with pytest.raises(TraceFormatError, match=f"{path}:1: parent_chat_id cycle"):
        load_trace(path, "bailian")

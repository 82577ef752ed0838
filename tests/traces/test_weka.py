import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from traces.trace.blocks import block_keys, scope_root
from traces.trace.formats import load_trace, weka
from traces.trace.record import TraceFormatError, TraceRequest


def by_session(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    out: dict[str, list[TraceRequest]] = {}
    for r in requests:
        out.setdefault(r.session_id, []).append(r)
    return out


def test_real_directory(shared: Callable) -> None:
    directory = shared("weka_kv_cache_tester")
    requests = load_trace(directory)
    sessions = by_session(requests)
    assert len(requests) == 3_256
    assert len(sessions) == 53  # 42 conversations + 11 sub-agents
    assert sum("/" in s for s in sessions) == 11
    assert [r.request_id for r in requests] == list(range(len(requests)))
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(requests))
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
    # keys are file-local: no key is shared between two conversations
    owner: dict[int, str] = {}
    for r in requests:
        conv = r.session_id.split("/")[0]
        for key in r.blocks:
            assert owner.setdefault(key, conv) == conv


def test_real_file_keys_and_subagent_times(shared: Callable) -> None:
    path = shared("weka_kv_cache_tester/trace_0003.json")
    doc = json.loads(path.read_text())
    requests = load_trace(path)
    sessions = by_session(requests)
    assert set(sessions) == {"trace_0003", "trace_0003/agent_001", "trace_0003/agent_002"}
    main = [r for r in doc["requests"] if r["type"] != "subagent"]
    root = scope_root("trace_0003.json")
    for got, want in zip(sessions["trace_0003"], main, strict=True):
        assert got.arrival == want["t"]
        assert got.think_s == want["think_time"]  # session pacing's pause after the answer
        assert got.blocks == block_keys(want["hash_ids"], 64, want["in"], root)
        assert len(got.blocks) == min(len(want["hash_ids"]) // 8, want["in"] // 512)
    marker = doc["requests"][1]
    start = marker["t"] - marker["duration_ms"] / 1000  # the marker's t is the sub-agent's end
    agent = sessions["trace_0003/agent_001"]
    assert [r.arrival for r in agent] == pytest.approx([start + s["t"] for s in marker["requests"]])
    assert agent[0].arrival == pytest.approx(8.212)  # = 0.0 + api_time 7.27 + ~1 s
    assert agent[-1].arrival < main[2]["t"]  # done before the parent resumes


def test_small_sample_directory(data: Path) -> None:
    requests = load_trace(data / "weka")
    got = [(r.session_id, r.turn, r.arrival, len(r.blocks)) for r in requests]
    assert got == [
        ("conv_a", 1, 0.0, 2),
        ("conv_b", 1, 0.0, 2),
        ("conv_a/agent_001", 1, 3.0, 1),
        ("conv_a/agent_001", 2, 8.0, 2),
        ("conv_b", 2, 9.5, 0),
        ("conv_a", 2, 40.0, 3),
    ]
    a1, b1, s1, s2, _, a2 = requests
    assert a2.blocks[:2] == a1.blocks and s2.blocks[0] == s1.blocks[0]
    assert not set(a1.blocks) & set(b1.blocks)  # same ids 1..16, different files


def test_global_scope_files_share_keys(tmp_path: Path) -> None:
    for name in ("x.json", "y.json"):
        doc = {
            "id": name,
            "block_size": 64,
            "hash_id_scope": "global",
            "requests": [{"t": 0, "type": "n", "in": 512, "out": 1, "hash_ids": list(range(8))}],
        }
        (tmp_path / name).write_text(json.dumps(doc))
    x, y = load_trace(tmp_path)
    assert x.blocks == y.blocks != ()


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"no \*\.json"):
        weka.load(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "bad"}')
    with pytest.raises(TraceFormatError, match="'requests' list"):
        weka.load(bad)
    bad.write_text('{"requests": [{"t": 0, "type": "n", "out": 1}]}')
    with pytest.raises(TraceFormatError, match="missing field 'in'"):
        weka.load(bad)

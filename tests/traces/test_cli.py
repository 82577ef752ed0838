"""`cache-router trace ...` through the real entry point, router.cli.main."""

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from router.cli import main
from traces.trace.cap import build_capped_trace
from traces.trace.formats import load_trace
from traces.trace.synth import SynthConfig, synthesize


def test_stats_text_and_json(shared: Callable, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(shared("conversation_trace.jsonl"))
    assert main(["trace", "stats", path]) == 0
    out = capsys.readouterr().out
    assert "hit ceiling   36.6% of 288,500 blocks" in out
    assert "turns/session mean 1.6  p50 1  p90 3  p99 8  max 43" in out
    assert main(["trace", "stats", "--json", path]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["hit_ceiling"] == 0.3664 and stats["sessions"] == 7_373


def test_stats_weka_directory(shared: Callable, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", "--json", str(shared("weka_kv_cache_tester"))]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 3_256


def test_cap(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = data / "mooncake_conversation_head200.jsonl"
    out = tmp_path / "capped.jsonl"
    assert main(["trace", "cap", "--max-turns", "1", str(src), str(out)]) == 0
    expected = build_capped_trace(load_trace(src), 1)
    got = load_trace(out)
    assert [(r.session_id, r.turn, r.input_length) for r in got] == [
        (r.session_id, r.turn, r.input_length) for r in expected
    ]
    assert len(got) == 193  # the first 200 requests hold 193 sessions, 7 second turns
    assert max(Counter(r.session_id for r in got).values()) == 1
    assert "kept 193 of 200 requests (193 sessions" in capsys.readouterr().err


def test_synth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.jsonl"
    argv = ["trace", "synth", "--sessions", "30", "--seed", "3", "--system-prompts", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    expected = synthesize(SynthConfig(sessions=30, seed=3, system_prompts=2))
    assert [(r.session_id, r.turn, r.input_length) for r in load_trace(out)] == [
        (r.session_id, r.turn, r.input_length) for r in expected
    ]
    assert f"wrote {out}" in capsys.readouterr().err


def test_errors(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(tmp_path / "absent.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "s"}\n')
    assert main(["trace", "stats", str(bad)]) == 1
    assert "bad.jsonl:1: missing field" in capsys.readouterr().err
    src = str(data / "generic_sample.jsonl")
    for argv in (["cap", "--max-turns", "0", src, str(tmp_path / "o")],
                 ["synth", "--rate", "0", "--out", str(tmp_path / "o")]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:  # an option out of range: argparse's exit 2
            main(["trace", *argv])
        assert exc.value.code == 2
        assert "error: argument --" in capsys.readouterr().err
    out = str(tmp_path / "o")
    assert main(["trace", "synth", "--system-prompt-tokens", "100", "--max-context", "50",
                 "--out", out]) == 2  # fmt: skip
    assert "max_context must exceed" in capsys.readouterr().err
    assert main(["trace"]) == 2


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, default in [(["cap"], "(default: 8)"), (["synth"], "(default: 200)")]:
        with pytest.raises(SystemExit) as exc:
            main(["trace", *argv, "--help"])
        assert exc.value.code == 0
        assert default in capsys.readouterr().out


def test_models_gives_each_session_one_model(tmp_path: Path) -> None:
    src = Path(__file__).parents[2] / "traces" / "data" / "conversation_sample.jsonl"
    out = tmp_path / "models.jsonl"
    argv = ["trace", "models", str(src), str(out), "--model", "base:2", "lora-0", "lora-1"]
    assert main(argv) == 0
    trace = load_trace(out)
    by_session: dict[str, set] = {}
    for req in trace:
        by_session.setdefault(req.session_id, set()).add(req.model)
    assert all(len(models) == 1 for models in by_session.values())  # a session, one model
    counts = {m: sum(1 for r in trace if r.model == m) for m in ("base", "lora-0", "lora-1")}
    assert sum(counts.values()) == len(trace)
    assert counts["base"] > counts["lora-0"] and counts["base"] > counts["lora-1"] > 0
    assert main(["trace", "models", str(src), str(out), "--model", "x:0"]) == 1

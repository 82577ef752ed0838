"""The hit-gap report (traces/reports/hit_gap.py): ``simulate``'s results.json, table and flag,
and ``capacity``'s gap at capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.cli import build_parser, main
from traces.commands.run_simulate import run_and_report
from traces.reports.capacity import capacity_table
from traces.reports.hit_gap import COLUMNS, GAP_METRICS, hit_gap_table
from traces.sim.hit_gap import PARTS
from traces.trace.formats import load_trace

SAMPLE = str(Path(__file__).parents[2] / "traces" / "data" / "weka_agentic_sample.jsonl")


def _simulate(tmp_path: Path, *more: str) -> dict:
    path = SAMPLE
    args = build_parser().parse_args(
        ["simulate", "--trace", path, "--workers", "4", "--policies", "ttft,round_robin,capped",
         "--kv-capacity-tokens", "1000000", "--out", str(tmp_path), "--no-plots", *more]
    )  # fmt: skip
    return run_and_report(path, load_trace(path), args, tmp_path, plots=False)


def test_simulate_splits_each_policy_s_gap(tmp_path: Path) -> None:
    document = _simulate(tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    ceiling = document["bounds"]["hit_ceiling"]
    for name, entry in saved["policies"].items():
        gap = entry["hit_gap"]
        assert gap["hit_rate"] == pytest.approx(entry["hit_rate"])
        if name != "capped":  # capped's ceiling is its own (capped) trace's
            assert gap["ceiling_rate"] == pytest.approx(ceiling)
        parts = sum(gap[f"{k}_rate"] for k in PARTS) - gap["beyond_ceiling_rate"]
        assert gap["hit_rate"] + parts == pytest.approx(gap["ceiling_rate"])
    assert saved["policies"]["round_robin"]["hit_gap"]["elsewhere_rate"] > 0.1
    table = (tmp_path / "results.md").read_text()
    assert hit_gap_table(saved) in table and "points of prompt tokens" in table
    rows = hit_gap_table(saved).splitlines()
    assert len(rows) == 2 + 3 and rows[0].count("|") == len(COLUMNS) + 2
    assert table.splitlines()[4].count("x bound") == 4  # the main table is as it was


def test_no_hit_gap_leaves_it_out(tmp_path: Path) -> None:
    document = _simulate(tmp_path, "--no-hit-gap")
    assert all("hit_gap" not in e for e in document["policies"].values())
    assert hit_gap_table(document) == ""
    assert "points of prompt tokens" not in (tmp_path / "results.md").read_text()


def test_capacity_shows_the_gap_at_capacity(tmp_path: Path) -> None:
    """Offline, every evaluated load carries the gap's split, and the table shows it at each
    policy's capacity (the simulate run at that load gives the same); --no-hit-gap: as before."""
    argv = ["capacity", "--trace", SAMPLE, "--workers", "4", "--kv-capacity-tokens", "1000000",
            "--policies", "ttft,lmetric", "--slo", "ttft_p90=15", "--grid-factor", "2",
            "--tolerance", "0.2", "--no-plots"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "on")]) == 0
    document = json.loads((tmp_path / "on" / "capacity.json").read_text())
    table = capacity_table(document)
    assert table.splitlines()[0].count("|") == 15 and "| in flight |" in table
    for entry in document["policies"].values():
        gap = entry["hit_gap_at_capacity"]
        at = next(p for p in entry["curve"] if p["load"] == entry["capacity"])
        assert gap == {k: at[k] for k in gap} and set(gap) == {f"gap_{k}" for k in GAP_METRICS}
        assert gap["gap_elsewhere"] + gap["gap_in_flight"] + gap["gap_evicted"] == pytest.approx(
            gap["gap_gap"]
        )  # open loop: no residual, nothing beyond the ceiling
        assert gap["gap_gap"] == pytest.approx(document["bounds"]["hit_ceiling"] - at["hit_rate"])
    assert main([*argv, "--out", str(tmp_path / "off"), "--no-hit-gap"]) == 0
    plain = json.loads((tmp_path / "off" / "capacity.json").read_text())
    assert all(e["hit_gap_at_capacity"] is None for e in plain["policies"].values())
    assert "in flight" not in capacity_table(plain)

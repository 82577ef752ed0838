"""A short run of bench/reliability/soak.py (slow suite): sim workers and a router as
processes, random client disconnects at every point, one worker killed and restarted mid-run.
The bar: no counter or pin left, no request lost that had not started streaming, the router
serves.

The long runs (10,000 requests with two kills; 10 minutes at concurrency 64 with RSS) are
recorded in bench/RESULTS.md and docs/bench-history.md ("reliability")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "reliability" / "soak.py"


@pytest.mark.slow
def test_short_soak_with_disconnects_and_a_kill(tmp_path: Path):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(SOAK), "--requests", "2500", "--concurrency", "32",
         "--disconnect-rate", "0.3", "--kill-workers", "1", "--restart-after-s", "2",
         "--time-scale", "4", "--warmup-s", "5", "--max-rss-growth", "1.0",
         "--progress-s", "30", "--out", str(out), "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert run.returncode == 0, (report["checks"], run.stderr[-2000:])
    assert report["requests"] == 2500
    assert report["outcomes"].get("lost", 0) == 0, report["lost_samples"]
    assert report["outcomes"].get("rejected", 0) == 0
    assert report["outcomes"]["disconnected"] > 500  # about 30 %
    assert set(report["disconnect_points"]) == {
        "while_sending", "before_answer", "after_status", "mid_stream"
    }  # fmt: skip
    assert len(report["kills"]) == 1 and "back_at_s" in report["kills"][0]
    assert not any(report["counters_at_end"].values()), report["counters_at_end"]
    assert report["router_in_flight_at_end"] == 0
    assert report["final_request"] == "ok"
    assert report["router_client_disconnects"] > 0  # the router saw clients leave

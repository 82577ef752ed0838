"""The capacity search (traces/sim/capacity.py) on fake curves, and ``cache-router capacity``."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from router.cli import main
from traces.reports.capacity import below_bound
from traces.sim.capacity import SLO, Grid, Point, parse_slo, search_capacity, slos_hold, summarize

P90 = SLO("ttft", 90, 2.0)


def curve(f: Callable[[float], float]) -> tuple[Callable[[float], dict], list[float]]:
    """``evaluate`` reading ttft_p90 = f(load), and the loads it was asked for."""
    asked: list[float] = []

    def evaluate(load: float) -> dict:
        asked.append(load)
        return {"ttft_p90": f(load)}

    return evaluate, asked


def holds(metrics: dict) -> bool:
    return slos_hold([P90], metrics)


def test_monotone_curve() -> None:
    """p90 = load: up the grid 1, 1.5, 2.25 (fails), one point above it, bisection to within
    3% of 2, then the step below the capacity filled in to 3%."""
    evaluate, asked = curve(lambda load: load)
    result = search_capacity(evaluate, holds, Grid())
    assert asked[:4] == [1.0, 1.5, 2.25, 3.375]
    assert result.monotone and not result.censored and result.holds_again is None
    assert result.capacity <= 2.0 < result.first_fail <= result.capacity * 1.03
    assert len(asked) == len(set(asked)) <= 20
    # the grid step below the capacity, from its bottom up
    below = sorted(x for x in asked if result.capacity / 1.5 <= x <= result.capacity)
    assert below[0] <= result.capacity / 1.5 * 1.03
    assert max(b / a for a, b in pairwise(below)) <= 1.03
    # bisection alone: the points the search took before the fill-in
    evaluate, bisected = curve(lambda load: load)
    assert search_capacity(evaluate, holds, Grid(verify=False)).capacity == result.capacity
    assert len(bisected) <= 9


def test_a_failure_between_two_loads_that_hold_is_found() -> None:
    """Near a knee a tail percentile can fail in a pocket below loads that hold (a burst
    that lands differently): the fill-in finds it, bisection alone steps over it."""
    pocket = lambda load: 5.0 if 1.60 <= load < 1.66 or load >= 2 else 1.0  # noqa: E731
    evaluate, _ = curve(pocket)
    bisected = search_capacity(evaluate, holds, Grid(verify=False))
    assert bisected.capacity > 1.9 and bisected.monotone  # the pocket unseen
    evaluate, _ = curve(pocket)
    result = search_capacity(evaluate, holds, Grid())
    assert result.capacity < 1.60 <= result.first_fail < 1.66
    assert result.first_fail <= result.capacity * 1.03
    assert not result.monotone and result.holds_again > 1.66


def test_non_monotone_curve_is_reported() -> None:
    """Fails on [2, 3), holds again on [3, 4): the capacity is below the first failure and
    the load that holds above it is reported with monotone False."""
    evaluate, _ = curve(lambda load: 5.0 if 2 <= load < 3 or load >= 4 else 1.0)
    result = search_capacity(evaluate, holds, Grid())
    assert not result.monotone
    assert result.holds_again == pytest.approx(3.375)
    assert result.capacity < 2.0 <= result.first_fail <= result.capacity * 1.03


def test_a_failure_at_the_bottom_of_the_step_sends_the_search_down_again() -> None:
    """The fill-in's first load, a grid step below the capacity bisection read, fails and
    nothing evaluated below it holds (the search came down the grid to 2): it walks down the
    grid again and reads the capacity below that failure, not none."""
    p90 = lambda load: 5.0 if 1.40 <= load < 1.50 or load >= 2.2 else 1.0  # noqa: E731
    evaluate, asked = curve(p90)
    result = search_capacity(evaluate, holds, Grid(start=3.0))
    assert asked[:2] == [3.0, 2.0]
    assert result.capacity is not None and result.capacity < 1.40 <= result.first_fail < 1.50
    assert result.first_fail <= result.capacity * 1.03 and not result.monotone


def test_down_the_grid_when_the_start_fails() -> None:
    evaluate, asked = curve(lambda load: load * 10)  # holds below 0.2
    result = search_capacity(evaluate, holds, Grid())
    assert asked[:5] == pytest.approx([1.0, 1 / 1.5, 1 / 1.5**2, 1 / 1.5**3, 1 / 1.5**4])
    assert result.capacity <= 0.2 < result.first_fail <= result.capacity * 1.03
    assert result.monotone  # 1.0 failing is not a second failure region


def test_a_plateau_stops_the_way_down() -> None:
    """The SLO fails at every load (the trace's bursts, not the queue): two loads with the
    same p90 are enough; no capacity."""
    evaluate, asked = curve(lambda load: 5.0)
    flat = lambda higher, lower: lower["ttft_p90"] >= higher["ttft_p90"]  # noqa: E731
    result = search_capacity(evaluate, holds, Grid(), flat=flat)
    assert asked == [1.0, 1 / 1.5]
    assert result.capacity is None and result.first_fail == pytest.approx(1 / 1.5)
    evaluate, asked = curve(lambda load: 5.0)
    assert search_capacity(evaluate, holds, Grid(min_load=0.1)).capacity is None
    assert min(asked) == 0.1  # without ``flat``: down to the bottom


def test_censored_at_the_top() -> None:
    evaluate, asked = curve(lambda load: 0.0)
    result = search_capacity(evaluate, holds, Grid(max_load=3.0))
    assert asked == [1.0, 1.5, 2.25, 3.0]
    assert result.censored and result.capacity == 3.0 and result.first_fail is None


def test_summarize_defines_capacity_below_the_first_failure() -> None:
    points = [Point(x, ok, {}) for x, ok in [(1, True), (2, False), (3, True), (1.5, True)]]
    result = summarize(points)
    assert (result.capacity, result.first_fail, result.holds_again) == (1.5, 2, 3)
    assert [p.load for p in result.curve()] == [1, 1.5, 2, 3]


def test_parse_slo() -> None:
    assert parse_slo("ttft_p90=2") == SLO("ttft", 90.0, 2.0)
    assert parse_slo("e2e_p99.9=30").key == "e2e_p99.9"
    assert str(parse_slo("tpot_p50=0.05")) == "tpot_p50=0.05"
    for bad in ("ttft=2", "ttft_p90", "queue_p90=1", "ttft_p0=1", "ttft_p90=0"):
        with pytest.raises(ValueError):
            parse_slo(bad)
    assert not P90.holds({"ttft_p90": math.nan}) and not P90.holds({})


def test_grid_checks() -> None:
    for bad in ({"factor": 1.0}, {"start": 0.01}, {"max_load": 0.5}, {"tolerance": 0}):
        with pytest.raises(ValueError):
            Grid(**bad)


def test_capacity_command(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    """Two policies on the Mooncake head, a coarse grid: the table (bound last), the curves,
    the plot; ttft carries more than round_robin within the SLO."""
    out = tmp_path / "cap"
    argv = ["capacity", "--trace", str(data / "mooncake_conversation_head200.jsonl"),
            "--workers", "4", "--policies", "ttft,round_robin", "--slo", "ttft_p90=8",
            "--grid-factor", "2", "--tolerance", "0.1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    table = printed.out.splitlines()
    assert table[0].startswith("| policy | capacity (x trace) | req/s")
    assert table[-2].startswith("| bound |")
    assert "round_robin" in printed.err  # the progress line
    document = json.loads((out / "capacity.json").read_text())
    ttft, rr = document["policies"]["ttft"], document["policies"]["round_robin"]
    assert ttft["capacity"] > rr["capacity"] > 0
    assert ttft["x_round_robin"] == pytest.approx(ttft["capacity"] / rr["capacity"])
    assert ttft["x_bound"] == pytest.approx(ttft["capacity"] / document["bounds"]["load_ceiling"])
    rate = document["rate_per_load"]["rps"]
    assert ttft["capacity_rps"] == pytest.approx(ttft["capacity"] * rate)
    for entry in (ttft, rr):
        loads = [p["load"] for p in entry["curve"]]
        assert loads == sorted(loads) and entry["evaluations"] == len(loads)
        at = next(p for p in entry["curve"] if p["load"] == entry["capacity"])
        assert at["holds"] and at["ttft_p90"] <= 8
        assert {"ttft_p50", "ttft_p99", "hit_rate"} <= set(at)
        assert entry["first_fail"] <= entry["capacity"] * 1.1
    assert (out / "capacity_ttft_p90.png").stat().st_size > 0
    assert "| bound |" in (out / "capacity.md").read_text()
    # the same searches in two forked processes
    assert main([*argv[:-1], str(tmp_path / "jobs"), "--jobs", "2", "--no-plots"]) == 0
    forked = json.loads((tmp_path / "jobs" / "capacity.json").read_text())["policies"]
    assert {n: e["capacity"] for n, e in forked.items()} == {
        n: e["capacity"] for n, e in document["policies"].items()
    }


def test_capacity_command_as_shipped(tmp_path: Path, data: Path) -> None:
    """No SLO, grid or fleet flags: the defaults (``ttft_p90=2``, the measured H100 profile)
    find a capacity that holds it, below the first load that fails it."""
    out = tmp_path / "cap"
    trace = str(data / "mooncake_conversation_head200.jsonl")
    assert main(["capacity", "--trace", trace, "--policies", "ttft", "--out", str(out)]) == 0
    document = json.loads((out / "capacity.json").read_text())
    assert document["slos"] == ["ttft_p90=2"]
    assert (document["fleet"]["shadow"], document["fleet"]["kv_events"]) == ("blocks", False)
    assert "the router reading its blocks shadow" in (out / "capacity.md").read_text()
    ttft = document["policies"]["ttft"]
    at = next(p for p in ttft["curve"] if p["load"] == ttft["capacity"])
    assert at["holds"] and at["ttft_p90"] <= 2
    # (not below the load ceiling: a 200-request sample can end over it, the work spilling
    # past the last arrival, with its p90 still met)
    assert ttft["capacity"] < ttft["first_fail"]
    # the fleet's bound is below what the default reached, so the SLO is not named below it
    assert document["bounds"]["ttft_fleet_p90"] <= at["ttft_p90"]
    assert document["slos_below_bound"] == []
    assert (out / "capacity_ttft_p90.png").stat().st_size > 0


def test_capacity_in_precise_mode_says_so(tmp_path: Path, data: Path) -> None:
    """``--kv-events``: the document and its paragraph name the router's view, so a reading
    in precise mode is not taken for one with the default shadow."""
    out = tmp_path / "cap"
    trace = str(data / "mooncake_conversation_head200.jsonl")
    argv = ["capacity", "--trace", trace, "--policies", "ttft", "--kv-events", "--no-plots",
            "--grid-factor", "2", "--tolerance", "0.2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    document = json.loads((out / "capacity.json").read_text())
    assert document["fleet"]["kv_events"] is True
    assert "the router reading the workers' KV events" in (out / "capacity.md").read_text()
    assert document["policies"]["ttft"]["capacity"] > 0


def test_capacity_pools_replays_with_jittered_arrivals(tmp_path: Path, data: Path) -> None:
    """``--replays 3``: each load's percentiles pool three runs (the trace and two jittered
    replays), and the document and its paragraph say so."""
    out = tmp_path / "cap"
    trace = str(data / "mooncake_conversation_head200.jsonl")
    argv = ["capacity", "--trace", trace, "--policies", "ttft", "--replays", "3", "--no-plots",
            "--grid-factor", "2", "--tolerance", "0.2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    document = json.loads((out / "capacity.json").read_text())
    assert (document["fleet"]["replays"], document["fleet"]["jitter"]) == (3, 0.5)
    assert "pool 3 runs" in (out / "capacity.md").read_text()
    entry = document["policies"]["ttft"]
    assert entry["capacity"] > 0
    assert all(p["requests"] == 3 * 200 for p in entry["curve"])


def test_capacity_command_errors(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    trace = str(data / "mooncake_conversation_head200.jsonl")
    with pytest.raises(SystemExit):
        main(["capacity", "--trace", trace, "--slo", "ttft=2"])
    assert "bad SLO" in capsys.readouterr().err
    assert main(["capacity", "--trace", trace, "--policies", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown policies" in capsys.readouterr().err
    assert main(["capacity", "--trace", trace, "--pacing", "session", "--out", str(tmp_path)]) == 2
    assert "needs --pacing open" in capsys.readouterr().err
    argv = ["capacity", "--trace", trace, "--replays", "2", "--jitter", "0", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--replays > 1 needs --jitter > 0" in capsys.readouterr().err
    assert main([*argv[:5], "--live", "--out", str(tmp_path)]) == 2
    assert "--replays is offline only" in capsys.readouterr().err


def test_capacity_live(tmp_path: Path, data: Path) -> None:
    """--live through sweep's machinery: sim workers at 20x real time, a router, one load
    (the grid is a single point), the workers' own hit rate."""
    out = tmp_path / "live"
    argv = ["capacity", "--live", "--trace", str(data / "mooncake_conversation_head200.jsonl"),
            "--max-requests", "30", "--workers", "2", "--policies", "ttft",
            "--slo", "ttft_p90=60", "--start-load", "1", "--max-load", "1", "--out", str(out),
            "--no-plots"]  # fmt: skip
    assert main(argv) == 0
    document = json.loads((out / "capacity.json").read_text())
    assert document["fleet"]["mode"] == "live"
    entry = document["policies"]["ttft"]
    assert entry["capacity"] == 1.0 and entry["censored"] and entry["evaluations"] == 1
    point = entry["curve"][0]
    assert point["errors"] == 0 and point["requests"] == 30 and point["hit_rate"] is not None


def test_an_slo_below_the_fleet_bound_is_named() -> None:
    """ttft_p90=4 on a fleet whose bound reads 4.77 s at p90: no router meets it at any load;
    5 s, p99 (bound 26 s) and e2e are not judged against a p90 bound."""
    bounds = {"ttft_fleet_p50": 0.24, "ttft_fleet_p90": 4.77, "ttft_fleet_p99": 26.1}
    slos = [parse_slo(t) for t in ("ttft_p90=4", "ttft_p90=5", "ttft_p99=30", "e2e_p90=1")]
    assert below_bound(slos, bounds) == ["ttft_p90=4 (bound 4.770 s)"]
    assert below_bound([parse_slo("ttft_p95=1")], bounds) == []  # no bound at p95


def test_capacity_refuses_a_single_burst_before_searching(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture
) -> None:
    """Requests that all share one timestamp: every speedup is the same burst, so no load to
    search (it ran the whole search, then died dividing by the zero span): exit 2, one line."""
    burst = tmp_path / "burst.jsonl"
    burst.write_text(
        "\n".join((data / "mooncake_conversation_head200.jsonl").read_text().splitlines()[:5])
    )
    assert all('"timestamp": 0' in line for line in burst.read_text().splitlines())
    argv = ["capacity", "--trace", str(burst), "--workers", "2", "--policies", "ttft",
            "--no-plots", "--no-hit-gap", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    printed = capsys.readouterr()
    assert printed.err.strip().count("\n") == 0 and "one instant" in printed.err
    assert "run 1" not in printed.err  # refused before the first simulation
    assert not (tmp_path / "out").exists()


def test_capacity_refuses_bad_and_too_long_lines_naming_them(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture
) -> None:
    """A bad trace line: exit 2, one line naming it; a line longer than a worker's context
    (the engine's 400 at every load): exit 2 before searching, naming it."""
    head = (data / "mooncake_conversation_head200.jsonl").read_text().splitlines()[:20]
    path = tmp_path / "t.jsonl"
    argv = ["capacity", "--trace", str(path), "--workers", "2", "--policies", "ttft",
            "--no-plots", "--no-hit-gap", "--out", str(tmp_path / "out")]  # fmt: skip
    for bad, said in (("Infinity", "must be an integer"), ("300000", "exceed")):
        line = f'{{"timestamp": 9000, "input_length": {bad}, "output_length": 5, "hash_ids": [1]}}'
        path.write_text("\n".join([*head, line]) + "\n")
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{path}:21" in err and said in err, err
        assert "Traceback" not in err


def test_capacity_live_counts_and_names_the_given_workers(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture
) -> None:
    """--live --worker URL: the fleet is the given worker (it said 8 workers), and one that
    does not answer is named (it named the router's internal port instead)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    argv = ["capacity", "--live", "--trace", str(data / "mooncake_conversation_head200.jsonl"),
            "--max-requests", "20", "--worker", url, "--policies", "round_robin",
            "--no-plots", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "20 requests, 1 workers" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"cache-router capacity: error: worker {url} is unreachable: "), last

"""The router's reading of a burst of bodies, measured: which (rate, window) of the
simulator's ingest model reproduces the order and times at which `serve` picks them.

    python bench/live_vs_offline/ingest_window.py [--repeats 3] [--out bench/results/ingest_window]

The simulator models the router reading request bodies (``SimConfig.ingest_bytes_per_s``,
``ingest_window_bytes``, :class:`traces.sim.simulator.Ingest`): the bodies in flight share one
read rate, and a body within the window is in when sent. docs/live-vs-offline.md fitted the
window to the pickers' live ranking; this measures it on the mechanism itself. The opening
burst of the Weka agentic sample (its 42 first turns sent at once, text prompts, 51-1000 KB
bodies, built before the clock starts as the replay does) goes through ``cache-router
serve`` (ttft, the pick of every request logged with its time by
bench/live_vs_offline/live_vs_offline.py's shim) in front of 4 sim workers, ``--repeats``
times with fresh salts, routers and caches. For each candidate rate and window the model
gives each request's read-done time from the bodies' real sizes; the fit is the candidate
whose order (Spearman against the pick order) and times (mean absolute error of each pick's
time after the first) are closest.
Loopback only; every process started here is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from live_vs_offline import read_picklog, spearman, start_router  # noqa: E402

from traces.live.fleet import reset_caches, sim_workers  # noqa: E402
from traces.live.replay import ReplayConfig, prebuilt_bodies, replay  # noqa: E402
from traces.sim.simulator import Ingest  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402

TRACE = ROOT / "traces" / "data" / "weka_agentic_sample.jsonl"
RATES_MB_S = (50.0, 100.0, 200.0)
WINDOWS_KB = (0, 32, 64, 96, 128, 160, 192, 256, 384, 512, 1024)
SPEEDUP = 20.0


def opening_burst(path: Path) -> list:
    """The trace's first turns sent at its first arrival time (each session's first)."""
    trace = load_trace(str(path))
    seen: set[str] = set()
    burst = []
    for r in trace:
        if r.arrival == trace[0].arrival and r.session_id not in seen:
            burst.append(replace(r, output_length=1))
        seen.add(r.session_id)
    return burst


def modelled_done(sizes: list[int], rate_bytes_s: float, window_bytes: float) -> np.ndarray:
    """Read-done times (s after the send) of bodies all sent at 0, by the simulator's model
    (a body within the window is in at 0, in send order)."""
    ingest = Ingest(rate_bytes_s, window_bytes)
    done = np.zeros(len(sizes))  # a body within the window: in at 0
    for i, size in enumerate(sizes):
        ingest.admit(i, size, 0.0)
    while ingest:
        when, i = ingest.pop()
        done[i] = when
    return done


def measure(burst: list, repeats: int, logdir: Path) -> list[dict]:
    """Per repeat: each burst request's body size and its pick time after the first pick."""
    runs = []
    with sim_workers(4, ["--time-scale", str(SPEEDUP)]) as sims:
        urls = [w.url for w in sims]
        for salt in range(repeats):
            if not reset_caches(urls):
                raise RuntimeError("sim workers refused a cache reset")
            log = str(logdir / f"picks-{salt}.jsonl")
            service = start_router(urls, "ttft", log)
            try:
                cfg = ReplayConfig(url=service.url, speedup=SPEEDUP, prompt_mode="text",
                                   salt=salt, worker_urls=tuple(urls))  # fmt: skip
                outcome = asyncio.run(replay(burst, cfg, "ttft"))
                model = served_model(service.url)
            finally:
                service.stop()
            picks = read_picklog(log)
            sizes = [len(body) for body in prebuilt_bodies(burst, cfg, model)]
            at = {p["session"]: p["t"] for p in picks}
            t = np.array([at[r.session_id] for r in burst])
            runs.append({"salt": salt, "errors": outcome.errors, "sizes": sizes,
                         "pick_s": (t - t.min()).tolist()})  # fmt: skip
    return runs


def served_model(url: str) -> str:
    """The model the replay names (the router's first), so the bodies are the replay's."""
    return httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]


def fit(runs: list[dict]) -> list[dict]:
    rows = []
    for rate in RATES_MB_S:
        for window in WINDOWS_KB:
            rhos, errs = [], []
            for run in runs:
                sizes, picked = run["sizes"], np.array(run["pick_s"])
                done = modelled_done(sizes, rate * 1e6, window * 1024)
                rhos.append(spearman(done, picked))
                errs.append(float(np.abs((done - done.min()) - picked).mean()) * 1000)
            rho, mae = float(np.median(rhos)), float(np.median(errs))
            rows.append({"rate_mb_s": rate, "window_kb": window, "spearman": rho, "mae_ms": mae})
    return rows


def table(runs: list[dict], rows: list[dict]) -> str:
    sizes = np.array(runs[0]["sizes"])
    lines = [
        f"Weka opening burst: {len(sizes)} bodies, {sizes.sum() / 1e6:.1f} MB "
        f"({sizes.min() / 1024:.0f}-{sizes.max() / 1024:.0f} KB); {len(runs)} repeats; "
        "picks spread over "
        + ", ".join(f"{max(r['pick_s']) * 1000:.0f} ms" for r in runs)
        + "; pick order against body size, Spearman "
        + ", ".join(f"{spearman(np.array(r['sizes'], float), np.array(r['pick_s'])):+.2f}"
                    for r in runs),
        "",
        "| rate MB/s | window KB | Spearman (model vs picks, median) | time MAE ms (median) |",
        "|---:|---:|---:|---:|",
    ]  # fmt: skip
    best = max(rows, key=lambda r: (round(r["spearman"], 2), -r["mae_ms"]))
    for r in rows:
        mark = " **best**" if r is best else ""
        lines.append(f"| {r['rate_mb_s']:.0f} | {r['window_kb']} | {r['spearman']:+.3f}{mark} "
                     f"| {r['mae_ms']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="writes OUT.json and OUT.md")
    args = ap.parse_args()
    burst = opening_burst(TRACE)
    with tempfile.TemporaryDirectory(prefix="ingest-window-") as tmp:
        runs = measure(burst, args.repeats, Path(tmp))
    rows = fit(runs)
    md = table(runs, rows)
    print(md)
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps({"runs": runs, "fit": rows}) + "\n")
        args.out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

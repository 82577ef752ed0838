"""Issue 27's hit-rate bar: the true hit rate of a replay through Envoy + ``cache-router epp``
against the same replay through ``cache-router serve``, paired runs, median ratio.

    nice -n 5 .venv/bin/python bench/epp/epp_hit.py [--pairs 3] [--out bench/results/epp_hit.json]

Each pair: the bundled Weka agentic sample (240 requests, 45 sessions) replayed session-paced
at 20x (:mod:`traces.live.replay`, prompts rebuilt from the trace's blocks, outputs capped at 8
tokens) through ``serve`` (ttft) in front of 3 fresh sim workers (time scale 50, 2M tokens of
KV each; ``--speedup ARRIVALS TIME_SCALE`` for others), then through a GIE-style Envoy
(router/epp/envoy_config.py: request headers and a BUFFERED body, response headers and a
STREAMED body) asking one ``epp`` process (ttft) in front of 3 other fresh sim workers. The
hit rate is the workers' own (cached / prompt tokens they report); the picker's branches from
each router's /metrics. The order alternates from pair to pair. The bar: Envoy + EPP >= 0.95x
serve. Loopback only; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from epp_bench import Procs, start_envoy, wait_http  # noqa: E402

from router.epp.envoy_config import gateway_config  # noqa: E402
from traces.live.fleet import free_port, router, scrape, sim_workers  # noqa: E402
from traces.live.replay import ReplayConfig, replay  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402

SPEEDUP = [20.0, 50.0]  # the replay's arrival speedup, the workers' time scale (--speedup)
SAMPLE = ROOT / "traces" / "data" / "weka_agentic_sample.jsonl"
BAR = 0.95


def sim_args(time_scale: float) -> list[str]:
    return ["--time-scale", str(time_scale), "--log-level", "warning",
            "--kv-capacity-tokens", "2097152"]  # fmt: skip


def hit_rate(trace, url: str, workers: tuple[str, ...], name: str) -> float:
    cfg = ReplayConfig(url=url, speedup=SPEEDUP[0], pacing="session", model="sim-model",
                       worker_urls=workers, max_output_tokens=8, vocab_size=4096)  # fmt: skip
    outcome = asyncio.run(replay(trace, cfg, name))
    if outcome.errors or outcome.worker_hit_rate is None:
        raise RuntimeError(f"{name}: {outcome.errors} errors {outcome.error_samples[:3]}")
    return outcome.worker_hit_rate


def decisions(router_url: str) -> dict[str, int]:
    """The picker's branches, from the router's /metrics."""
    return {
        s.labels["branch"]: int(s.value)
        for s in scrape(router_url)
        if s.name == "cache_router_decisions_total"
    }


def through_serve(trace) -> tuple[float, dict[str, int]]:
    with sim_workers(3, sim_args(SPEEDUP[1])) as fresh:
        urls = tuple(w.url for w in fresh)
        with router(list(urls), "ttft", ["--log-level", "warning"]) as serve:
            return hit_rate(trace, serve.url, urls, "serve"), decisions(serve.url)


def through_epp(trace, folder: Path) -> tuple[float, dict[str, int]]:
    cli = str(Path(sys.executable).parent / "cache-router")
    with sim_workers(3, sim_args(SPEEDUP[1])) as fresh:
        urls = tuple(w.url for w in fresh)
        procs = Procs()
        try:
            grpc_port, http_port = free_port(), free_port()
            procs.start([cli, "epp", "--worker", *urls, "--port", str(grpc_port),
                         "--http-port", str(http_port), "--plaintext", "--log-level", "warning"],
                        folder / "epp.log")  # fmt: skip
            wait_http(f"http://127.0.0.1:{http_port}/health")
            port, admin = free_port(), free_port()
            start_envoy(procs, folder, gateway_config(port, admin, grpc_port), "envoy")
            rate = hit_rate(trace, f"http://127.0.0.1:{port}", urls, "epp")
            return rate, decisions(f"http://127.0.0.1:{http_port}")
        finally:
            procs.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--speedup", type=float, nargs=2, default=SPEEDUP,
                    metavar=("ARRIVALS", "TIME_SCALE"),
                    help="replay speedup and the workers' time scale (default 20 50: a real "
                    "ms of the gateway's weighs 50 modelled ms)")  # fmt: skip
    args = ap.parse_args()
    SPEEDUP[:] = args.speedup
    trace = load_trace(SAMPLE)
    folder = Path(tempfile.mkdtemp(prefix="epp-hit-"))
    pairs = []
    for i in range(args.pairs):
        if i % 2 == 0:
            serve, serve_branches = through_serve(trace)
            epp, epp_branches = through_epp(trace, folder)
        else:
            epp, epp_branches = through_epp(trace, folder)
            serve, serve_branches = through_serve(trace)
        pairs.append({"serve": round(serve, 4), "epp": round(epp, 4),
                      "ratio": round(epp / serve, 3), "serve_branches": serve_branches,
                      "epp_branches": epp_branches})  # fmt: skip
        print(json.dumps(pairs[-1]), flush=True)
    median = statistics.median(p["ratio"] for p in pairs)
    verdict = "met" if median >= BAR else "not met"
    print(f"median ratio {median:.3f} (bar {BAR}: {verdict})")
    if args.out is not None:
        args.out.write_text(json.dumps({"pairs": pairs, "median_ratio": median}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

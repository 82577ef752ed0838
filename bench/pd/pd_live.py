"""Issue 29's bar, live: cache-aware prefill picking in front of real PD sim workers.

    nice -n 10 .venv/bin/python bench/pd/pd_live.py [--requests 600] [--speedup 5]
        [--time-scale 10] [--kv-capacity-tokens 262144 [1000000 ...]]

For each KV capacity, each flavor (``vllm``, ``sglang``: the PD protocol, the workers'
/metrics names) and each prefill picker (``ttft``, the default; ``round_robin``; ``unified``
as a reference), a FRESH fleet of 2 prefill + 2 decode sim workers (``--fleet P D`` for
another shape; ``cache-router sim-worker --role prefill|decode --flavor F``, an SGLang
prefill with its own
``--disaggregation-bootstrap-port``; KV transfers at the sim worker's defaults) and a
``cache-router serve --prefill ... --decode ... --pd-protocol F --policy P`` (decode picker:
the default ``decode_load``; told the workers' time scale as ``sweep`` tells it,
:func:`traces.live.fleet.time_scaled_router_args`) replays the first ``--requests`` requests
of the bundled conversation sample (:mod:`traces.live.replay`: open loop, streamed, prompts
rebuilt from the trace's blocks, outputs capped at ``--max-output-tokens`` as
bench/models/model_fleet.py).

Time: the workers run ``--time-scale`` model seconds per real second (10, as
bench/models/model_fleet.py's default) and requests arrive ``--speedup`` times as fast as recorded
(5), so the load in model time is ``speedup / time_scale`` = 0.5x the trace's: the "low" load
of bench/pd/pd_compare.py, where 2 prefill workers are busy (the trace's uncached prompt tokens
at 1x are about 1.3x what two 15k tokens/s prefill workers compute) but not overloaded.

Read per run: the prefill hit rate, the prefill workers' own prefix-cache hits / queries
from their /metrics (:func:`router.fleet.worker_truth.parse_worker_metrics`: vLLM's
``prefix_cache_hits/queries``, SGLang's ``realtime_tokens{mode=prefill_cache|
prefill_compute}``), deltas over the replay; requests per worker from the router's
/workers (``requests_total``: attempts) and decode max/mean of them; errors (non-2xx or a
broken stream, at the client); TTFT p50/p90 at the client; KV transfers sent/received from
the workers' ``sim:kv_transfers_total``; the router's and workers' WARNING/ERROR log lines.

The bar: ``ttft``'s prefill hit rate >= 1.5x ``round_robin``'s per flavor, and ``ttft``'s
decode max/mean requests <= 1.2. Writes bench/results/pd_live.json and bench/results/pd_live.md.

About 45 s a row (40 s of replay, the rest starting 5 processes), so about 4.5 minutes for
one capacity, 9 for two. Noise: the sample's arrivals are whole seconds (2,000 requests on 224
instants), so the requests of one instant reach the router in any order and even
round_robin's assignment (and hit rate) changes from run to run; every request shares the
sample's first block (a 3.7% hit-rate floor for any picker), and at 262,144 tokens per
worker (about 18 prompts) a session's next turn finds its previous one evicted whatever the
picker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router.fleet.worker_truth import parse_worker_metrics  # noqa: E402
from traces.live.fleet import (  # noqa: E402
    HOST,
    Service,
    free_port,
    scrape,
    start_service,
    time_scaled_router_args,
)
from traces.live.replay import ReplayConfig, replay  # noqa: E402
from traces.trace.formats import load_trace  # noqa: E402

SAMPLE = ROOT / "traces" / "data" / "conversation_sample.jsonl"
FLAVORS = ("vllm", "sglang")
POLICIES = ("ttft", "round_robin", "unified")
DEFAULT, BASELINE = "ttft", "round_robin"
HIT_BAR, DECODE_BAR = 1.5, 1.2


@dataclass
class Fleet:
    prefill: list[tuple[Service, int | None]]  # (worker, SGLang bootstrap port)
    decode: list[Service]
    logs: list[Path] = field(default_factory=list)

    @property
    def prefill_urls(self) -> list[str]:
        return [s.url for s, _ in self.prefill]

    @property
    def decode_urls(self) -> list[str]:
        return [s.url for s in self.decode]


@dataclass
class RunResult:
    kv_capacity_tokens: int
    flavor: str
    policy: str
    requests: int  # answered in full
    errors: int
    error_samples: list[str]
    prefill_hit_rate: float  # prefill workers' own hits / queries
    prefill_hits: float
    prefill_queries: float
    prefill_requests: dict[str, int]  # router's requests_total per prefill worker
    decode_requests: dict[str, int]  # and per decode worker
    decode_max_mean: float
    served_by: dict[str, int]  # client-side: the worker header of the answers
    ttft_p50: float
    ttft_p90: float
    kv_sent: float
    kv_received: float
    kv_failures: float
    router_counters: dict[str, dict[str, float]]  # attempts by status, retries, PD outcomes
    wall_s: float
    send_lag_p99: float
    log_warnings: list[str]


def _start_worker(flavor: str, role: str, i: int, args: Sequence[str], logs: Path):
    port = free_port()
    cmd = ["sim-worker", "--host", HOST, "--port", str(port), "--flavor", flavor]
    cmd += ["--role", role, *args]
    bootstrap = None
    if flavor == "sglang" and role == "prefill":
        bootstrap = free_port()
        cmd += ["--disaggregation-bootstrap-port", str(bootstrap)]
    log = logs / f"{flavor}-{role}-{i}.log"
    return start_service(f"{flavor}-{role}-{i}", cmd, port, log_file=str(log)), bootstrap, log


@contextlib.contextmanager
def pd_fleet(
    flavor: str, args: Sequence[str], logs: Path, n: int = 2, decode: int | None = None
) -> Iterator[Fleet]:
    """``n`` prefill + ``decode`` (default ``n``) decode sim workers of ``flavor``, started at
    once, stopped on exit (each by its PID)."""
    decode = n if decode is None else decode
    roles = [("prefill", i) for i in range(n)] + [("decode", i) for i in range(decode)]
    with ThreadPoolExecutor(len(roles)) as pool:
        futures = [pool.submit(_start_worker, flavor, r, i, args, logs) for r, i in roles]
    started, failure = [], None
    for future in futures:
        try:
            started.append(future.result())
        except Exception as exc:
            failure = failure or exc
    try:
        if failure is not None:
            raise failure
        fleet = Fleet(
            prefill=[(s, b) for s, b, _ in started[:n]],
            decode=[s for s, _, _ in started[n:]],
            logs=[log for _, _, log in started],
        )
        yield fleet
    finally:
        for service, _, _ in started:
            service.stop()


@contextlib.contextmanager
def pd_router(
    fleet: Fleet, flavor: str, policy: str, log: Path, time_scale: float
) -> Iterator[Service]:
    port = free_port()
    prefill: list[str] = []
    for service, bootstrap in fleet.prefill:
        prefill += [service.url] + ([str(bootstrap)] if bootstrap else [])
    args = ["serve", "--host", HOST, "--port", str(port), "--policy", policy,
            "--prefill", *prefill, "--decode", *fleet.decode_urls, "--pd-protocol", flavor,
            "--log-level", "warning", "--models-interval-s", "1",
            *time_scaled_router_args(policy, time_scale)]  # fmt: skip
    service = start_service(f"router-{flavor}-{policy}", args, port, log_file=str(log))
    try:
        _wait_workers(service.url, len(fleet.prefill) + len(fleet.decode))
        yield service
    finally:
        service.stop()


def _wait_workers(url: str, n: int, timeout_s: float = 30.0) -> None:
    """Until the router lists every worker and has read its models."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(url + "/workers", timeout=5).json()
        if len(workers) == n and all(w.get("models") for w in workers):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{url}: the workers were not all known within {timeout_s:.0f} s")


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


def prefix_counters(urls: Sequence[str]) -> tuple[float, float]:
    """Summed (hits, queries) of the workers' own prefix-cache counters."""
    hits = queries = 0.0
    for url in urls:
        reading = parse_worker_metrics(_metrics(url))
        hits += reading.prefix_cache_hits or 0.0
        queries += reading.prefix_cache_queries or 0.0
    return hits, queries


def sim_counter(urls: Sequence[str], name: str, **labels: str) -> float:
    total = 0.0
    for url in urls:
        for s in scrape(url):
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def router_counters(url: str) -> dict[str, dict[str, float]]:
    """The router's attempts by status (summed over workers; a failed one also names its
    worker), retries by reason and disaggregated requests by outcome."""
    wanted = {
        "cache_router_requests_total": "status",
        "cache_router_retries_total": "reason",
        "cache_router_disaggregated_requests_total": "outcome",
    }
    out: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for s in scrape(url):
        if s.name in wanted and s.value:
            key = s.labels.get(wanted[s.name], "")
            if s.name == "cache_router_requests_total" and not key.startswith("2"):
                key = f"{key} {s.labels.get('worker', '')}"  # which worker failed
            out[s.name][key] = out[s.name].get(key, 0.0) + s.value
    return out


SHUTDOWN = "draining ("  # the router's own line when we stop it (SIGTERM)


def log_warnings(paths: Sequence[Path], keep: int = 5) -> list[str]:
    """WARNING/ERROR lines of the logs (the router's shutdown line left out)."""
    lines = []
    for path in paths:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if SHUTDOWN in line:
                    continue
                if "WARNING" in line or "ERROR" in line or "Traceback" in line:
                    lines.append(f"{path.stem}: {line.strip()[:300]}")
    return lines[:keep] + ([f"... {len(lines) - keep} more"] if len(lines) > keep else [])


def run_one(trace, args: argparse.Namespace, kv: int, flavor: str, policy: str) -> RunResult:
    worker_args = ["--time-scale", str(args.time_scale), "--log-level", "warning",
                   "--kv-capacity-tokens", str(kv)]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pd_live_") as tmp:
        logs = Path(tmp)
        with pd_fleet(flavor, worker_args, logs, *args.fleet) as fleet:
            router_log = logs / "router.log"
            with pd_router(fleet, flavor, policy, router_log, args.time_scale) as router:
                before = prefix_counters(fleet.prefill_urls)
                cfg = ReplayConfig(
                    url=router.url,
                    speedup=args.speedup,
                    max_output_tokens=args.max_output_tokens,
                    worker_urls=tuple(fleet.prefill_urls),
                )
                t0 = time.monotonic()
                outcome = asyncio.run(replay(trace, cfg, f"{flavor}/{policy}"))
                wall = time.monotonic() - t0
                after = prefix_counters(fleet.prefill_urls)
                workers = httpx.get(router.url + "/workers", timeout=10).json()
                kv_sent = sim_counter(
                    fleet.prefill_urls, "sim:kv_transfers_total", direction="sent"
                )
                kv_received = sim_counter(
                    fleet.decode_urls, "sim:kv_transfers_total", direction="received"
                )
                kv_failures = sim_counter(fleet.decode_urls, "sim:kv_transfer_failures_total")
                counters = router_counters(router.url)
            warnings = log_warnings([router_log, *fleet.logs])
    hits, queries = after[0] - before[0], after[1] - before[1]
    by_role: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
    for w in workers:
        by_role.setdefault(w["role"], {})[w["url"]] = int(w["requests_total"])
    decode = list(by_role["decode"].values())
    run = outcome.run
    ttft = run.first_token - run.arrival
    served: dict[str, int] = {}
    for index in run.worker:
        url = outcome.served_by[int(index)]
        served[url] = served.get(url, 0) + 1
    return RunResult(
        kv_capacity_tokens=kv,
        flavor=flavor,
        policy=policy,
        requests=run.requests,
        errors=outcome.errors,
        error_samples=outcome.error_samples,
        prefill_hit_rate=hits / queries if queries else float("nan"),
        prefill_hits=hits,
        prefill_queries=queries,
        prefill_requests=by_role["prefill"],
        decode_requests=by_role["decode"],
        decode_max_mean=max(decode) / (sum(decode) / len(decode)) if sum(decode) else float("nan"),
        served_by=served,
        ttft_p50=float(np.percentile(ttft, 50)) if len(ttft) else float("nan"),
        ttft_p90=float(np.percentile(ttft, 90)) if len(ttft) else float("nan"),
        kv_sent=kv_sent,
        kv_received=kv_received,
        kv_failures=kv_failures,
        router_counters=counters,
        wall_s=wall,
        send_lag_p99=outcome.send_lag_p99,
        log_warnings=warnings,
    )


def _split(counts: dict[str, int]) -> str:
    return " / ".join(str(n) for _, n in sorted(counts.items()))


def runs_table(results: Sequence[RunResult]) -> str:
    lines = [
        "| KV per worker | flavor | prefill policy | ok | errors | prefill hit rate "
        "| prefill requests | decode requests | decode max/mean | TTFT p50 s | TTFT p90 s "
        "| KV sent / received | wall s | log warnings |",
        "|---:|---|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.kv_capacity_tokens:,} | {r.flavor} | {r.policy} | {r.requests} | {r.errors} "
            f"| {100 * r.prefill_hit_rate:.2f}% | {_split(r.prefill_requests)} "
            f"| {_split(r.decode_requests)} | {r.decode_max_mean:.3f} | {r.ttft_p50:.3f} "
            f"| {r.ttft_p90:.3f} | {r.kv_sent:.0f} / {r.kv_received:.0f} | {r.wall_s:.1f} "
            f"| {len(r.log_warnings)} |"
        )
    return "\n".join(lines)


def verdicts(results: Sequence[RunResult]) -> list[dict]:
    out = []
    keys = sorted({(r.kv_capacity_tokens, r.flavor) for r in results})
    for kv, flavor in keys:
        of = {r.policy: r for r in results if (r.kv_capacity_tokens, r.flavor) == (kv, flavor)}
        if DEFAULT not in of or BASELINE not in of:
            continue
        d, b = of[DEFAULT], of[BASELINE]
        ratio = d.prefill_hit_rate / b.prefill_hit_rate if b.prefill_hit_rate else float("inf")
        out.append({
            "kv_capacity_tokens": kv, "flavor": flavor,
            "hit_default": d.prefill_hit_rate, "hit_round_robin": b.prefill_hit_rate,
            "ratio": ratio, "decode_max_mean_default": d.decode_max_mean,
            "decode_max_mean_round_robin": b.decode_max_mean,
            "errors": d.errors + b.errors,
            "hit_bar": ratio >= HIT_BAR, "decode_bar": d.decode_max_mean <= DECODE_BAR,
        })  # fmt: skip
    return out


def bar_table(rows: Sequence[dict]) -> str:
    lines = [
        f"| KV per worker | flavor | {DEFAULT} hit | {BASELINE} hit | ratio (>= {HIT_BAR}x) "
        f"| decode max/mean {DEFAULT} (<= {DECODE_BAR}) | decode max/mean {BASELINE} "
        "| errors | hit bar | decode bar |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for v in rows:
        lines.append(
            f"| {v['kv_capacity_tokens']:,} | {v['flavor']} | {100 * v['hit_default']:.2f}% "
            f"| {100 * v['hit_round_robin']:.2f}% | {v['ratio']:.2f}x "
            f"| {v['decode_max_mean_default']:.3f} | {v['decode_max_mean_round_robin']:.3f} "
            f"| {v['errors']} | {'pass' if v['hit_bar'] else 'FAIL'} "
            f"| {'pass' if v['decode_bar'] else 'FAIL'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=SAMPLE)
    p.add_argument("--requests", type=int, default=600, help="the trace's first N requests")
    p.add_argument("--speedup", type=float, default=5.0, help="arrival speedup (real time)")
    p.add_argument("--time-scale", type=float, default=10.0, help="sim workers' time scale")
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--kv-capacity-tokens", type=int, nargs="+", default=[262_144])
    p.add_argument("--flavors", nargs="+", choices=FLAVORS, default=list(FLAVORS))
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument("--fleet", type=int, nargs=2, default=[2, 2], metavar=("PREFILL", "DECODE"),
                   help="prefill and decode workers (the bar's: 2 2)")  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pd_live.json")
    p.add_argument("--md", type=Path, default=ROOT / "bench" / "results" / "pd_live.md")
    args = p.parse_args(argv)
    command = "nice -n 10 .venv/bin/python bench/pd/pd_live.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    trace = load_trace(str(args.trace))[: args.requests]
    t0 = time.monotonic()
    results: list[RunResult] = []
    for kv in args.kv_capacity_tokens:
        for flavor in args.flavors:
            for policy in args.policies:
                r = run_one(trace, args, kv, flavor, policy)
                results.append(r)
                print(
                    f"kv {kv:,} {flavor:<6} {policy:<11} ok {r.requests} errors {r.errors} "
                    f"prefill hit {100 * r.prefill_hit_rate:.2f}% decode "
                    f"{_split(r.decode_requests)} TTFT p50/p90 {r.ttft_p50:.2f}/{r.ttft_p90:.2f} s "
                    f"({r.wall_s:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                odd = {k: v for k, v in r.router_counters["cache_router_requests_total"].items()
                       if not k.startswith("2")}  # fmt: skip
                retries = r.router_counters["cache_router_retries_total"]
                for line in r.error_samples + r.log_warnings:
                    print(f"    {line}", file=sys.stderr)
                if odd or retries:
                    print(f"    router: non-2xx attempts {odd}, retries {retries}", file=sys.stderr)
    total = time.monotonic() - t0
    rows = verdicts(results)
    runs, bar = runs_table(results), bar_table(rows)
    print(runs + "\n\n" + bar)
    load = args.speedup / args.time_scale
    md = (
        f"# Issue 29's bar, live: {args.fleet[0]} prefill + {args.fleet[1]} decode sim workers "
        "behind the router\n\n"
        f"`{command.strip()}`; see its docstring for the setup. First {len(trace)} requests "
        f"of {args.trace.name}, arrivals x{args.speedup:g}, workers' time scale "
        f"{args.time_scale:g} (model-time load {load:g}x the trace's), outputs capped at "
        f"{args.max_output_tokens} tokens, a fresh fleet and router per row; {total:.0f} s.\n\n"
        f"{runs}\n\nBar: prefill hit rate of the default picker ({DEFAULT}) over "
        f"{BASELINE}'s (target >= {HIT_BAR}x), decode max/mean requests with the default "
        f"(target <= {DECODE_BAR}).\n\n{bar}\n"
    )
    warned = [r for r in results if r.log_warnings or r.error_samples]
    if warned:
        md += "\nLog warnings and error samples:\n\n"
        for r in warned:
            for line in r.error_samples + r.log_warnings:
                md += f"- {r.kv_capacity_tokens:,} {r.flavor} {r.policy}: `{line}`\n"
    args.md.write_text(md)
    doc = {
        "command": command.strip(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "requests": len(trace),
        "total_s": total,
        "runs": [asdict(r) for r in results],
        "bar": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

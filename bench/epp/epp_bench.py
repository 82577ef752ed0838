"""Envoy + `cache-router epp` against `serve` and against Envoy alone, on the same fast fake
workers, in one run: req/s and latency p50/p99 at each concurrency, non-streamed 2 KB
completions and streamed ones.

    python bench/epp/epp_bench.py [--duration 5] [--concurrency 1 32 128] \
        [--out bench/results/epp_bench.json]

Setups (each started fresh, measured one after another, cell by cell):

- ``envoy``: Envoy alone, a static cluster of one fake worker: what the gateway costs;
- ``envoy+epp``: the GIE-style gateway (router/epp/envoy_config.py: ext_proc with request
  headers and a BUFFERED body, response headers and a STREAMED body) asking one EPP process
  (plaintext); ``envoy+epp-none``: the same with response bodies not sent to the EPP (fewer
  gRPC messages: no usage read, the booking released at the stream's end);
  ``envoy+epp-lean``: the fewest messages a routing EPP can get (request headers and body;
  no response headers or body); ``envoy+epp-duplex``: the request body FULL_DUPLEX_STREAMED
  (Envoy sends it without waiting for the headers' answer: one wait fewer); ``envoy+epp-2p``:
  ``epp --processes 2`` (Envoy's connections to it at most 4 streams each, so they spread);
  ``envoy+floor-aio`` / ``envoy+floor-sync``: the lean modes asking bench/epp/ext_proc_floor.py,
  a grpcio server (asyncio / thread pool) that answers without any work: the ceiling of a
  Python picker on grpcio;
- ``serve``: one router process.

Envoy runs with ``--concurrency 1``; the load generator is closed-loop asyncio clients on
kept-alive connections (bench/proxy/connection_burst.py's). Loopback only; every process started
here is stopped by PID. On a 2-core machine everything shares the cores: compare the setups
with each other, in one run, not with figures taken elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router.epp.envoy_config import envoy_binary, gateway_config  # noqa: E402
from router.service.supervisor import end_process  # noqa: E402
from traces.live.fleet import free_port, wait_port  # noqa: E402

FAKE_WORKER = ROOT.parent / "shared" / "bench" / "fake_worker.py"
PROMPT = "You are a helpful assistant. Summarize the following text. " * 32  # about 2 KB
STATIC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


class Procs:
    """Processes started here, stopped by PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=out)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            end_process(proc, 10.0)
        self.procs.clear()


def envoy_alone_config(port: int, admin_port: int, worker_port: int) -> dict:
    """Envoy with one static upstream: the gateway's own cost."""
    config = gateway_config(port, admin_port, 1)
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["http_filters"] = [
        {"name": "envoy.filters.http.router", "typed_config": {"@type": STATIC_TYPE}}
    ]
    route = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    route["cluster"] = "worker"
    config["static_resources"]["clusters"] = [{
        "name": "worker", "type": "STATIC", "connect_timeout": "5s",
        "load_assignment": {"cluster_name": "worker", "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": worker_port}}}}]}]},
    }]  # fmt: skip
    return config


def start_envoy(procs: Procs, folder: Path, config: dict, name: str) -> tuple[str, int]:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    admin = config["admin"]["address"]["socket_address"]["port_value"]
    port = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    procs.start(
        [envoy_binary(), "-c", str(path), "--concurrency", "1", "--log-level", "error",
         "--base-id", str(admin)],
        folder / f"{name}.log",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{admin}/ready")
    return f"http://127.0.0.1:{port}", port


async def _client(port: int, body: bytes, until: float, out: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        while time.perf_counter() < until:
            start = time.perf_counter()
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
            await _read_body(reader, head)
            out.append(time.perf_counter() - start)
    finally:
        writer.close()


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> None:
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
            return


def measure(port: int, concurrency: int, duration: float, stream: bool) -> dict:
    body = json.dumps({"model": "fake-model", "prompt": PROMPT, "max_tokens": 16,
                       "stream": stream}).encode()  # fmt: skip
    latencies: list[float] = []

    async def run() -> None:
        await asyncio.gather(*(_client(port, body, time.perf_counter() + 0.5, []) for _ in
                               range(min(concurrency, 8))))  # fmt: skip  # warm-up
        until = time.perf_counter() + duration
        await asyncio.gather(*(_client(port, body, until, latencies) for _ in range(concurrency)))

    import uvloop

    uvloop.run(run())
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "req_s": round(n / duration, 1),
        "p50_ms": round(latencies[n // 2] * 1000, 3),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1000, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--setups", nargs="+", default=["envoy", "envoy+epp", "envoy+epp-none",
                                                   "envoy+epp-2p", "serve"])  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="epp-bench-"))
    procs = Procs()
    results: list[dict] = []
    try:
        workers = [free_port(), free_port()]
        for port in workers:
            procs.start([sys.executable, str(FAKE_WORKER), "--port", str(port)],
                        folder / f"worker{port}.log")  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/health")
        urls = [f"http://127.0.0.1:{p}" for p in workers]
        for setup in args.setups:
            setup_procs = Procs()
            try:
                port = _start_setup(setup, setup_procs, folder, urls, workers)
                for stream in (False, True):
                    for c in args.concurrency:
                        row = {"setup": setup, "stream": stream, "concurrency": c,
                               **measure(port, c, args.duration, stream)}  # fmt: skip
                        results.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                setup_procs.stop()
    finally:
        procs.stop()
    if args.out is not None:
        args.out.write_text(json.dumps({"duration_s": args.duration, "results": results},
                                       indent=1) + "\n")  # fmt: skip
    return 0


def _start_setup(
    setup: str, procs: Procs, folder: Path, urls: list[str], workers: list[int]
) -> int:
    cli = [str(Path(sys.executable).parent / "cache-router")]
    quiet = ["--log-level", "warning"]
    if setup == "envoy":
        port, admin = free_port(), free_port()
        return start_envoy(procs, folder, envoy_alone_config(port, admin, workers[0]), setup)[1]
    if setup == "serve":
        port = free_port()
        procs.start([*cli, "serve", "--port", str(port), "--worker", *urls, *quiet],
                    folder / "serve.log")  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/health")
        return port
    grpc_port, http_port = free_port(), free_port()
    if setup.startswith("envoy+floor-"):  # grpcio with no picker behind it (its docstring)
        procs.start([sys.executable, str(Path(__file__).with_name("ext_proc_floor.py")), "--port",
                     str(grpc_port), "--endpoint", f"127.0.0.1:{workers[0]}", "--server",
                     setup.removeprefix("envoy+floor-")], folder / f"{setup}.log")  # fmt: skip
        wait_port(grpc_port, 30.0)
        port, admin = free_port(), free_port()
        lean = {"response_body": "NONE", "response_headers": "SKIP"}
        return start_envoy(procs, folder, gateway_config(port, admin, grpc_port, **lean), setup)[1]
    processes = ["--processes", "2"] if setup.endswith("-2p") else []
    procs.start([*cli, "epp", "--worker", *urls, "--port", str(grpc_port), "--http-port",
                 str(http_port), "--plaintext", *processes, *quiet],
                folder / f"{setup}.log")  # fmt: skip
    wait_http(f"http://127.0.0.1:{http_port}/health")
    modes = {
        "envoy+epp-none": {"response_body": "NONE"},
        "envoy+epp-lean": {"response_body": "NONE", "response_headers": "SKIP"},
        "envoy+epp-duplex": {"request_body": "FULL_DUPLEX_STREAMED"},
    }.get(setup, {})
    port, admin = free_port(), free_port()
    streams = 4 if processes else 16  # several connections to spread over the processes
    config = gateway_config(port, admin, grpc_port, max_streams=streams, **modes)
    return start_envoy(procs, folder, config, setup)[1]


if __name__ == "__main__":
    raise SystemExit(main())

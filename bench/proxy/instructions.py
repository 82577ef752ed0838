"""User-space instructions per request of the router, under callgrind: the figure that holds
(to 1-2%) on a shared, noisy machine where req/s and CPU time move by 10-20% from run to run.

For each checkout given, the router (``cache-router serve`` with that checkout first on
PYTHONPATH) runs under ``valgrind --tool=callgrind`` twice, once for ``--small`` and once for
``--large`` closed-loop 2 KB completions at ``--concurrency``, against two fast fake workers
(../shared/bench/fake_worker.py); the difference of the two totals over the difference in
requests cancels startup, whose count moves by tens of millions between runs. Same settings
for every checkout, so the shadows grow the same way. Loopback only; every process it starts
is stopped by PID.

    python bench/proxy/instructions.py --checkout before=/path/to/old/checkout --checkout after=.
    # before  414.8k instructions per request      (bbd917d)
    # after   384.7k instructions per request (-7.3%)   (afdd640)

Needs valgrind (Debian package). About 3 minutes per checkout at the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from connection_burst import complete  # bench/proxy/, the script's own directory, is on sys.path

HERE = Path(__file__).resolve().parent
FAKE_WORKER = HERE.parents[2] / "shared" / "bench" / "fake_worker.py"
PROMPT = "You are a helpful assistant. Summarize the following text. " * 32  # about 2 KB


async def drive(port: int, requests: int, concurrency: int) -> None:
    """``requests`` completions over ``concurrency`` keep-alive connections, closed loop."""
    left = list(range(requests))

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while left:
                i = left.pop()
                body = b'{"model": "fake-model", "max_tokens": 16, "prompt": "%d %s"}' % (
                    i,
                    PROMPT.encode(),
                )
                head = await complete(reader, writer, body, timeout=60)
                if not head.startswith(b"HTTP/1.1 200") or b"content-length" not in head.lower():
                    raise RuntimeError(f"expected a 200 with a content-length: {head[:60]!r}")
        finally:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(concurrency)))


def wait_ready(url: str, timeout_s: float, process: subprocess.Popen) -> None:
    """Until ``url`` answers 200; fails at once if ``process`` (the one serving it) exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:6]} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:g} s")


def instructions(checkout: Path, requests: int, args: argparse.Namespace, workers: list[str]):
    """Total instructions of one router run serving ``requests`` requests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        router = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "router.cli",
                "serve",
                "--port",
                str(args.port),
                "--worker",
                *workers,
                "--log-level",
                "warning",
                *args.serve_args.split(),
            ],
            env=env,
            cwd=checkout,  # python -m puts the working directory first on sys.path
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(f"http://127.0.0.1:{args.port}/health", 300, router)
            asyncio.run(drive(args.port, requests, args.concurrency))
        finally:
            router.send_signal(signal.SIGINT)
            try:
                router.wait(120)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
        if totals is None:
            raise RuntimeError("callgrind wrote no totals")
        return int(totals.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", required=True, help="name=path")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=4200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--port", type=int, default=19190)
    parser.add_argument("--worker-ports", type=int, nargs=2, default=[19031, 19032])
    parser.add_argument(
        "--serve-args",
        default="",
        help="more `serve` options, the same for every checkout (e.g. '--cost-profile flat', "
        "to compare a checkout whose default differs)",
    )
    args = parser.parse_args()
    workers = [f"http://127.0.0.1:{p}" for p in args.worker_ports]
    fakes = [
        subprocess.Popen(
            [sys.executable, str(FAKE_WORKER), "--port", str(p)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in args.worker_ports
    ]
    try:
        for url, fake in zip(workers, fakes, strict=True):
            wait_ready(url + "/health", 30, fake)
        first = None
        for spec in args.checkout:
            name, _, path = spec.partition("=")
            checkout = Path(path).resolve()
            small = instructions(checkout, args.small, args, workers)
            large = instructions(checkout, args.large, args, workers)
            per_request = (large - small) / (args.large - args.small)
            change = f" ({per_request / first - 1:+.1%})" if first else ""
            first = first or per_request
            print(f"{name}\t{per_request / 1000:.1f}k instructions per request{change}", flush=True)
    finally:
        for fake in fakes:
            fake.terminate()
            fake.wait(10)


if __name__ == "__main__":
    main()

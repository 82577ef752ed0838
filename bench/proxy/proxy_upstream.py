#!/usr/bin/env python3
"""The proxy's worker client against httpx: requests/s and latency, one core, one worker.

Why the proxy has its own HTTP/1.1 client (router/fleet/upstream.py): this measures the two on
the same exchange the proxy makes (POST a 2 KB completion, read the whole answer) against
an instant fake worker, sequentially and at concurrency 32.

    python ../shared/bench/fake_worker.py --port 18001 &   # /work/shared/bench/fake_worker.py
    taskset -c 0 python bench/proxy/proxy_upstream.py http://127.0.0.1:18001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import uvloop

from router.fleet.upstream import UpstreamPool

BODY = json.dumps({"model": "fake-model", "prompt": "x" * 2000, "max_tokens": 16}).encode()
HEADERS = {"content-type": "application/json"}


async def ours(url: str, n: int, concurrency: int) -> list[float]:
    pool = UpstreamPool(url)
    lat: list[float] = []

    async def one() -> None:
        t = time.perf_counter()
        conn = await pool.request(
            b"POST", b"/v1/completions", b"content-type: application/json\r\n", BODY, 10
        )
        more = True
        while more:
            _, more = await conn.read(10)
        conn.release()
        lat.append(time.perf_counter() - t)

    await _drive(one, n, concurrency)
    pool.close()
    return lat


async def with_httpx(url: str, n: int, concurrency: int) -> list[float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    lat: list[float] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as client:

        async def one() -> None:
            t = time.perf_counter()
            async with client.stream(
                "POST", "/v1/completions", content=BODY, headers=HEADERS
            ) as response:
                async for _ in response.aiter_raw():
                    pass
            lat.append(time.perf_counter() - t)

        await _drive(one, n, concurrency)
    return lat


async def _drive(one, n: int, concurrency: int) -> None:
    remaining = n

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    await asyncio.gather(*(loop() for _ in range(concurrency)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("-n", type=int, default=5000)
    args = ap.parse_args()
    print("client\tconcurrency\treq/s\tp50_us\tp99_us")
    for name, fn in (("router.fleet.upstream", ours), ("httpx", with_httpx)):
        for concurrency in (1, 32):
            uvloop.run(fn(args.url, 200, concurrency))  # warm up
            t = time.perf_counter()
            lat = sorted(uvloop.run(fn(args.url, args.n, concurrency)))
            rps = args.n / (time.perf_counter() - t)
            p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
            print(f"{name}\t{concurrency}\t{rps:.0f}\t{p50:.0f}\t{p99:.0f}")


if __name__ == "__main__":
    main()

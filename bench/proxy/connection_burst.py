"""A burst of new client connections on a busy router: how long each one's first request takes.

Opens ``--connections`` keep-alive connections at once and sends 2 KB completions on each,
closed loop, for ``--duration`` seconds; run it a few times in a row against the same router
(the second burst meets a router still busy with the first's aftermath). Prints the latency
percentiles, then the first requests that took over ``--slow-ms``: a router whose loop accepts
one connection per iteration (uvloop's own servers) shows them climbing connection after
connection; ``router/service/accept.py`` is the fix. Loopback only.

    # router on core 0, two fake workers (../shared/bench/fake_worker.py) on core 1
    for r in 1 2 3; do
      taskset -c 1 python bench/proxy/connection_burst.py --url http://127.0.0.1:8000
    done
"""

from __future__ import annotations

import argparse
import asyncio
import time
from urllib.parse import urlsplit

BODY = '{"model": "fake-model", "max_tokens": 16, "prompt": "%s request %d of connection %d"}'
FILLER = "the quick brown fox jumps over the lazy dog " * 45  # about 2 KB


async def complete(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, timeout: float = 30
) -> bytes:
    """One completion on a kept-alive connection, its answer read whole (a content-length
    response); returns the response head."""
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await asyncio.wait_for(reader.readexactly(length), timeout)
    return head


async def connection(host: str, port: int, cid: int, until: float, t0: float, out: list) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while time.perf_counter() < until:
            body = (BODY % (FILLER, i, cid)).encode()
            start = time.perf_counter()
            await complete(reader, writer, body)
            out.append((cid, i, start - t0, (time.perf_counter() - start) * 1000))
            i += 1
    finally:
        writer.close()


async def burst(url: str, connections: int, duration: float) -> list[tuple[int, int, float, float]]:
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("loopback only")
    out: list[tuple[int, int, float, float]] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            connection(parts.hostname, parts.port or 80, c, t0 + duration, t0, out)
            for c in range(connections)
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--connections", type=int, default=128)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--slow-ms", type=float, default=150.0)
    args = parser.parse_args()
    records = asyncio.run(burst(args.url, args.connections, args.duration))
    latency = sorted(r[3] for r in records)
    if not latency:
        raise SystemExit("no request completed")
    p50, p99 = latency[len(latency) // 2], latency[int(len(latency) * 0.99)]
    print(f"{len(records)} requests: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {latency[-1]:.1f} ms")
    slow = sorted((r for r in records if r[3] > args.slow_ms), key=lambda r: r[2])
    firsts = [r for r in slow if r[1] == 0]
    print(f"over {args.slow_ms:g} ms: {len(slow)}, of them first requests of a connection: "
          f"{len(firsts)}")  # fmt: skip
    for cid, _, _, ms in firsts[:20]:
        print(f"  connection {cid}: first request {ms:.0f} ms")


if __name__ == "__main__":
    main()

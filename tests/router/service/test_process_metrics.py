"""/metrics across processes (router/service/process_metrics.py): siblings answer over real unix
sockets; the merged exposition parses, keeps every family whole, labels every sample with its
process, and leaves out a sibling that is gone."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.service.process_metrics import gather


def exposition(requests: int, latencies: list[float]) -> bytes:
    registry = CollectorRegistry()
    counter = Counter("cache_router_requests", "Requests", ["worker"], registry=registry)
    counter.labels("w1").inc(requests)
    histogram = Histogram("cache_router_pick_duration_seconds", "Pick", registry=registry)
    for value in latencies:
        histogram.observe(value)
    return generate_latest(registry)


async def serve_exposition(path: Path, body: bytes) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        assert request.startswith(b"GET /metrics?scope=process ")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, str(path))


def test_every_process_is_in_one_exposition_and_a_gone_one_is_left_out(tmp_path):
    stale = socket.socket(socket.AF_UNIX)  # a dead sibling's socket file: nobody listens
    stale.bind(str(tmp_path / "2.sock"))
    stale.close()

    async def main() -> bytes:
        sibling = await serve_exposition(tmp_path / "1.sock", exposition(5, [0.001, 0.2]))
        async with sibling:
            return await gather(tmp_path / "0.sock", exposition(3, [0.002]))

    text = asyncio.run(main()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["process"]: s.value for s in families["cache_router_requests"].samples
                if s.name.endswith("_total")}  # fmt: skip
    assert requests == {"0": 3.0, "1": 5.0}
    counts = {s.labels["process"]: s.value
              for s in families["cache_router_pick_duration_seconds"].samples
              if s.name.endswith("_count")}  # fmt: skip
    assert counts == {"0": 1.0, "1": 2.0}
    assert families["cache_router_metrics_processes"].samples[0].value == 2
    assert text.count("# TYPE cache_router_requests_total counter") == 1  # one family, whole

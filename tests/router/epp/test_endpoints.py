"""Worker addresses for the gateway: IP URLs as they are, host names resolved off the request
path (the system resolver on this machine: ``localhost``), names that do not resolve left
out until they do, workers that left forgotten."""

from __future__ import annotations

import asyncio
import logging

from router.config import load_settings
from router.epp.endpoints import Endpoints, address
from router.fleet.pool import WorkerPool


def pool_of(*urls: str) -> WorkerPool:
    return WorkerPool(load_settings(workers=list(urls), log_level="warning"))


def test_addresses_and_ports() -> None:
    ip, named = (w.upstream for w in pool_of("http://10.0.0.5:8000", "https://vllm-0.vllm").workers)
    assert (ip.host, ip.port) == ("10.0.0.5", 8000)  # the worker's own host and port
    assert (named.host, named.port) == ("vllm-0.vllm", 443)
    assert address("10.0.0.5", 8000) == "10.0.0.5:8000"
    assert address("fd00::5", 8000) == "[fd00::5]:8000"
    assert address("vllm-0.vllm", 8000) is None


async def test_ip_urls_at_once_host_names_once_resolved(caplog) -> None:
    pool = pool_of("http://127.0.0.1:8001", "http://[::1]:8002", "http://localhost:8003",
                   "http://no-such-worker.invalid:8004")  # fmt: skip
    ip4, ip6, named, missing = pool.workers
    endpoints = Endpoints(60.0)
    assert endpoints.of(ip4) == "127.0.0.1:8001"
    assert endpoints.of(ip6) == "[::1]:8002"
    assert endpoints.of(named) is None  # resolving in the background now
    for _ in range(200):
        if endpoints.of(named) is not None:
            break
        await asyncio.sleep(0.01)
    assert endpoints.of(named) == "127.0.0.1:8003"  # IPv4 preferred
    with caplog.at_level(logging.WARNING, logger="cache_router.epp"):
        await endpoints.refresh(pool.workers)
    assert endpoints.of(missing) is None
    assert "no-such-worker.invalid" in caplog.text
    pool.remove(named.url)
    await endpoints.refresh(pool.workers)
    assert named.url not in endpoints._by_url  # a worker that left is forgotten
    assert endpoints.of(ip4) == "127.0.0.1:8001"


async def test_run_resolves_the_pool_each_interval() -> None:
    pool = pool_of("http://localhost:8003")
    endpoints = Endpoints(0.05)
    task = asyncio.get_running_loop().create_task(endpoints.run(pool))
    try:
        for _ in range(200):
            if endpoints._by_url:
                break
            await asyncio.sleep(0.01)
        assert endpoints._by_url == {"http://localhost:8003": "127.0.0.1:8003"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

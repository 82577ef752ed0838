"""No reference cycles on the request paths: what a request leaves behind is freed by
reference counting alone.

Why it matters: `cache-router serve` tunes the garbage collector down (router/service/command.py:
frozen startup heap, rare collections), so a cycle formed by a long-lived object, such as a
keep-alive connection to a worker, lands in the oldest generation and is practically never
collected. The 10-minute soak (bench/reliability/soak.py) found exactly that: every upstream
connection the router aborted when a client hung up stayed in memory (the connection and its HTTP
parser referenced each other), ~1 MB a minute at 13 disconnects a second; and a connect
cancelled just after it succeeded (a client gone that early) left the socket open until a
collection, since uvloop then never calls ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from collections import Counter
from collections.abc import Iterator

import pytest
from streams import stream

from router.fleet.upstream import UpstreamPool


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Automatic collections off for the test (process-wide), restored after."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


async def test_an_aborted_worker_connection_is_freed_without_the_gc(fake_workers, no_gc):
    (worker,) = fake_workers(1, chunks=50, chunk_delay=0.05)
    pool = UpstreamPool(worker.url)
    body = b'{"model": "fake-model", "stream": true, "prompt": "hi"}'
    conn = await pool.request(b"POST", b"/v1/completions", b"", body, 5)
    await conn.read(5)
    ref = weakref.ref(conn)
    conn.abort()
    await asyncio.sleep(0.1)  # connection_lost runs
    del conn
    assert ref() is None
    pool.close()


async def test_requests_and_hang_ups_leave_no_router_garbage(fake_workers, router_server, no_gc):
    (worker,) = fake_workers(1, delay=0.02, chunks=6, chunk_delay=0.01)
    router = router_server(workers=[worker.url])
    rng = random.Random(3)
    body = {"model": "fake-model", "stream": True, "prompt": "hello " * 200}

    async def one(i: int):
        if i % 3 == 0:
            return await stream(router.port, "/v1/completions", body)
        if i % 3 == 1:
            n = rng.randint(1, 3)
            return await stream(router.port, "/v1/completions", body, hang_up_after_events=n)
        # gone within 20 ms: while the router connects to the worker, or just after
        wait = rng.uniform(0, 0.02)
        return await stream(router.port, "/v1/completions", body, hang_up_after_s=wait)

    router.call(gc.collect)
    gc.set_debug(gc.DEBUG_SAVEALL)
    sem = asyncio.Semaphore(16)

    async def guarded(i: int):
        async with sem:
            return await one(i)

    await asyncio.gather(*(guarded(i) for i in range(300)))
    await asyncio.sleep(0.5)
    router.call(gc.collect)
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    # the router's own objects; the test client and the fake worker have cycles of their own
    ours = {
        k: n
        for k, n in kinds.items()
        if k.startswith(("router.", "uvicorn."))
        or k in ("httptools.parser.parser.HttpResponseParser", "uvloop.TCPTransport")
    }
    assert ours == {}, ours

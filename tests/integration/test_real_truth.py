"""Worker truth against real vLLM: the router scrapes each worker's /metrics, shows the figures
in ``GET /workers`` and its own ``cache_router_worker_*`` metrics, and sizes the shadows from
the worker's real KV capacity (``vllm:cache_config_info``)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from realworkers_support import (
    ENABLED,
    SKIP_REASON,
    complete,
    routed,
    text,
    unique,
    wait_until,
    worker_reading,
    workers_of,
)

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)


def router_gauges(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in family.samples:
            out[(s.name, s.labels.get("worker", ""))] = s.value
    return out


def test_worker_figures_and_capacity(real_workers) -> None:
    args = ("--worker-metrics-interval-s", "0.3", "--shadow-capacity-from-worker")
    with routed(real_workers.urls, "round_robin", *args) as svc:
        described = wait_until(
            lambda: (
                (w := workers_of(svc.url))
                and all(e["worker_metrics"]["scrapes"] >= 1 for e in w.values())
                and w
            ),
            what="a scrape of every worker",
        )
        capacity = real_workers.capacity_tokens
        for entry in described.values():
            truth = entry["worker_metrics"]
            assert truth["block_size"] == real_workers.block_size
            assert truth["kv_capacity_tokens"] == capacity
            assert truth["num_gpu_blocks"] == capacity // real_workers.block_size
            # the shadows: 512-token blocks and a radix tree, both sized to the real capacity
            assert entry["kv_capacity_tokens"] == capacity
            assert entry["shadow_capacity_blocks"] == capacity // 512
            assert entry["radix_capacity_tokens"] == capacity

        prompt = unique("truth") + text(3000, 4000)
        for _ in range(len(real_workers.urls)):  # round robin: one each
            complete(svc.url, prompt)
        for url in real_workers.urls:
            own = worker_reading(url)

            def caught_up(url: str = url, own=own) -> bool:
                g = router_gauges(svc.url)
                return (
                    g.get(("cache_router_worker_prefix_cache_queries_total", url))
                    == own.prefix_cache_queries
                    and g.get(("cache_router_worker_prefix_cache_hits_total", url))
                    == own.prefix_cache_hits
                )

            wait_until(caught_up, timeout=10, what=f"the router's copy of {url}'s counters")
        g = router_gauges(svc.url)
        for url in real_workers.urls:
            assert g[("cache_router_worker_kv_capacity_tokens", url)] == capacity
            assert g[("cache_router_worker_requests_running", url)] == 0
            assert 0 <= g[("cache_router_worker_kv_cache_usage_ratio", url)] <= 1
            assert 0 < g[("cache_router_worker_prefix_cache_hit_rate", url)] <= 1


def test_tiny_model_is_built_deterministically(real_workers, tmp_path) -> None:
    """setup.sh's model build (bench/real_workers/make_tiny_model.py) gives the same files
    again: seeded weights, a BPE tokenizer trained on sorted standard-library sources."""
    import hashlib
    import os
    import subprocess

    from realworkers_support import SCRIPTS

    python = real_workers.model.parent / "venv" / "bin" / "python"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(
        [str(python), str(SCRIPTS / "make_tiny_model.py"), "--out", str(tmp_path / "again")],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    for name in ("tokenizer.json", "model.safetensors", "chat_template.jinja", "config.json"):
        digests = {
            hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for folder in (real_workers.model, tmp_path / "again")
        }
        assert len(digests) == 1, name

"""SGLang's /metrics names read into the same WorkerTruth as vLLM's."""

from pathlib import Path

import pytest

from router.fleet.worker_truth import WorkerTruth, parse_worker_metrics

SAMPLE = Path(__file__).parent / "data" / "sglang_metrics.txt"  # see data/SOURCE.md

NEWER = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
sglang:token_usage{model_name="m",tp_rank="1"} 0.3
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 262144.0
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{mode="prefill_cache",model_name="m"} 900.0
sglang:realtime_tokens_total{mode="prefill_compute",model_name="m"} 100.0
sglang:realtime_tokens_total{mode="decode",model_name="m"} 5000.0
"""


def test_real_sglang_sample():
    r = parse_worker_metrics(SAMPLE.read_text())
    assert r.engine == "sglang"
    assert r.running == 162.0 and r.waiting == 2826.0
    assert r.kv_cache_usage == pytest.approx(0.28)
    assert r.capacity_tokens == round(123859 / 0.28)  # num_used_tokens / token_usage
    assert r.block_size is None  # SGLang pages are tokens
    truth = WorkerTruth(reading=r)
    assert truth.hit_rate == pytest.approx(0.007507552643049313)  # the gauge, no counters
    assert truth.describe()["engine"] == "sglang"


def test_newer_sglang_counters_and_pool():
    r = parse_worker_metrics(NEWER)
    assert r.running == 5.0 and r.waiting == 4.0
    assert r.kv_cache_usage == pytest.approx(0.4)  # averaged over ranks
    assert r.capacity_tokens == 262144
    assert r.prefix_cache_hits == 900.0 and r.prefix_cache_queries == 1000.0
    assert WorkerTruth(reading=r).hit_rate == pytest.approx(0.9)


def test_vllm_page_still_reads_as_vllm():
    page = 'vllm:num_requests_running{engine="0"} 2.0\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    r = parse_worker_metrics(page)
    assert r.engine == "vllm" and r.running == 2.0 and r.kv_cache_usage == 0.5

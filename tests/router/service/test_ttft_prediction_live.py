"""The router's TTFT prediction, live: a sim worker priced by a GPU profile, ``serve`` with
the same ``--cost-profile``; ``/metrics`` scores each streamed answer against it."""

from __future__ import annotations

import httpx
import pytest

from traces.commands.run_sweep import router_prediction_errors
from traces.live.fleet import router as start_router
from traces.live.fleet import scrape, sim_workers

PROFILE = ["--gpu-profile", "h100-llama8b"]
PROMPTS = 4


@pytest.fixture(scope="module")
def worker() -> list:
    with sim_workers(1, [*PROFILE, "--kv-capacity-tokens", "262144"]) as started:
        yield started


def stream(url: str, ids: list[int]) -> None:
    body = {"model": "sim-model", "prompt": ids, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for _ in r.iter_bytes():
            pass


def test_streamed_answers_score_the_prediction_in_metrics(worker: list) -> None:
    url = worker[0].url
    httpx.post(url + "/reset_prefix_cache", timeout=10).raise_for_status()
    args = ["--cost-profile", "h100-llama8b", "--log-level", "warning"]
    with start_router([url], "ttft", args) as router:
        for k in range(PROMPTS):  # 16k-token prompts, one at a time: about 0.4 s each
            stream(router.url, [1000 * k + i % 997 + 1 for i in range(16_384)])
        samples = scrape(router.url)
        count = [s for s in samples if s.name == "cache_router_ttft_prediction_error_ratio_count"]
        assert [(s.labels["worker"], s.value) for s in count] == [(url, PROMPTS)]
        value = {s.name: s.value for s in samples}
        predicted = value["cache_router_ttft_predicted_seconds_total"]
        observed = value["cache_router_ttft_observed_seconds_total"]
        assert predicted > 0 and observed > 0
        # the worker runs the profile the router prices with: the prediction is close to
        # what it takes (loosely: the test machine's own delays come on top)
        assert 0.5 < observed / predicted < 2.0
        assert value["cache_router_worker_cost_correction"] > 0
        errors = router_prediction_errors(router.url)  # what replay and sweep report
        assert errors["ttft_pred_requests"] == PROMPTS
        assert errors["ttft_pred_bias"] == pytest.approx(predicted / observed)
        assert 0 <= errors["ttft_pred_mdape"] <= 2.0  # the median, from the buckets


def test_with_engine_priority_the_prediction_scored_is_in_the_engines_order() -> None:
    # a worker that runs priority scheduling, and a router that sets the priorities
    with sim_workers(1, [*PROFILE, "--kv-capacity-tokens", "262144", "--scheduling-policy",
                         "priority"]) as started:  # fmt: skip
        url = started[0].url
        args = ["--cost-profile", "h100-llama8b", "--engine-priority", "--log-level", "warning"]
        with start_router([url], "ttft", args) as router:
            for k in range(PROMPTS):
                stream(router.url, [1000 * k + i % 997 + 1 for i in range(16_384)])
            value = {s.name: s.value for s in scrape(router.url)}
    assert value["cache_router_ttft_prediction_error_ratio_count"] == PROMPTS
    predicted = value["cache_router_ttft_predicted_seconds_total"]
    observed = value["cache_router_ttft_observed_seconds_total"]
    assert 0.5 < observed / predicted < 2.0  # one at a time: its own prefill, in order
    assert value["cache_router_worker_engine_order_correction"] > 0

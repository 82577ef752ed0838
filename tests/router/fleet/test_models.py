"""Model-aware routing: each worker's models from its /v1/models (or pinned), requests only to
workers that serve their model, the router's own 404 for a model nobody serves, adapters'
prefix caches kept apart, and counters by model."""

from __future__ import annotations

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.cache.features import RequestFeatures
from router.config import load_settings
from router.fleet.models import parse_models
from router.fleet.pool import ModelNotServed, WorkerPool
from tests.router.conftest import wait_until

BASE_A = [{"id": "model-a", "object": "model", "parent": None}]
WITH_ADAPTERS = [
    {"id": "model-b", "object": "model", "parent": None, "root": "/m/b"},
    {"id": "lora-1", "object": "model", "parent": "model-b", "root": "/a/1"},
    {"id": "lora-2", "object": "model", "parent": "model-b", "root": "/a/2"},
]


def test_parse_models_reads_ids_and_adapters_by_parent() -> None:
    models, adapters = parse_models(orjson.dumps({"object": "list", "data": WITH_ADAPTERS}))
    assert models == {"model-b", "lora-1", "lora-2"}
    assert adapters == {"lora-1", "lora-2"}
    assert parse_models(b"not json") is None
    assert parse_models(b'{"data": 3}') is None
    assert parse_models(b'{"data": [{"id": 1}, "x", {"id": "ok"}]}') == ({"ok"}, frozenset())


def _pool(**values) -> WorkerPool:
    return WorkerPool(load_settings(**values))


def test_pool_picks_only_workers_that_serve_the_model() -> None:
    pool = _pool(workers=["http://a:1", "http://a:2", "http://b:1"], policy="round_robin")
    a1, a2, b1 = pool.workers
    pool.set_models(a1, frozenset({"model-a"}), frozenset())
    pool.set_models(a2, frozenset({"model-a"}), frozenset())
    pool.set_models(b1, frozenset({"model-b", "lora-1"}), frozenset({"lora-1"}))
    assert pool.adapter_names == {"lora-1"}
    for model, allowed in (("model-a", {a1, a2}), ("model-b", {b1}), ("lora-1", {b1})):
        request = RequestFeatures(blocks=[], input_length=10, model=model)
        chosen = {pool.pick(request)[0] for _ in range(6)}
        assert chosen == allowed
    with pytest.raises(ModelNotServed):
        pool.pick(RequestFeatures(blocks=[], input_length=10, model="nope"))
    # no model named: any worker, as before
    chosen = {pool.pick(RequestFeatures(blocks=[], input_length=10))[0] for _ in range(6)}
    assert chosen == {a1, a2, b1}


def test_a_worker_whose_models_are_unknown_may_serve_any_until_read() -> None:
    pool = _pool(workers=["http://a:1", "http://x:1"], policy="round_robin")
    a1, unknown = pool.workers
    pool.set_models(a1, frozenset({"model-a"}), frozenset())
    request = RequestFeatures(blocks=[], input_length=10, model="model-z")
    assert {pool.pick(request)[0] for _ in range(4)} == {unknown}
    pool.set_models(unknown, frozenset({"model-b"}), frozenset())
    with pytest.raises(ModelNotServed):
        pool.pick(request)


def test_pinned_models_are_kept_and_the_first_is_the_base() -> None:
    pool = _pool(workers=["http://a:1"], worker_models={"http://a:1": "base,ad-1,ad-2"})
    (w,) = pool.workers
    assert w.models == {"base", "ad-1", "ad-2"} and w.adapters == {"ad-1", "ad-2"}
    assert not pool.set_models(w, frozenset({"other"}), frozenset())  # pinned: not replaced
    assert w.models == {"base", "ad-1", "ad-2"}


def test_model_views_follow_membership_and_health() -> None:
    pool = _pool(workers=["http://a:1", "http://b:1"], policy="round_robin")
    a1, b1 = pool.workers
    pool.set_models(a1, frozenset({"model-a"}), frozenset())
    pool.set_models(b1, frozenset({"model-b"}), frozenset())
    request = RequestFeatures(blocks=[], input_length=10, model="model-a")
    assert pool.pick(request)[0] is a1
    a2 = pool.add("http://a:2")
    pool.set_models(a2, frozenset({"model-a"}), frozenset())
    pool.take_out(a1, "test")
    assert {pool.pick(request)[0] for _ in range(4)} == {a2}
    pool.remove(a2.url)
    from policies.base import NoHealthyWorker

    with pytest.raises(NoHealthyWorker):  # served, but by no healthy worker: a 503, not a 404
        pool.pick(request)


def _metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_requests_reach_only_workers_serving_their_model(fake_workers, router_server) -> None:
    a1, a2, b1, b2 = fake_workers(4)
    for w in (a1, a2):
        w.models = BASE_A
    for w in (b1, b2):
        w.models = WITH_ADAPTERS
    srv = router_server(workers=[w.url for w in (a1, a2, b1, b2)], models_interval_s=0.2)
    assert wait_until(lambda: len(httpx.get(srv.url + "/workers").json()[3]["models"] or []) == 3)
    counts = {}
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        for i in range(40):
            model = ("model-a", "model-b", "lora-1", "lora-2")[i % 4]
            body = {"model": model, "prompt": f"session {i % 8} " * 40, "max_tokens": 2}
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            counts[model, r.headers["x-cache-router-worker"]] = 1
        missing = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert error["code"] == "model_not_found" and "gpt-9" in error["message"]
        listed = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert listed == {"model-a", "model-b", "lora-1", "lora-2"}
    for model, worker in counts:
        assert (worker in (a1.url, a2.url)) == (model == "model-a")
    metrics = _metrics(srv.url)
    assert (
        metrics["cache_router_model_requests_total", (("model", "lora-1"), ("status", "200"))] == 10
    )
    assert (
        metrics["cache_router_model_requests_total", (("model", "model-a"), ("status", "200"))]
        == 10
    )
    assert (
        metrics[
            "cache_router_requests_total",
            (("policy", "ttft"), ("status", "404"), ("worker", "none")),
        ]
        == 1
    )
    key = (
        "cache_router_worker_model",
        (("kind", "adapter"), ("model", "lora-2"), ("worker", b1.url)),
    )
    assert metrics[key] == 1


def test_the_empty_model_is_a_model_nobody_serves(fake_workers, router_server) -> None:
    """``"model": ""`` is the router's 404, as vLLM answers it, not passed to a worker."""
    (worker,) = fake_workers(1)
    worker.models = BASE_A
    srv = router_server(workers=[worker.url], models_interval_s=0.2)
    assert wait_until(lambda: httpx.get(srv.url + "/workers").json()[0]["models"] == ["model-a"])
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        for path, body in [
            ("/v1/chat/completions", {"model": "", "messages": [{"role": "user", "content": "x"}]}),
            ("/v1/completions", {"model": "", "prompt": "hi"}),
            ("/v1/responses", {"model": "", "input": "hi"}),
            ("/v1/embeddings", {"model": "", "input": "hi"}),
        ]:
            r = client.post(path, json=body)
            assert r.status_code == 404, (path, r.text)
            assert "x-cache-router-worker" not in r.headers  # the router's own answer
            assert r.json()["error"] == {
                "message": "The model `` does not exist (no worker serves it).",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 200


def test_a_huge_model_name_is_not_echoed_whole(fake_workers, router_server) -> None:
    (worker,) = fake_workers(1)
    worker.models = BASE_A
    srv = router_server(workers=[worker.url], models_interval_s=0.2)
    assert wait_until(lambda: httpx.get(srv.url + "/workers").json()[0]["models"] == ["model-a"])
    huge = "g" * (1 << 20)
    r = httpx.post(srv.url + "/v1/completions", json={"model": huge, "prompt": "hi"}, timeout=10)
    assert r.status_code == 404 and len(r.content) < 1024
    message = r.json()["error"]["message"]
    assert message.startswith("The model `" + "g" * 256 + f"… ({1 << 20} characters)`")


def test_adapter_blocks_are_no_hit_for_the_base_model_or_another_adapter(
    fake_workers, router_server
) -> None:
    (w,) = fake_workers(1)
    w.models = WITH_ADAPTERS
    srv = router_server(workers=[w.url], models_interval_s=0.2, block_size=16)
    assert wait_until(
        lambda: httpx.get(srv.url + "/workers").json()[0]["adapters"] == ["lora-1", "lora-2"]
    )
    prompt = "the same long shared prompt " * 20
    with httpx.Client(base_url=srv.url, timeout=10) as client:

        def estimated(model: str) -> int:
            before = _metrics(srv.url)
            key = ("cache_router_model_estimated_hit_tokens_total", (("model", model),))
            client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
            return _metrics(srv.url)[key] - before.get(key, 0)

        assert estimated("lora-1") == 0  # cold
        assert estimated("lora-1") > 0  # its own blocks
        assert estimated("lora-2") == 0  # another adapter: no hit
        assert estimated("model-b") == 0  # the base model: no hit
        assert estimated("model-b") > 0
    lora = httpx.get(srv.url + "/workers").json()[0]["lora"]
    assert lora["swaps"] == 2 and lora["running"] == {}  # lora-1, then lora-2 (1 slot)

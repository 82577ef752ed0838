"""End to end over real HTTP: the official openai client and httpx → router → fake workers."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from conftest import wait_until

PROMPT = "You are a helpful assistant. " * 200  # ~5.8 KB: two full approx blocks


@pytest.fixture
def setup(fake_workers, router_server):
    workers = fake_workers(2)
    router = router_server(workers=[w.url for w in workers])
    yield router, workers


def _all_idle(router) -> bool:
    states = router.call(lambda: [w.describe() for w in router.app.pool.workers])
    return all(
        s["num_requests"] == 0 and s["pending_prefill_tokens"] == 0 and s["pinned_blocks"] == 0
        for s in states
    )


def test_openai_client_chat_and_completions_non_streaming(setup):
    router, _ = setup
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0)
    chat = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    assert chat.choices[0].message.content == " tok" * 4
    assert chat.usage.prompt_tokens > 0
    comp = client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=4)
    assert comp.choices[0].text == " tok" * 4
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert _all_idle(router)


def test_openai_client_streaming_without_and_with_usage(setup):
    router, workers = setup
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    chunks = list(
        client.chat.completions.create(model="fake-model", messages=messages, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " tok" * 4
    # the router asked the worker for usage, and dropped that chunk for this client
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    sent = [r for w in workers for r in w.requests if r["path"] == "/v1/chat/completions"]
    assert sent[-1]["body"]["stream_options"] == {"include_usage": True}

    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 0
    # the second turn of the same prompt was routed to the warm worker: it reported a hit
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0

    stream = client.completions.create(model="fake-model", prompt=PROMPT, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == " tok" * 4
    assert _all_idle(router)


def test_stream_passes_through_event_by_event(fake_workers, router_server):
    (worker,) = fake_workers(1, chunks=5, chunk_delay=0.05)
    router = router_server(workers=[worker.url])
    body = {"model": "fake-model", "prompt": "hi", "stream": True}
    arrivals = []
    with (
        httpx.Client(base_url=router.url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["cache-control"] == "no-cache"  # worker headers kept
        assert "content-length" not in response.headers
        for line in response.iter_lines():
            if line.startswith("data:"):
                arrivals.append(line)
    assert len(arrivals) == 6 and arrivals[-1] == "data: [DONE]"


def test_generate_text_and_input_ids_with_meta_info(setup):
    router, _workers = setup
    with httpx.Client(base_url=router.url, timeout=10) as client:
        first = client.post("/generate", json={"text": PROMPT})
        assert first.status_code == 200 and first.json()["meta_info"]["cached_tokens"] == 0
        again = client.post("/generate", json={"text": PROMPT, "stream": True})
        assert again.status_code == 200
        events = [json.loads(x[5:]) for x in again.text.split("\n\n") if x.startswith("data: {")]
        assert events[0]["meta_info"]["cached_tokens"] > 0
        ids = list(range(1, 1200))
        r = client.post("/generate", json={"input_ids": ids, "sampling_params": {}})
        assert r.status_code == 200
        r = client.post("/v1/completions", json={"model": "fake-model", "prompt": ids})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    stats = router.call(lambda: [w.describe() for w in router.app.pool.workers])
    assert sum(s["accuracy"]["requests"] for s in stats) == 4
    assert sum(s["reported_cached_tokens"] for s in stats) > 0
    assert _all_idle(router)


def test_workers_endpoint_lists_the_required_fields(setup):
    router, workers = setup
    with httpx.Client(base_url=router.url, timeout=10) as client:
        client.post("/v1/completions", json={"model": "fake-model", "prompt": PROMPT})
        listed = client.get("/workers").json()
    assert [w["url"] for w in listed] == [w.url for w in workers]
    required = {
        "url",
        "healthy",
        "num_requests",
        "pending_prefill_tokens",
        "pinned_blocks",
        "shadow_blocks",
        "estimated_hit_tokens",
        "reported_cached_tokens",
    }
    assert all(required <= set(w) for w in listed)
    assert sum(w["shadow_blocks"] for w in listed) == 2


def test_errors_are_openai_shaped(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], max_body_bytes=10_000)
    with httpx.Client(base_url=router.url, timeout=10) as client:
        cases = [
            (b"{not json", "/v1/chat/completions", 400, "invalid_json"),
            (b"[1, 2]", "/v1/completions", 400, "invalid_json"),
            (b'{"model": "fake-model"}', "/v1/chat/completions", 400, "missing_field"),
            (b'{"messages": []}', "/v1/chat/completions", 400, "invalid_type"),
            (b'{"prompt": 5}', "/v1/completions", 400, "invalid_type"),
            (b'{"prompt": [1, -2]}', "/v1/completions", 400, "invalid_type"),
            (b'{"sampling_params": {}}', "/generate", 400, "missing_field"),
            (b'{"prompt": "x", "stream": "yes"}', "/v1/completions", 400, "invalid_type"),
            (json.dumps({"prompt": "x" * 20_000}).encode(), "/v1/completions", 413, None),
        ]
        for raw, path, status, code in cases:
            r = client.post(path, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == status, (raw[:40], r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "code"}
            if code:
                assert error["code"] == code
        # a worker's own 4xx passes through unchanged
        r = client.post("/v1/completions", json={"prompt": "x"}, headers={"x-fake-status": "400"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "fake error 400"
        assert r.headers["x-fake-worker"] == "yes"
        r = client.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert _all_idle(router)


def test_chunked_body_over_the_limit_is_413(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], max_body_bytes=1000)

    def body():
        for _ in range(10):
            yield b" " * 200

    with httpx.Client(base_url=router.url, timeout=10) as client:
        r = client.post("/v1/completions", content=body())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_no_worker_is_503_and_timeout_is_504(fake_workers, router_server):
    router = router_server(workers=[])
    with httpx.Client(base_url=router.url, timeout=10) as client:
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_worker"
        assert client.get("/health").status_code == 503
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], read_timeout_s=0.3)
    with httpx.Client(base_url=router.url, timeout=10) as client:
        r = client.post("/v1/completions", json={"prompt": "x"}, headers={"x-fake-hang": "1"})
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert wait_until(lambda: worker.cancelled == 1, 5)  # the worker saw the router leave
    assert _all_idle(router)


def test_5xx_before_any_byte_is_retried_elsewhere_and_last_5xx_passes(setup):
    router, workers = setup
    with httpx.Client(base_url=router.url, timeout=10) as client:
        workers[0].status = 500
        for _ in range(4):
            r = client.post("/v1/completions", json={"prompt": "x"})
            assert r.status_code == 200
            assert r.headers["x-cache-router-worker"] == workers[1].url
        workers[1].status = 503
        r = client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code in (500, 503)  # both failed: the last answer goes to the client
        assert r.json()["error"]["message"].startswith("fake error")
    text = httpx.get(router.url + "/metrics").text
    assert 'cache_router_retries_total{reason="worker_5xx"}' in text
    assert _all_idle(router)


def test_admin_key_guards_adding_and_removing_workers(fake_workers, router_server):
    w0, w1 = fake_workers(2)
    router = router_server(workers=[w0.url], admin_key="secret", policy="sticky")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        assert client.post("/workers", json={"url": w1.url}).status_code == 401
        bad = client.post("/workers", json={"url": w1.url}, headers={"x-admin-key": "nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        auth = {"authorization": "Bearer secret"}
        r = client.post("/workers", json={"url": w1.url, "kv_capacity_tokens": 4096}, headers=auth)
        assert r.status_code == 201 and r.json()["kv_capacity_tokens"] == 4096
        assert client.post("/workers", json={"url": w1.url}, headers=auth).status_code == 409
        assert [w["url"] for w in client.get("/workers").json()] == [w0.url, w1.url]
        # a session bound to w0 (index 0)...
        for _ in range(2):
            r = client.post("/v1/completions", json={"prompt": "x"}, headers={"x-session-id": "s1"})
            assert r.headers["x-cache-router-worker"] == w0.url
        assert client.delete("/workers", params={"url": w0.url}).status_code == 401
        r = client.delete("/workers", params={"url": w0.url}, headers=auth)
        assert r.status_code == 200 and r.json()["url"] == w0.url
        assert client.delete("/workers", params={"url": w0.url}, headers=auth).status_code == 404
        # ...is routed again among the remaining workers (the picker was rebuilt)
        r = client.post("/v1/completions", json={"prompt": "x"}, headers={"x-session-id": "s1"})
        assert r.status_code == 200 and r.headers["x-cache-router-worker"] == w1.url


def test_sessions_from_header_then_body(fake_workers, router_server):
    workers = fake_workers(3)
    router = router_server(
        workers=[w.url for w in workers], policy="sticky", picker_params={"tie_break": "multikey"}
    )
    with httpx.Client(base_url=router.url, timeout=10) as client:
        seen = {}
        for session in ("a", "b", "c"):
            for _ in range(3):
                r = client.post(
                    "/v1/completions", json={"prompt": "x"}, headers={"x-session-id": session}
                )
                seen.setdefault(session, set()).add(r.headers["x-cache-router-worker"])
            for key in ("user", "session_id"):
                r = client.post("/v1/completions", json={"prompt": "x", key: session})
                seen[session].add(r.headers["x-cache-router-worker"])
        assert all(len(urls) == 1 for urls in seen.values())
        assert len(set.union(*seen.values())) == 3  # idle ties spread round-robin


def test_hop_by_hop_headers_dropped_and_others_forwarded(setup):
    router, workers = setup
    headers = {"x-custom": "1", "authorization": "Bearer client", "connection": "keep-alive"}
    with httpx.Client(base_url=router.url, timeout=10) as client:
        client.post("/v1/completions?trace=1", json={"prompt": "x"}, headers=headers)
    last = [r for w in workers for r in w.requests][-1]
    assert last["query"] == "trace=1"
    sent = last["headers"]
    assert sent["x-custom"] == "1" and sent["authorization"] == "Bearer client"
    assert "connection" not in sent and sent["host"].startswith("127.0.0.1:")


def test_api_keys_and_worker_key(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], api_keys=["k1", "k2"], worker_api_key="wk")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        r = client.post(
            "/v1/completions", json={"prompt": "x"}, headers={"authorization": "Bearer k2"}
        )
        assert r.status_code == 200
    assert worker.requests[-1]["headers"]["authorization"] == "Bearer wk"


def test_cache_aware_routing_keeps_a_prefix_on_one_worker(fake_workers, router_server):
    workers = fake_workers(2)
    router = router_server(workers=[w.url for w in workers], policy="lmetric")
    prefixes = [f"system prompt {i} " * 300 for i in range(4)]
    with httpx.Client(base_url=router.url, timeout=10) as client:
        placed = {}
        for turn in range(4):
            for i, prefix in enumerate(prefixes):
                r = client.post("/v1/completions", json={"prompt": prefix + f"question {turn}"})
                placed.setdefault(i, set()).add(r.headers["x-cache-router-worker"])
    assert all(len(urls) == 1 for urls in placed.values())
    stats = httpx.get(router.url + "/workers").json()
    assert sum(s["reported_cached_tokens"] for s in stats) > 0


def test_worker_tokenizer_mode_asks_tokenize_once_per_prompt(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], tokenizer="worker")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for _ in range(3):
            r = client.post("/v1/completions", json={"model": "fake-model", "prompt": PROMPT})
            assert r.status_code == 200
    asked = [r for r in worker.requests if r["path"] == "/tokenize"]
    assert len(asked) == 1 and asked[0]["body"] == {"model": "fake-model", "prompt": PROMPT}
    state = httpx.get(router.url + "/workers").json()[0]
    # exact tokens: the worker's count of cached tokens and the radix estimate agree
    acc = state["accuracy"]
    assert acc["requests"] == 3 and acc["radix_abs_error_tokens"] == 0


def test_radix_shadow_answers_token_granular(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], shadow="radix")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        client.post("/v1/completions", json={"prompt": PROMPT})
        client.post("/v1/completions", json={"prompt": PROMPT + " more"})
    state = httpx.get(router.url + "/workers").json()[0]
    # the second request hit all of PROMPT in the radix tree, only whole blocks in the LRU
    approx_tokens = len(PROMPT) // 4
    assert state["estimated_hit_tokens"] == approx_tokens
    acc = state["accuracy"]
    assert acc["radix_estimate_tokens"] == approx_tokens
    assert acc["blocks_estimate_tokens"] == (approx_tokens // 512) * 512
    assert acc["radix_abs_error_tokens"] < acc["blocks_abs_error_tokens"]


def test_reports_shrink_the_shadow_of_a_smaller_worker_cache(fake_workers, router_server):
    (worker,) = fake_workers(1, cache_tokens=3000)  # the worker holds ~3k tokens
    router = router_server(workers=[worker.url], kv_capacity_tokens=1_000_000)
    prompts = [f"document {i} " + "lorem ipsum dolor sit amet " * 100 for i in range(6)]
    with httpx.Client(base_url=router.url, timeout=10) as client:
        for prompt in prompts + prompts:
            assert client.post("/v1/completions", json={"prompt": prompt}).status_code == 200
    state = httpx.get(router.url + "/workers").json()[0]
    # the second round: the shadow (1M tokens) thought every prompt cached, the worker had
    # evicted them: false hits shrank the shadow's capacity
    assert state["shadow_capacity_blocks"] < 1_000_000 // 512
    assert state["radix_capacity_tokens"] < 1_000_000
    metrics = httpx.get(router.url + "/metrics").text
    assert 'direction="shrink",shadow="blocks"' in metrics

"""The Responses API on real vLLM CPU workers with the response store on: chains of
continuations through the router, across the session's three workers, all succeed.

vLLM keeps a stored response in the memory of the server that made it, and only when started
with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``setup.sh``'s ``RW_RESPONSES_STORE``, on for the
session's workers; without it vLLM answers but stores nothing). The tiny model's chat
template (``make_tiny_model.py``) lets vLLM read ``instructions`` and ``input`` as chat
messages. vLLM 0.32.0 serves ``POST /v1/responses`` (JSON and SSE), ``GET
/v1/responses/{id}`` and ``POST .../cancel`` (400 for a response that is not a background
one); it has no ``DELETE`` and no ``.../input_items``.

- each worker by itself: a response, its continuation (the stored conversation is in the
  prompt: more input tokens) and ``GET`` of it; another worker answers 404 for that id, as
  a continuation or a ``GET`` (the rule the router follows);
- through the router (round_robin, which would send each turn elsewhere, and the default
  picker): three conversations of seven turns each, interleaved, streamed and not in turn,
  all 200; every turn of a conversation on the worker of its first (``x-cache-router-worker``),
  whose prefix cache serves the stored conversation; with round_robin the three are on the
  three workers. ``GET /v1/responses/{id}`` of every turn through the router returns it, a
  cancel reaches the owner (vLLM's own 400), an id nobody stored gets the router's 404
  ``response_not_found``, and ``/metrics`` counts the ``responses`` endpoint and the owner
  look-ups.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from realworkers_support import ENABLED, SKIP_REASON, routed, text, unique

from router.config import Settings

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)

HEADER = "x-cache-router-worker"
TURNS = 7
CHAINS = 3
INSTRUCTIONS = text(5000, 600)  # a shared prefix of several 32-token blocks


def respond(
    url: str, content: str, previous: str | None = None, stream: bool = False, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "tiny",
        "instructions": INSTRUCTIONS,
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": 4,
        "temperature": 0,
        "stream": stream,
        **extra,
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return httpx.post(f"{url}/v1/responses", json=body, timeout=120)


def response_of(r: httpx.Response) -> dict[str, Any]:
    """The response object: the body, or a stream's last event's (after ``response.created``)."""
    assert r.status_code == 200, r.text[:500]
    if not r.headers["content-type"].startswith("text/event-stream"):
        return r.json()
    events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    assert events[0]["type"] == "response.created", events[0]
    # vLLM ends a stream cut by max_output_tokens with response.completed, status incomplete
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    assert events[-1]["response"]["id"] == events[0]["response"]["id"]
    return events[-1]["response"]


def not_found(r: httpx.Response, response_id: str) -> None:
    """vLLM's own 404 for an id it does not hold."""
    assert r.status_code == 404, r.text[:300]
    assert r.json()["error"]["message"] == f"Response with id '{response_id}' not found.", r.text


def test_each_worker_stores_its_responses(real_workers) -> None:
    """vLLM itself, store on: a continuation and a GET on the worker that made the response
    succeed; any other worker answers 404 (else: RW_RESPONSES_STORE is off there)."""
    urls = real_workers.urls
    for i, url in enumerate(urls):
        first = response_of(respond(url, unique(f"store-{i}") + text(300 * i, 200)))
        r = httpx.get(f"{url}/v1/responses/{first['id']}", timeout=30)
        assert r.status_code == 200, (
            f"{url} did not store {first['id']} ({r.status_code} {r.text[:200]}): start it "
            "with VLLM_ENABLE_RESPONSES_API_STORE=1 (setup.sh: RW_RESPONSES_STORE=1)"
        )
        assert r.json()["id"] == first["id"]
        second = response_of(respond(url, "go on", previous=first["id"]))
        assert second["previous_response_id"] == first["id"]
        # the stored conversation (instructions, input, output) is in the second prompt
        assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"], (first, second)
        other = urls[(i + 1) % len(urls)]
        not_found(respond(other, "go on", previous=first["id"]), first["id"])
        not_found(httpx.get(f"{other}/v1/responses/{first['id']}", timeout=30), first["id"])


def _families(url: str) -> dict[str, Any]:
    text_ = httpx.get(f"{url}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text_)}


@pytest.mark.parametrize("policy", ["round_robin", Settings().policy])
def test_chains_of_continuations_through_the_router(real_workers, policy) -> None:
    urls = real_workers.urls
    with routed(urls, policy) as svc:
        # CHAINS conversations, interleaved turn by turn; odd turns streamed
        chains: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in range(CHAINS)]
        for turn in range(TURNS):
            for c, chain in enumerate(chains):
                previous = chain[-1][1]["id"] if chain else None
                content = (
                    unique(f"responses-{policy}-{c}") + text(700 * c, 300)
                    if turn == 0
                    else f"turn {turn}: and then?"
                )
                r = respond(svc.url, content, previous=previous, stream=turn % 2 == 1)
                response = response_of(r)
                assert response["previous_response_id"] == previous
                chain.append((r.headers[HEADER], response))

        for c, chain in enumerate(chains):
            inputs = [r["usage"]["input_tokens"] for _, r in chain]
            cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for _, r in chain]
            print(f"\n{policy} chain {c} on {chain[0][0]}: input {inputs} cached {cached}")
        owners = [{worker for worker, _ in chain} for chain in chains]
        # every continuation went where its previous response is stored
        assert all(len(o) == 1 for o in owners), owners
        owners_ = [next(iter(o)) for o in owners]
        if policy == "round_robin":  # three new conversations: one on each worker
            assert sorted(owners_) == sorted(urls), owners_
        for chain in chains:
            inputs = [r["usage"]["input_tokens"] for _, r in chain]
            assert inputs == sorted(inputs) and inputs[-1] > inputs[0], inputs  # it grows
            # the owner's prefix cache holds the conversation so far
            cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for _, r in chain]
            assert all(n > 0 for n in cached[1:]), cached

        before = _families(svc.url)
        ids = {r["id"]: worker for chain in chains for worker, r in chain}
        for response_id, worker in ids.items():
            r = httpx.get(f"{svc.url}/v1/responses/{response_id}", timeout=30)
            assert r.status_code == 200, r.text[:300]
            assert r.json()["id"] == response_id
            assert r.headers[HEADER] == worker
        # a cancel reaches the owner: vLLM's own 400 (not a background response)
        last_id, last_worker = chains[0][-1][1]["id"], chains[0][-1][0]
        r = httpx.post(f"{svc.url}/v1/responses/{last_id}/cancel", timeout=30)
        assert r.status_code == 400 and r.headers[HEADER] == last_worker, r.text[:300]
        assert "Cannot cancel a synchronous response" in r.json()["error"]["message"]
        # an id no worker stored: the router's own 404, no worker asked
        r = httpx.get(f"{svc.url}/v1/responses/resp_nobody0000", timeout=30)
        assert r.status_code == 404 and HEADER not in r.headers, r.text[:300]
        assert r.json()["error"]["code"] == "response_not_found", r.text
        # the same continuation sent straight to a worker that did not store it: vLLM's 404
        other = next(u for u in urls if u != last_worker)
        not_found(respond(other, "and then?", previous=last_id), last_id)

        after = _families(svc.url)

    def endpoint(families: dict[str, Any]) -> dict[tuple[str, str], float]:
        family = families["cache_router_endpoint_requests"]
        return {(s.labels["endpoint"], s.labels["status"]): s.value for s in family.samples}

    def lookups(families: dict[str, Any]) -> dict[str, float]:
        family = families["cache_router_response_owner_lookups"]
        return {s.labels["result"]: s.value for s in family.samples if s.name.endswith("_total")}

    assert endpoint(before)[("responses", "200")] == CHAINS * TURNS
    assert endpoint(after)[("response_call", "200")] == len(ids) == CHAINS * TURNS
    assert endpoint(after)[("response_call", "400")] == 1
    continuations = CHAINS * (TURNS - 1)
    assert lookups(before)["local"] == continuations, lookups(before)
    assert lookups(after)["local"] == continuations + len(ids) + 1, lookups(after)
    assert lookups(after)["unknown"] == 1, lookups(after)
    assert after["cache_router_response_owners"].samples[0].value == CHAINS * TURNS

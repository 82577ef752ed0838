"""Disaggregated prefill/decode on real vLLM CPU workers, through the router.

Two workers of the tiny model started with vLLM's example KV connector (``pd_workers``:
``ExampleConnector``, which saves a prefill's KV to a shared folder by the prompt's token ids
and loads it where the same prompt arrives; it needs no GPU), one given as ``--prefill`` and
one as ``--decode`` with ``--pd-protocol vllm``. The router sends the prefill leg (one token,
not streamed, ``kv_transfer_params`` asking for a remote decode) and then the request to the
decode worker, as vLLM's own proxy does. Evidence that the decode worker got its KV from the
prefill instead of computing it: it reports the prompt's whole blocks as cached
(``prompt_tokens_details.cached_tokens``) for prompts it has never seen, and its first-token
log-probabilities are the prefill worker's. Streamed and not, chat and completions.
"""

from __future__ import annotations

import json

import httpx
import pytest
from realworkers_support import ENABLED, SKIP_REASON, text, unique, workers_of

from traces.live.fleet import free_port, start_service

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)

BLOCK = 32  # the workers' --block-size


@pytest.fixture(scope="module")
def pd_router(pd_workers):
    port = free_port()
    args = ["serve", "--port", str(port), "--prefill", pd_workers.prefill,
            "--decode", pd_workers.decode, "--pd-protocol", "vllm",
            "--log-level", "warning"]  # fmt: skip
    service = start_service("pd-router", args, port)
    try:
        yield service
    finally:
        service.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_the_decode_worker_gets_the_prefill_workers_kv(pd_workers, pd_router, stream) -> None:
    for i in range(3):
        prompt = unique(f"pd-{stream}-{i}") + text(311 * i + 7, 900)
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                "stream": stream, "logprobs": 3}  # fmt: skip
        if stream:  # the client's own request for usage (else the router drops the chunk)
            body["stream_options"] = {"include_usage": True}
        r = httpx.post(f"{pd_router.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text[:500]
        assert r.headers["x-cache-router-worker"] == pd_workers.decode
        if stream:
            events = [e[5:].strip() for e in r.text.splitlines() if e.startswith("data:")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
            first = next(c["choices"][0] for c in chunks if c.get("choices"))
        else:
            usage = r.json()["usage"]
            first = r.json()["choices"][0]
        prompt_tokens = usage["prompt_tokens"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        # never seen by the decode worker, yet every whole block before the last token is
        # there: loaded from the prefill worker's KV
        assert cached == (prompt_tokens - 1) // BLOCK * BLOCK > 0, usage
        # the same first token as the prefill worker computes itself
        again = {**body, "stream": False, "max_tokens": 1}
        again.pop("stream_options", None)
        alone = httpx.post(f"{pd_workers.prefill}/v1/completions", json=again, timeout=120)
        mine = alone.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        theirs = first["logprobs"]["top_logprobs"][0]
        assert set(mine) == set(theirs), (mine, theirs)
        for token, value in mine.items():
            assert abs(theirs[token] - value) < 1e-3, (token, value, theirs[token])


def test_chat_through_both_roles(pd_workers, pd_router) -> None:
    messages = [{"role": "user", "content": unique("pd-chat") + text(5000, 700)}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 5}
    r = httpx.post(f"{pd_router.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["x-cache-router-worker"] == pd_workers.decode
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    workers = workers_of(pd_router.url)
    assert workers[pd_workers.prefill]["role"] == "prefill"
    assert workers[pd_workers.decode]["role"] == "decode"
    assert all(w["num_requests"] == 0 for w in workers.values())
    metrics = httpx.get(f"{pd_router.url}/metrics", timeout=10).text
    assert 'cache_router_disaggregated_requests_total{outcome="ok",protocol="vllm"}' in metrics

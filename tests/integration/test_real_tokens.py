"""Exact tokens against real vLLM: the router's ``--tokenizer PATH`` (tokenizer.json + chat
template of the model folder) and ``--tokenizer worker`` (/tokenize) give the token ids vLLM
itself processed (``return_token_ids``), for completions and chat; then the router's block
hashes line up with what vLLM caches, so its estimate equals vLLM's cached tokens."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from realworkers_support import (
    ENABLED,
    SKIP_REASON,
    cached,
    chat,
    complete,
    routed,
    text,
    unique,
    workers_of,
)

from router.core.parse import CHAT, COMPLETION, parse_request
from router.core.tokenize import LocalTokenizer, WorkerTokenizer

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)

PROMPTS = [
    "def route(request):\n    return min(workers, key=lambda w: w.load)\n",
    "naïve café — “quotes”, ünïcödé, emoji 😀 and\ttabs\r\nand CRLF  double  spaces",
    text(1000, 3000),
    "<s> a literal special token </s> and <|user|> markers inside text",
]
CHATS = [
    [{"role": "user", "content": "hi there"}],
    [
        {"role": "system", "content": text(5000, 800)},
        {"role": "user", "content": "what does this do?"},
        {"role": "assistant", "content": text(9000, 300)},
        {"role": "user", "content": "and — “why”? 😀"},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaces  "}],
]


def vllm_ids(url: str, kind: str, payload: object) -> list[int]:
    """The prompt ids vLLM itself processed for a request."""
    if kind == COMPLETION:
        r = complete(url, payload, max_tokens=1, return_token_ids=True)
        return r.json()["choices"][0]["prompt_token_ids"]
    r = chat(url, payload, max_tokens=1, return_token_ids=True)
    return r.json()["prompt_token_ids"]


def cases() -> list[tuple[str, object]]:
    return [(COMPLETION, p) for p in PROMPTS] + [(CHAT, m) for m in CHATS]


def parsed(kind: str, payload: object):
    body = {"model": "tiny"} | (
        {"prompt": payload} if kind == COMPLETION else {"messages": payload}
    )
    return parse_request(kind, orjson.dumps(body), None)


def test_local_and_worker_tokenizers_match_vllm(real_workers) -> None:
    url = real_workers.urls[0]
    local = LocalTokenizer(str(real_workers.model), 32)

    async def ask(path: str, body: bytes) -> bytes | None:
        async with httpx.AsyncClient() as client:
            headers = {"content-type": "application/json"}
            r = await client.post(f"{url}{path}", content=body, headers=headers, timeout=30)
        return r.content if r.status_code == 200 else None

    remote = WorkerTokenizer(ask, "/tokenize", 32)
    for kind, payload in cases():
        want = vllm_ids(url, kind, payload)
        request = parsed(kind, payload)
        assert local.ids(request).tolist() == want, (kind, payload)
        tok = asyncio.run(remote.tokenize(request))
        assert tok.exact and list(memoryview(tok.tokens).cast("I")) == want, (kind, payload)


@pytest.mark.parametrize("mode", ["path", "worker"])
def test_router_estimates_equal_vllms_cached_tokens(real_workers, mode: str) -> None:
    """A conversation through the router: every turn's estimate is what vLLM then reports."""
    spec = str(real_workers.model) if mode == "path" else "worker"
    with routed(real_workers.urls, "lmetric", "--tokenizer", spec, "--block-size", "32") as svc:
        tag = unique(mode)
        messages = [{"role": "system", "content": tag + text(2000, 2500)}]
        reported = []
        for turn in range(4):
            messages.append({"role": "user", "content": text(20_000 + 700 * turn, 500)})
            reported.append(cached(chat(svc.url, messages)))
            messages.append({"role": "assistant", "content": text(40_000 + 900 * turn, 600)})
        prompts = [tag + text(60_000, 2000)] * 2
        reported += [cached(complete(svc.url, p)) for p in prompts]
        accuracy = [w["accuracy"] for w in workers_of(svc.url).values()]
    assert sum(reported[1:4]) > 0 and reported[-1] > 0  # the cache was really hit
    assert sum(a["requests"] for a in accuracy) == 6
    assert sum(a["reported_tokens"] for a in accuracy) == sum(reported)
    assert sum(a["blocks_abs_error_tokens"] for a in accuracy) == 0
    assert sum(a["radix_abs_error_tokens"] for a in accuracy) == 0

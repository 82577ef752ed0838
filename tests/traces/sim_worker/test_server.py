"""The simulated worker over real HTTP: uvicorn on 127.0.0.1, an ephemeral port, fast clock.

One server per module (started in a thread, stopped at the end); tests use prompts unique to
the test, so they never hit each other's cache, and compare metric *deltas*.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.api import text_token_ids
from traces.sim_worker.server import SimWorkerConfig

SCALE = 50.0  # model seconds per real second
BLOCK_BYTES = 2048  # a 512-token block of text, 4 bytes per token
CAPACITY = 256 * 512


@dataclass
class Server:
    url: str
    client: httpx.Client


@pytest.fixture(scope="module")
def server(sim_worker_in_thread) -> Iterator[Server]:
    config = SimWorkerConfig(WorkerModelConfig(kv_capacity_tokens=CAPACITY), time_scale=SCALE)
    with sim_worker_in_thread(config) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield Server(url, client)


def unique_text(n_bytes: int) -> str:
    """ASCII text of exactly ``n_bytes``, unique to this call from its first block on."""
    head = f"[{uuid.uuid4().hex}] "
    return (head + "lorem ipsum dolor sit amet " * (n_bytes // 27 + 1))[:n_bytes]


def post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = server.client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse(server: Server, path: str, body: dict[str, Any]) -> list[Any]:
    """The ``data:`` payloads of a stream, JSON-decoded; "[DONE]" kept as a string."""
    out: list[Any] = []
    with server.client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
            else:
                assert line == "", line
    return out


def metrics(server: Server) -> dict[str, float]:
    """Every sample as ``name{k=v,...}`` (labels sorted, model/engine labels dropped)."""
    r = server.client.get("/metrics")
    assert r.status_code == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + ("{" + ",".join(f"{k}={labels[k]}" for k in sorted(labels)) + "}")
            out[key.removesuffix("{}")] = s.value
    return out


def filler(n: int) -> str:
    return "".join(f" tok{i}" for i in range(n))


# ---- non-streaming ---------------------------------------------------------------------


def test_completion_schema_and_repeat_hits_cache(server: Server) -> None:
    text = unique_text(3 * BLOCK_BYTES + 999)  # 3 full blocks + a tail
    first = post(server, "/v1/completions", {"model": "sim-model", "prompt": text})
    assert first["object"] == "text_completion" and first["id"].startswith("cmpl-")
    assert first["model"] == "sim-model" and isinstance(first["created"], int)
    (choice,) = first["choices"]
    assert choice["text"] == filler(16) and choice["finish_reason"] == "length"
    tokens = math.ceil(len(text) / 4)
    assert first["usage"] == {
        "prompt_tokens": tokens,
        "completion_tokens": 16,
        "total_tokens": tokens + 16,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    again = post(server, "/v1/completions", {"prompt": text, "max_tokens": 3})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 512
    assert again["choices"][0]["text"] == filler(3)
    # a prompt that shares only the first block hits only that block
    forked = text[:BLOCK_BYTES] + "X" + text[BLOCK_BYTES + 1 :]
    fork = post(server, "/v1/completions", {"prompt": forked, "max_tokens": 1})
    assert fork["usage"]["prompt_tokens_details"]["cached_tokens"] == 512


def test_token_id_prompts_and_tokenize_share_the_text_cache(server: Server) -> None:
    ids = [7] * 1100 + list(range(5))  # unique-enough: text prompts never produce small ids
    ids[0] = int(uuid.uuid4().int % 2**31)
    cold = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 2})
    assert cold["usage"]["prompt_tokens"] == 1105
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    warm = post(server, "/v1/completions", {"prompt": [ids], "max_tokens": 2})  # batch of one
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024

    text = unique_text(2 * BLOCK_BYTES + 10)
    post(server, "/v1/completions", {"prompt": text, "max_tokens": 1})
    tok = post(server, "/tokenize", {"prompt": text})
    assert tok["count"] == len(tok["tokens"]) == math.ceil(len(text) / 4)
    via_ids = post(server, "/v1/completions", {"prompt": tok["tokens"], "max_tokens": 1})
    assert via_ids["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024


def test_chat_later_turn_extends_earlier_turn(server: Server) -> None:
    system = {"role": "system", "content": unique_text(BLOCK_BYTES * 2)}
    turn1 = [system, {"role": "user", "content": "first question " * 100}]
    r1 = post(server, "/v1/chat/completions", {"messages": turn1, "max_tokens": 4})
    assert r1["object"] == "chat.completion" and r1["id"].startswith("chatcmpl-")
    assert r1["choices"][0]["message"] == {"role": "assistant", "content": filler(4)}
    reply = {"role": "assistant", "content": r1["choices"][0]["message"]["content"]}
    parts = [{"type": "text", "text": "second "}, {"type": "text", "text": "question " * 300}]
    turn2 = [*turn1, reply, {"role": "user", "content": parts}]
    r2 = post(server, "/v1/chat/completions", {"messages": turn2, "max_completion_tokens": 2})
    # turn 1 serializes to "system\n...\nuser\n...\n": its full blocks are turn 2's prefix
    turn1_bytes = len("system\n" + system["content"] + "\nuser\n" + "first question " * 100 + "\n")
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == turn1_bytes // 2048 * 512
    assert r2["usage"]["completion_tokens"] == 2


def test_generate_non_stream_and_stream(server: Server) -> None:
    text = unique_text(BLOCK_BYTES * 2 + 5)
    body: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": 5}}
    cold = post(server, "/generate", body)
    assert cold["text"] == filler(5)
    meta = cold["meta_info"]
    assert meta["prompt_tokens"] == math.ceil(len(text) / 4) and meta["completion_tokens"] == 5
    assert meta["cached_tokens"] == 0 and meta["finish_reason"] == {"type": "length", "length": 5}
    events = sse(server, "/generate", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert texts[-1] == filler(5) and all(texts[-1].startswith(t) for t in texts)  # cumulative
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [len(t.split()) for t in texts]
    assert all(c["meta_info"]["cached_tokens"] == 1024 for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    ids = post(server, "/generate", {"input_ids": [5] * 600, "sampling_params": {}})
    assert ids["meta_info"]["prompt_tokens"] == 600 and ids["text"] == filler(16)


# ---- streaming -------------------------------------------------------------------------


def test_chat_stream_with_usage_chunk(server: Server) -> None:
    messages = [{"role": "user", "content": unique_text(BLOCK_BYTES + 100)}]
    body = {"messages": messages, "max_tokens": 6, "stream": True}
    usage_body = {**body, "stream_options": {"include_usage": True}}
    events = sse(server, "/v1/chat/completions", usage_body)
    assert events[-1] == "[DONE]"
    role, *content, usage = events[:-1]
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == filler(6)
    assert len(content) == 6  # one token per chunk
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 5 + ["length"]
    assert len({c["id"] for c in events[:-1]}) == 1
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # the same prompt again: the usage chunk reports the hit
    again = sse(server, "/v1/chat/completions", usage_body)
    assert again[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 512
    # without include_usage there is no usage chunk
    plain = sse(server, "/v1/chat/completions", body)
    assert all("usage" not in e for e in plain[:-1]) and plain[-1] == "[DONE]"


def test_completion_stream(server: Server) -> None:
    events = sse(server, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "stream": True})
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == filler(4)
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_stream_timing_follows_the_model(server: Server) -> None:
    """The first token comes early, the last at the model's finish (1000 decode steps)."""
    n = 1000
    min_real = n * WorkerModelConfig().decode_step_s(1) / SCALE  # >= 0.24 s
    body = {"prompt": unique_text(100), "max_tokens": n, "stream": True}
    start = time.monotonic()
    arrivals: list[float] = []
    with server.client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == n
    assert arrivals[-1] >= min_real * 0.95
    assert arrivals[0] < arrivals[-1] / 2
    assert arrivals[n // 2] < 0.8 * arrivals[-1]  # paced, not all at the finish


# ---- metrics and cache reset -----------------------------------------------------------


def test_metrics_agree_with_responses(server: Server) -> None:
    before = metrics(server)
    shared = unique_text(BLOCK_BYTES * 3)
    usages = []
    for i in range(4):
        r = post(server, "/v1/completions", {"prompt": shared + f" q{i}", "max_tokens": 3 + i})
        usages.append(r["usage"])
    g = post(server, "/generate", {"text": shared, "sampling_params": {"max_new_tokens": 2}})
    usages.append({**g["meta_info"], "prompt_tokens_details": g["meta_info"]})
    after = metrics(server)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached == 4 * 1536  # all but the first found the 3 shared blocks
    assert delta("vllm:prefix_cache_queries_total") == prompt
    assert delta("vllm:prefix_cache_hits_total") == cached
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert delta("vllm:request_success_total{finished_reason=length}") == 5
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0  # idle: cached blocks are free, as in vLLM
    info = (
        "vllm:cache_config_info{block_size=512,enable_prefix_caching=True,"
        f"kv_offloading_backend=native,kv_offloading_size=None,num_gpu_blocks={CAPACITY // 512}}}"
    )
    assert after[info] == 1  # no CPU tier: kv_offloading_size unset, as vLLM exports it


def test_running_request_shows_in_metrics_and_blocks_reset(server: Server) -> None:
    text = unique_text(BLOCK_BYTES * 4)
    result: dict[str, Any] = {}

    def long_request() -> None:
        result["r"] = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1500})

    thread = threading.Thread(target=long_request)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while metrics(server)["vllm:num_requests_running"] != 1:
            assert time.monotonic() < deadline, "the long request never showed as running"
            time.sleep(0.01)
        m = metrics(server)
        assert m["vllm:kv_cache_usage_perc"] >= 4 * 512 / CAPACITY
        busy = server.client.post("/reset_prefix_cache")
        assert busy.status_code == 409 and busy.json()["error"]["code"] == 409
    finally:
        thread.join(10)
    assert result["r"]["usage"]["completion_tokens"] == 1500
    assert metrics(server)["vllm:num_requests_running"] == 0
    assert server.client.post("/reset_prefix_cache").status_code == 200
    cold = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the reset dropped it


async def test_concurrent_requests_are_batched(server: Server) -> None:
    shared = unique_text(BLOCK_BYTES * 2)
    before = metrics(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:

        async def one(i: int) -> dict[str, Any]:
            body = {"prompt": shared + f" {i}", "max_tokens": 200}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200
            return r.json()

        start = time.monotonic()
        results = await asyncio.gather(*(one(i) for i in range(16)))
        elapsed = time.monotonic() - start
    assert [r["choices"][0]["text"] for r in results] == [filler(200)] * 16
    after = metrics(server)
    success = "vllm:request_success_total{finished_reason=length}"
    assert after[success] - before[success] == 16
    # batched: 16 x 200 decode steps one after another would take >= 16 x 200 x 12 ms / SCALE
    assert elapsed < 16 * 200 * WorkerModelConfig().decode_step_s(1) / SCALE


# ---- tokenize, models, health, errors --------------------------------------------------


def test_tokenize_is_prefix_stable(server: Server) -> None:
    a, b = "Hello, wörld! abc", " and then some more text"
    assert len(a.encode()) % 4 == 2  # a partial last chunk
    ta = post(server, "/tokenize", {"prompt": a})["tokens"]
    tab = post(server, "/tokenize", {"prompt": a + b})["tokens"]
    assert tab[: len(ta) - 1] == ta[:-1] and len(ta) == math.ceil(len(a.encode()) / 4)
    a4 = a + "xy"  # a whole number of 4-byte chunks: every id is stable
    t4 = post(server, "/tokenize", {"prompt": a4})["tokens"]
    t4b = post(server, "/tokenize", {"prompt": a4 + b})["tokens"]
    assert len(a4.encode()) % 4 == 0 and t4b[: len(t4)] == t4 and len(t4b) > len(t4)
    assert len(set(t4b)) > 1  # not a constant
    messages = [{"role": "user", "content": "hi there"}]
    chat = post(server, "/tokenize", {"messages": messages})
    assert chat["tokens"] == text_token_ids("user\nhi there\n")
    usage = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})["usage"]
    assert usage["prompt_tokens"] == chat["count"]


def test_models_health_version(server: Server) -> None:
    models = server.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["sim-model"]
    assert models["data"][0]["max_model_len"] == CAPACITY
    assert server.client.get("/health").status_code == 200
    assert "version" in server.client.get("/version").json()


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", {}, 400, "'prompt' is required"),
        ("/v1/completions", {"prompt": ""}, 400, "must not be empty"),
        ("/v1/completions", {"prompt": [1.5]}, 400, "token ids"),
        ("/v1/completions", {"prompt": [-1, 2]}, 400, "token ids"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "batched"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "9"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "at least 1"),
        ("/v1/completions", {"prompt": "x", "max_tokens": CAPACITY}, 400, "context length"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
        ("/v1/completions", {"prompt": "x", "stream_options": {}}, 400, "stream=True"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "does not exist"),
        ("/v1/chat/completions", {"messages": []}, 400, "non-empty list"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ("/generate", {"sampling_params": {}}, 400, "'text' or 'input_ids'"),
        ("/generate", {"input_ids": "abc"}, 400, "list of token ids"),
        ("/tokenize", {"prompt": 5}, 400, "'prompt'"),
        ("/nope", {}, 404, "Not Found"),
    ],
)
def test_bad_input_gets_openai_style_errors(
    server: Server, path: str, body: Any, status: int, needle: str
) -> None:
    before = metrics(server)["vllm:prefix_cache_queries_total"]
    if isinstance(body, bytes):
        r = server.client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = server.client.post(path, json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert needle in error["message"] and error["code"] == status and error["type"]
    assert metrics(server)["vllm:prefix_cache_queries_total"] == before  # nothing was queued


# ---- the official client and the command -----------------------------------------------


def test_official_openai_client(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["sim-model"]
    content = unique_text(BLOCK_BYTES * 2 + 40)
    messages: Any = [{"role": "user", "content": content}]
    chat = client.chat.completions.create(model="sim-model", messages=messages, max_tokens=5)
    assert chat.choices[0].message.content == filler(5)
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens == 0
    stream = client.chat.completions.create(
        model="sim-model",
        messages=messages,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == filler(5)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1024
    comp = client.completions.create(model="sim-model", prompt=content, max_tokens=2)
    assert comp.choices[0].text == filler(2) and comp.usage is not None
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="sim-model", prompt="x", max_tokens=0)


def test_command_starts_a_worker() -> None:
    """``cache-router sim-worker`` through the real entry point, in its own process."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    root = Path(__file__).parents[3]
    cmd = [sys.executable, "-m", "router.cli", "sim-worker", "--port", str(port),
           "--time-scale", "100", "--kv-capacity-tokens", "8192", "--model-name", "m2",
           "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "sim-worker did not become healthy"
            time.sleep(0.05)
        body = {"model": "m2", "prompt": "x" * 5000, "max_tokens": 2}
        for expect in (0, 1024):
            r = httpx.post(url + "/v1/completions", json=body, timeout=5).json()
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == expect
        text = httpx.get(url + "/metrics", timeout=5).text
        assert 'vllm:cache_config_info{block_size="512"' in text
        assert 'num_gpu_blocks="16"' in text
    finally:
        proc.terminate()
        proc.wait(10)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="time scale"):
        SimWorkerConfig(time_scale=0)
    with pytest.raises(ValueError, match="KV capacity"):
        SimWorkerConfig(WorkerModelConfig(kv_capacity_tokens=100))
    with pytest.raises(ValueError, match="decode step"):
        SimWorkerConfig(WorkerModelConfig(profile=None, step_overhead_s=0, decode_s_per_seq=0))


FIRST_STREAM = """
import asyncio, json, sys
from traces.sim_worker.server import SimWorkerConfig, create_app

app = create_app(SimWorkerConfig())  # the defaults, as `cache-router sim-worker`
ASGI = {"version": "3.0", "spec_version": "2.3"}  # uvicorn's: streams in an anyio task group


async def main():
    started, stop = asyncio.Event(), asyncio.Event()

    async def life_receive():
        if not started.is_set():
            return {"type": "lifespan.startup"}
        await stop.wait()
        return {"type": "lifespan.shutdown"}

    async def life_send(message):
        if message["type"] == "lifespan.startup.complete":
            started.set()

    life = asyncio.create_task(app({"type": "lifespan", "asgi": ASGI}, life_receive, life_send))
    await asyncio.wait_for(started.wait(), 10)
    before = set(sys.modules)
    body = json.dumps({"prompt": "x" * 4000, "max_tokens": 4, "stream": True}).encode()
    sent, done = [], asyncio.Event()

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {"type": "http", "asgi": ASGI, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "headers": [(b"content-type", b"application/json")]}
    await asyncio.wait_for(app(scope, receive, send), 10)
    print(json.dumps(sorted(set(sys.modules) - before)))
    stop.set()
    await life


asyncio.run(main())
"""


def test_first_streamed_answer_imports_nothing() -> None:
    """A fresh worker's first streamed answer imports no module: starlette streams in an
    anyio task group, whose backend anyio imports at first use, a stall of the event loop
    (0.1-0.4 s on a loaded host, seconds of modelled time at a sweep's time scale) that the
    first requests of a run paid; the lifespan's startup does it before serving."""
    root = Path(__file__).parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", FIRST_STREAM], cwd=root, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

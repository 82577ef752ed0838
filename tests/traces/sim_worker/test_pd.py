"""Disaggregated prefill/decode on the simulated worker (``sim-worker --role``), both protocols.

Real servers: uvicorn in threads on 127.0.0.1 (ephemeral HTTP ports, explicit free bootstrap
ports), fast clock; the test itself plays the router (vLLM's toy proxy, SGLang's mini_lb).
Prompts are unique per test, metrics compared as deltas.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from traces.live.fleet import free_port
from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.pd import PdConfig
from traces.sim_worker.server import SimWorkerConfig, add_parser, config_from_args

SCALE = 50.0
BLOCK_BYTES = 2048  # one 512-token block of text
KV_BYTES = 131_072
TIMEOUT = httpx.Timeout(10.0)


def config(flavor: str, role: str, **pd: Any) -> SimWorkerConfig:
    model = WorkerModelConfig(kv_capacity_tokens=64 * 512)
    return SimWorkerConfig(model, time_scale=SCALE, flavor=flavor, pd=PdConfig(role, **pd))


@pytest.fixture(scope="module")
def vllm(sim_worker_in_thread) -> Iterator[dict[str, str]]:
    serve = sim_worker_in_thread
    with serve(config("vllm", "prefill"), "on") as p, serve(config("vllm", "decode"), "on") as d:
        yield {"prefill": p, "decode": d}


BOOTSTRAP = free_port()


@pytest.fixture(scope="module")
def sglang(sim_worker_in_thread) -> Iterator[dict[str, str]]:
    """The prefill with lifespan off: its bootstrap listener starts at its first request."""
    prefill = config("sglang", "prefill", bootstrap_port=BOOTSTRAP)
    decode = config("sglang", "decode", kv_wait_timeout_s=0.5)
    with sim_worker_in_thread(prefill) as p, sim_worker_in_thread(decode, "on") as d:
        yield {"prefill": p, "decode": d}


def unique_text(n_bytes: int) -> str:
    head = f"[{uuid.uuid4().hex}] "
    return (head + "lorem ipsum dolor sit amet " * (n_bytes // 27 + 1))[:n_bytes]


def filler(n: int) -> str:
    return "".join(f" tok{i}" for i in range(n))


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + "{" + ",".join(f"{k}={labels[k]}" for k in sorted(labels)) + "}"
            out[key.removesuffix("{}")] = s.value
    return out


def transfers(url: str) -> tuple[float, ...]:
    """(sent, sent tokens, received, received tokens, failures)."""
    m = metrics(url)
    keys = [f"sim:kv_transfer{n}_total{{direction={d}}}" for d in ("sent", "received")
            for n in ("s", "_tokens")]  # fmt: skip
    return (*(m[k] for k in keys), m["sim:kv_transfer_failures_total"])


def error(r: httpx.Response, status: int, needle: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] and needle in err["message"], err


async def sse(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---- vLLM (NixlConnector, toy proxy) ---------------------------------------------------

DECODE_SIDE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def vllm_prefill(url: str, body: dict[str, Any], rid: str) -> dict[str, Any]:
    body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": DECODE_SIDE}
    r = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_vllm_prefill_then_decode(vllm: dict[str, str]) -> None:
    text = unique_text(3 * BLOCK_BYTES + 100)
    tokens = math.ceil(len(text) / 4)
    rid = uuid.uuid4().hex
    p0, d0 = transfers(vllm["prefill"]), transfers(vllm["decode"])
    first = vllm_prefill(vllm["prefill"], {"prompt": text}, rid)
    assert first["id"] == f"cmpl-{rid}" and first["choices"][0]["text"] == filler(1)
    assert first["usage"]["prompt_tokens"] == tokens
    params = first["kv_transfer_params"]
    info = httpx.get(vllm["prefill"] + "/server_info", timeout=5).json()
    assert info["disaggregation_mode"] == "prefill"
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": info["engine_id"],
        "remote_block_ids": params["remote_block_ids"],
        "remote_host": "127.0.0.1",
        "remote_port": int(vllm["prefill"].rsplit(":", 1)[1]),
        "remote_request_id": rid,
        "tp_size": 1,
    }
    assert len(params["remote_block_ids"]) == 4

    body = {"prompt": text, "max_tokens": 5, "kv_transfer_params": params}
    headers = {"X-Request-Id": rid}
    r = httpx.post(vllm["decode"] + "/v1/completions", json=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == f"cmpl-{rid}" and out["choices"][0]["text"] == filler(5)
    assert out["usage"]["prompt_tokens"] == tokens
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "kv_transfer_params" not in out
    assert transfers(vllm["prefill"]) == (p0[0] + 1, p0[1] + tokens, *p0[2:])
    assert transfers(vllm["decode"]) == (*d0[:2], d0[2] + 1, d0[3] + tokens, d0[4])

    # pulled once: a second decode of the same transfer fails, naming the prefill worker
    r = httpx.post(vllm["decode"] + "/v1/completions", json=body, timeout=10)
    error(r, 503, vllm["prefill"])
    assert transfers(vllm["decode"])[4] == d0[4] + 1

    # the decode has the first 3 blocks cached now: only the rest is transferred
    rid2 = uuid.uuid4().hex
    again = vllm_prefill(vllm["prefill"], {"prompt": text}, rid2)
    d1 = transfers(vllm["decode"])
    body = {"prompt": text, "max_tokens": 2, "kv_transfer_params": again["kv_transfer_params"]}
    r = httpx.post(vllm["decode"] + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 512
    assert transfers(vllm["decode"])[3] == d1[3] + tokens - 3 * 512


async def test_vllm_streamed_chat(vllm: dict[str, str]) -> None:
    messages = [{"role": "user", "content": unique_text(BLOCK_BYTES + 10)}]
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        body = {"messages": messages, "max_tokens": 1, "kv_transfer_params": DECODE_SIDE}
        r = await client.post(vllm["prefill"] + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["object"] == "chat.completion" and "kv_transfer_params" in first
        body = {
            "messages": messages,
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
            "kv_transfer_params": first["kv_transfer_params"],
        }
        chunks = await sse(client, vllm["decode"] + "/v1/chat/completions", body)
    assert chunks[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks[:-2])
    assert text == filler(4) and chunks[-2]["usage"]["completion_tokens"] == 4
    # a prefill worker answers non-streamed
    body = {"messages": messages, "stream": True, "kv_transfer_params": DECODE_SIDE}
    error(httpx.post(vllm["prefill"] + "/v1/chat/completions", json=body), 400, "stream")


def test_vllm_roles_refuse_requests_without_their_fields(vllm: dict[str, str]) -> None:
    body = {"prompt": unique_text(100), "max_tokens": 1}
    before = metrics(vllm["prefill"])["vllm:prompt_tokens_total"]
    error(httpx.post(vllm["prefill"] + "/v1/completions", json=body), 400, "prefill worker")
    remote = {**body, "kv_transfer_params": {**DECODE_SIDE, "do_remote_decode": False}}
    error(httpx.post(vllm["prefill"] + "/v1/completions", json=remote), 400, "do_remote_decode")
    assert metrics(vllm["prefill"])["vllm:prompt_tokens_total"] == before  # nothing ran
    error(httpx.post(vllm["decode"] + "/v1/completions", json=body), 400, "decode worker")
    partial = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_block_ids": [1]}
    r = httpx.post(vllm["decode"] + "/v1/completions", json={**body, "kv_transfer_params": partial})
    error(r, 400, "remote_host, remote_port")


def test_vllm_decode_of_an_unknown_transfer_fails(vllm: dict[str, str]) -> None:
    info = httpx.get(vllm["prefill"] + "/server_info", timeout=5).json()
    port = int(vllm["prefill"].rsplit(":", 1)[1])
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": info["engine_id"],
        "remote_block_ids": [0],
        "remote_host": "127.0.0.1",
        "remote_port": port,
        "remote_request_id": "never-prefilled",
    }
    body = {"prompt": unique_text(100), "max_tokens": 1, "kv_transfer_params": params}
    failures = transfers(vllm["decode"])[4]
    error(httpx.post(vllm["decode"] + "/v1/completions", json=body, timeout=10), 503, "no KV")
    dead = {**params, "remote_port": free_port()}
    r = httpx.post(vllm["decode"] + "/v1/completions", json={**body, "kv_transfer_params": dead})
    error(r, 503, "prefill worker")
    assert transfers(vllm["decode"])[4] == failures + 2
    # the pull endpoint itself
    pull = {"remote_engine_id": "other", "remote_request_id": "x", "remote_block_ids": []}
    error(httpx.post(vllm["prefill"] + "/sim/kv_pull", json=pull), 404, "no KV")


# ---- SGLang (mini_lb) ------------------------------------------------------------------


def bootstrap(room: int | None = None) -> dict[str, Any]:
    room = random.getrandbits(63) if room is None else room
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": BOOTSTRAP, "bootstrap_room": room}


async def both(urls: dict[str, str], path: str, body: dict[str, Any]) -> list[httpx.Response]:
    """mini_lb: the same body to the prefill and the decode at once."""
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        return list(
            await asyncio.gather(client.post(urls["prefill"] + path, json=body),
                                 client.post(urls["decode"] + path, json=body))
        )  # fmt: skip


async def test_sglang_generate(sglang: dict[str, str]) -> None:
    text = unique_text(2 * BLOCK_BYTES + 50)
    tokens = math.ceil(len(text) / 4)
    p0, d0 = transfers(sglang["prefill"]), transfers(sglang["decode"])
    body = {"text": text, "sampling_params": {"max_new_tokens": 6}, **bootstrap()}
    prefill, decode = await both(sglang, "/generate", body)
    assert prefill.status_code == 200 and decode.status_code == 200, (prefill.text, decode.text)
    assert prefill.json()["text"] == filler(1)
    assert prefill.json()["meta_info"]["completion_tokens"] == 1
    out = decode.json()
    assert out["text"] == filler(6) and out["meta_info"]["prompt_tokens"] == tokens
    assert transfers(sglang["prefill"]) == (p0[0] + 1, p0[1] + tokens, *p0[2:])
    assert transfers(sglang["decode"]) == (*d0[:2], d0[2] + 1, d0[3] + tokens, d0[4])
    info = httpx.get(sglang["decode"] + "/server_info", timeout=5).json()
    assert info["disaggregation_mode"] == "decode"
    info = httpx.get(sglang["prefill"] + "/get_server_info", timeout=5).json()
    assert info["disaggregation_bootstrap_port"] == BOOTSTRAP
    # the room was consumed by the decode's ready read
    room = body["bootstrap_room"]
    r = httpx.get(f"http://127.0.0.1:{BOOTSTRAP}/sim/room/{room}", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


async def test_sglang_streamed_chat(sglang: dict[str, str]) -> None:
    messages = [{"role": "user", "content": unique_text(BLOCK_BYTES + 10)}]
    body = {"messages": messages, "max_tokens": 4, "stream": True, **bootstrap()}
    body["stream_options"] = {"include_usage": True}
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        prefill, decode = await asyncio.gather(
            sse(client, sglang["prefill"] + "/v1/chat/completions", body),
            sse(client, sglang["decode"] + "/v1/chat/completions", body),
        )
    for chunks, n in ((prefill, 1), (decode, 4)):
        assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == n
        assert "".join(c["choices"][0]["delta"]["content"] for c in chunks[:-2]) == filler(n)


def test_sglang_roles_refuse_requests_without_their_fields(sglang: dict[str, str]) -> None:
    body = {"prompt": unique_text(100), "max_tokens": 1}
    for role in ("prefill", "decode"):
        r = httpx.post(sglang[role] + "/v1/completions", json=body, timeout=5)
        error(r, 400, "bootstrap_room")
    other = {**body, **bootstrap(), "bootstrap_port": BOOTSTRAP + 1}
    r = httpx.post(sglang["prefill"] + "/v1/completions", json=other, timeout=5)
    error(r, 400, "not this prefill worker's")
    localhost = {**body, **bootstrap(), "bootstrap_host": "localhost"}
    r = httpx.post(sglang["prefill"] + "/v1/completions", json=localhost, timeout=5)
    assert r.status_code == 200, r.text


def test_sglang_decode_of_an_unknown_room_fails(sglang: dict[str, str]) -> None:
    failures = transfers(sglang["decode"])[4]
    body = {"prompt": unique_text(100), "max_tokens": 1, **bootstrap()}
    t0 = time.monotonic()
    r = httpx.post(sglang["decode"] + "/v1/completions", json=body, timeout=10)
    error(r, 503, "not ready after 0.5 s")
    assert 0.5 <= time.monotonic() - t0 < 5
    dead = {**body, "bootstrap_port": free_port()}
    error(httpx.post(sglang["decode"] + "/v1/completions", json=dead, timeout=10), 503, "unreach")
    assert transfers(sglang["decode"])[4] == failures + 2


# ---- both flavors ----------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_decode_first_token_waits_the_transfer(
    flavor: str, vllm: dict[str, str], sglang: dict[str, str], sim_worker_in_thread
) -> None:
    gbps = 0.02  # 1024 tokens x 128 KiB at 20 MB/s: 6.7 model s, 134 ms real at 50x
    text = unique_text(2 * BLOCK_BYTES)
    transfer_s = (0.002 + 1024 * KV_BYTES / (gbps * 1e9)) / SCALE
    slow = config(flavor, "decode", kv_transfer_gbps=gbps)
    with sim_worker_in_thread(slow, "on") as decode:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            body: dict[str, Any] = {"prompt": text, "max_tokens": 3, "stream": True}
            if flavor == "vllm":
                first = vllm_prefill(vllm["prefill"], {"prompt": text}, uuid.uuid4().hex)
                body["kv_transfer_params"] = first["kv_transfer_params"]
            else:
                body.update(bootstrap())
                await client.post(sglang["prefill"] + "/v1/completions", json=body)
            t0 = time.monotonic()
            async with client.stream("POST", decode + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                ttft = None
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and ttft is None:
                        ttft = time.monotonic() - t0
        assert transfers(decode)[3] == 1024
    assert ttft is not None and transfer_s <= ttft < transfer_s + 2


def test_both_role_ignores_pd_fields(sim_worker_in_thread) -> None:
    with sim_worker_in_thread(config("vllm", "both"), "on") as url:
        body = {"prompt": "hi", "max_tokens": 2, "kv_transfer_params": DECODE_SIDE, **bootstrap()}
        r = httpx.post(url + "/v1/completions", json=body, timeout=5)
        assert r.status_code == 200 and "kv_transfer_params" not in r.json()
        assert not any(k.startswith("sim:kv_transfer") for k in metrics(url))
        assert httpx.get(url + "/server_info", timeout=5).json()["disaggregation_mode"] == "null"


def test_options_and_config() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = ["sim-worker", "--flavor", "sglang", "--role", "prefill", "--kv-transfer-latency-ms",
            "3", "--kv-transfer-gbps", "50", "--kv-bytes-per-token", "1024",
            "--disaggregation-bootstrap-port", "9000", "--kv-hold-s", "5"]  # fmt: skip
    pd = config_from_args(parser.parse_args(argv)).pd
    assert pd == PdConfig("prefill", 0.003, 50.0, 1024, 9000, 5.0, 30.0, "127.0.0.1")
    assert pd.transfer_s(1000) == pytest.approx(0.003 + 1000 * 1024 / 50e9)
    defaults = config_from_args(parser.parse_args(["sim-worker"])).pd
    assert defaults == PdConfig() and defaults.bootstrap_port == 8998
    for bad in ({"role": "mixed"}, {"kv_transfer_gbps": 0}, {"kv_hold_s": 0}):
        with pytest.raises(ValueError):
            PdConfig(**bad)


def test_command_prints_its_bootstrap_port() -> None:
    """``--disaggregation-bootstrap-port 0``: a free port, printed; the listener serves."""
    root = Path(__file__).parents[3]
    port = free_port()
    cmd = [sys.executable, "-m", "router.cli", "sim-worker", "--port", str(port),
           "--flavor", "sglang", "--role", "prefill", "--disaggregation-bootstrap-port", "0",
           "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "SGLang bootstrap server on 127.0.0.1:" in line, line
        bootstrap_port = int(line.rsplit(":", 1)[1])
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "sim-worker did not become healthy"
            time.sleep(0.05)
        r = httpx.get(f"http://127.0.0.1:{bootstrap_port}/sim/room/1", timeout=5)
        assert r.status_code == 404
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert info["disaggregation_bootstrap_port"] == bootstrap_port
    finally:
        proc.terminate()
        proc.wait(10)

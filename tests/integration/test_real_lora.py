"""A LoRA adapter on real vLLM CPU workers: requests for it go only to the workers that list it.

Four workers of the tiny model: two of the session's three (no adapter) and two more started
with ``--enable-lora --lora-modules tiny-lora=DIR --max-loras 1 --max-lora-rank 8``
(``lora_workers``; the adapter is built by ``setup.sh install`` with peft, seeded, nothing
downloaded). vLLM's CPU backend serves it: its ``/v1/models`` lists ``tiny-lora`` with
``parent`` ``tiny``, its output differs from the base model's, and its ``/metrics`` carry
``vllm:lora_requests_info``. A worker without the adapter answers 404 for it itself.

The router reads every worker's ``/v1/models``; with round_robin (which would visit every
worker) and with the default picker: every adapter request's ``x-cache-router-worker`` names
an adapter worker (round_robin: both of them), base requests reach the others too, a model no
worker lists gets the router's own 404 ``model_not_found``, the router's metrics name the
adapter on exactly the adapter workers, and it reads their LoRA slots
(``vllm:lora_requests_info``, ``max_lora``) into ``/workers``.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from realworkers_support import (
    ENABLED,
    SCRIPTS,
    SKIP_REASON,
    complete,
    routed,
    text,
    unique,
    wait_until,
    worker_reading,
    workers_of,
)

from router.config import Settings

pytestmark = pytest.mark.skipif(not ENABLED, reason=SKIP_REASON)

N = 8  # requests for the adapter, and as many for the base model, per picker
HEADER = "x-cache-router-worker"


def models_of(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_workers_serve_the_adapter(real_workers, lora_workers) -> None:
    """vLLM CPU itself: the adapter is listed with its parent, answers, changes the output,
    and shows in the LoRA metric; a worker started without it does not know it."""
    name, prompt = lora_workers.name, text(1000, 200)
    for url in lora_workers.urls:
        listed = models_of(url)
        assert listed[name]["parent"] == "tiny", listed
        assert listed[name]["root"] == str(lora_workers.path)
        tuned = complete(url, prompt, max_tokens=8, model=name).json()
        base = complete(url, prompt, max_tokens=8).json()
        assert tuned["model"] == name
        assert tuned["choices"][0]["text"] != base["choices"][0]["text"], (tuned, base)
        reading = worker_reading(url)
        assert reading.max_lora == 1, reading
    plain = real_workers.urls[0]
    assert name not in models_of(plain)
    body = {"model": name, "prompt": prompt, "max_tokens": 2}
    r = httpx.post(f"{plain}/v1/completions", json=body, timeout=60)
    assert r.status_code == 404, r.text[:300]


@pytest.mark.parametrize("policy", ["round_robin", Settings().policy])
def test_adapter_requests_go_to_adapter_workers(real_workers, lora_workers, policy) -> None:
    name = lora_workers.name
    adapters = set(lora_workers.urls)
    plain = set(real_workers.urls[:2])
    urls = sorted(adapters | plain)
    args = ("--models-interval-s", "1", "--worker-metrics-interval-s", "1")
    with routed(urls, policy, *args) as svc:
        # a worker never read serves any model: wait until all four lists are in
        wait_until(
            lambda: all(w["models"] for w in workers_of(svc.url).values()), what="model lists"
        )
        listed = {url: set(w["adapters"]) for url, w in workers_of(svc.url).items()}
        assert listed == {url: {name} if url in adapters else set() for url in urls}, listed

        def send(i: int, model: str) -> str:
            prompt = unique(f"lora-{policy}-{i}") + text(97 * i, 300)
            r = complete(svc.url, prompt, max_tokens=4, model=model)
            assert r.json()["model"] == model
            return r.headers[HEADER]

        # mixed, 4 in flight: adapter requests only where the adapter is
        models = [name if i % 2 else "tiny" for i in range(2 * N)]
        with ThreadPoolExecutor(4) as pool:
            sent = list(zip(models, pool.map(send, range(2 * N), models), strict=True))
        to_adapter = [w for m, w in sent if m == name]
        to_base = [w for m, w in sent if m == "tiny"]
        print(f"\n{policy}: adapter -> {sorted(to_adapter)}\n{policy}: base -> {sorted(to_base)}")
        assert len(to_adapter) == len(to_base) == N
        assert set(to_adapter) <= adapters, to_adapter
        assert set(to_base) <= set(urls), to_base
        if policy == "round_robin":
            # one counter over all picks, each indexing the workers that serve the request's
            # model: consecutive picks for one model visit each of its workers once
            turn = [send(100 + i, name) for i in range(len(adapters))]
            assert sorted(turn) == sorted(adapters), turn
            turn = [send(200 + i, "tiny") for i in range(len(urls))]
            assert sorted(turn) == urls, turn

        r = httpx.post(
            f"{svc.url}/v1/completions",
            json={"model": "no-such-adapter", "prompt": "x", "max_tokens": 1},
            timeout=30,
        )
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found", r.text
        assert HEADER not in r.headers  # the router's answer: no worker was asked

        metrics = httpx.get(f"{svc.url}/metrics", timeout=10).text
        served = [
            (s.labels["model"], s.labels["worker"])
            for family in text_string_to_metric_families(metrics)
            if family.name == "cache_router_worker_model"
            for s in family.samples
            if s.labels["kind"] == "adapter" and s.value == 1
        ]
        assert sorted(served) == sorted((name, url) for url in adapters), served

        # the adapter workers' own LoRA slots (vllm:lora_requests_info), read by the scraper
        def reported() -> bool:
            known = workers_of(svc.url)
            return all(
                known[url]["lora"]["reported"] and known[url]["worker_metrics"]["max_lora"] == 1
                for url in adapters
            )

        wait_until(reported, what="the adapter workers' vllm:lora_requests_info")
        for url, w in workers_of(svc.url).items():
            print(f"{policy}: {url} lora {w['lora']}")
            if url in plain:
                assert w["lora"]["swaps"] == 0, w["lora"]


def test_tiny_lora_is_built_deterministically(real_workers, lora_workers, tmp_path) -> None:
    """setup.sh's adapter build (bench/real_workers/make_tiny_lora.py, peft) gives the same
    files again, whatever the hash seed: seeded weights, a config with sorted keys and no
    build path in it."""
    python = real_workers.model.parent / "venv" / "bin" / "python"
    again = tmp_path / "again"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "7"}
    script = SCRIPTS / "make_tiny_lora.py"
    subprocess.run(
        [str(python), str(script), "--base", str(real_workers.model), "--out", str(again)],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert sorted(p.name for p in again.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (again / name).read_bytes() == (lora_workers.path / name).read_bytes(), name

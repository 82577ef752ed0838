"""The simulated worker serving LoRA adapters, over real HTTP (vLLM's model list, errors and
``vllm:lora_requests_info``), and its command-line flags."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.fleet.models import parse_models
from router.fleet.worker_truth import parse_worker_metrics
from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.server import SimWorkerConfig, add_parser, config_from_args

LORAS = ("lora-a", "lora-b", "lora-c")


@pytest.fixture(scope="module")
def client(sim_worker_in_thread) -> Iterator[httpx.Client]:
    model = WorkerModelConfig(kv_capacity_tokens=256 * 512, max_loras=2, lora_load_s=0.2)
    config = SimWorkerConfig(model, model_name="base", time_scale=50.0, loras=LORAS)
    with sim_worker_in_thread(config) as url, httpx.Client(base_url=url, timeout=10) as c:
        yield c


def complete(client: httpx.Client, model: str, prompt: str, max_tokens: int = 2) -> dict:
    r = client.post(
        "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens}
    )
    assert r.status_code == 200, r.text
    return r.json()


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def families(client: httpx.Client) -> dict[str, list]:
    text = client.get("/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def swaps(client: httpx.Client) -> float:
    return families(client)["sim:lora_swaps"][0].value


def test_models_list_the_adapters_with_their_parent(client: httpx.Client) -> None:
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["base", *LORAS]
    assert data[0]["parent"] is None
    assert all(m["parent"] == "base" for m in data[1:])
    models, adapters = parse_models(client.get("/v1/models").content)  # as the router reads it
    assert models == {"base", *LORAS} and adapters == set(LORAS)


def test_an_adapters_prompt_cache_is_its_own(client: httpx.Client) -> None:
    prompt = f"[{uuid.uuid4().hex}] " + "lorem ipsum " * 400  # > 2 blocks of 2048 bytes
    assert cached(complete(client, "base", prompt)) == 0
    first = complete(client, "lora-a", prompt)
    assert first["model"] == "lora-a"  # as vLLM names the adapter in its answer
    assert cached(first) == 0  # the base model's blocks are no hit for the adapter
    assert cached(complete(client, "lora-b", prompt)) == 0  # nor lora-a's for lora-b
    assert cached(complete(client, "lora-a", prompt)) == 1024
    assert cached(complete(client, "base", prompt)) == 1024


def test_swaps_are_counted_and_only_for_adapters_not_resident(client: httpx.Client) -> None:
    before = swaps(client)
    complete(client, "lora-c", "x" * 100)
    complete(client, "lora-c", "y" * 100)  # resident now
    complete(client, "base", "z" * 100)  # the base model takes no slot
    assert swaps(client) - before == 1


def test_an_unknown_model_is_vllms_404(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError"
    assert "`nope` does not exist" in r.json()["error"]["message"]


async def test_lora_requests_info_is_vllms_and_the_router_reads_it(client: httpx.Client) -> None:
    """Three adapters at once on two slots: two run, the third waits; the newest label set
    (largest value) says so, and the router's parser finds the same."""
    url = str(client.base_url)
    async with httpx.AsyncClient(base_url=url, timeout=20) as ac:

        async def one(model: str) -> None:
            body = {"model": model, "prompt": uuid.uuid4().hex, "max_tokens": 2000}
            assert (await ac.post("/v1/completions", json=body)).status_code == 200

        tasks = [asyncio.create_task(one(m)) for m in LORAS]
        await asyncio.sleep(0.1)
        text = (await ac.get("/metrics")).text
        await asyncio.gather(*tasks)
    samples = {f.name: f.samples for f in text_string_to_metric_families(text)}
    info = samples["vllm:lora_requests_info"]
    assert {tuple(sorted(s.labels)) for s in info} == {
        ("max_lora", "running_lora_adapters", "waiting_lora_adapters")
    }
    newest = max(info, key=lambda s: s.value)
    assert newest.labels["max_lora"] == "2"
    running = set(newest.labels["running_lora_adapters"].split(","))
    waiting = set(newest.labels["waiting_lora_adapters"].split(","))
    assert len(running) == 2 and running | waiting == set(LORAS) and not running & waiting
    reading = parse_worker_metrics(text)
    assert reading.max_lora == 2 and reading.lora_running == running


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["sim-worker", "--lora", "a", "b", "--max-loras", "3", "--lora-load-ms", "20"]
    )
    config = config_from_args(args)
    assert config.loras == ("a", "b")
    assert config.model.max_loras == 3 and config.model.lora_load_s == pytest.approx(0.02)
    defaults = config_from_args(parser.parse_args(["sim-worker"]))
    assert defaults.loras == () and defaults.model.max_loras == 1  # vLLM's default


def test_config_rejects_bad_loras() -> None:
    with pytest.raises(ValueError, match="distinct"):
        SimWorkerConfig(model_name="m", loras=("a", "a"))
    with pytest.raises(ValueError, match="distinct"):
        SimWorkerConfig(model_name="m", loras=("m",))
    with pytest.raises(ValueError, match="max loras"):
        SimWorkerConfig(WorkerModelConfig(max_loras=0))

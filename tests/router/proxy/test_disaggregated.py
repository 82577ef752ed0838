"""Disaggregated serving through the router, in front of real sim workers in their PD roles.

Each sim worker checks its engine's fields and refuses a request without them (vLLM:
``kv_transfer_params``; SGLang: ``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room``),
and a decode worker really fetches the prefill's KV (vLLM: pulled from the prefill worker's
side channel; SGLang: the room polled on its bootstrap server), so a request served here
has gone through both legs as the engine defines them:

- both flavors, streamed and not, chat and completions (and SGLang's /generate): 200 from a
  decode worker, every prefill worker's transfers sent match the decode workers' received,
  every booking released on both roles, counted by protocol;
- a fleet with prefill workers but no decode worker: a clear 503;
- a decode worker killed in the middle of a replay: no request lost that had not started
  streaming (the rest are retried on the other decode worker, after a new prefill leg);
- ``cache-router serve --prefill URL URL --decode URL URL`` as it ships, no P/D flag given:
  ``--pd-protocol auto`` finds each engine's protocol, ``--policy ttft`` and
  ``--decode-policy decode_load`` pick, an SGLang prefill URL without a port has the default
  bootstrap port.

Misbehaving workers (who is blamed, what the client and ``/health`` see):
test_disaggregated_faults.py.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families

from traces.live.fleet import Service, free_port, start_service

SIM_ARGS = ["--time-scale", "50", "--log-level", "warning"]
SYSTEM = "You are a careful assistant who answers briefly. " * 40  # a multi-block prefix


def _start(
    flavor: str, role: str, i: int, default_bootstrap: bool = False
) -> tuple[Service, int | None]:
    """A sim worker; an SGLang prefill worker's bootstrap port: a free one, or with
    ``default_bootstrap`` SGLang's default (the worker's and the router's: no flag given)."""
    port = free_port()
    args = ["sim-worker", "--port", str(port), "--flavor", flavor, "--role", role, *SIM_ARGS]
    bootstrap = None
    if flavor == "sglang" and role == "prefill" and not default_bootstrap:
        bootstrap = free_port()
        args += ["--disaggregation-bootstrap-port", str(bootstrap)]
    return start_service(f"{flavor}-{role}-{i}", args, port), bootstrap


@pytest.fixture(params=["vllm", "sglang"], scope="module")
def fleet(request) -> Iterator[tuple[str, list, list]]:
    """(flavor, [(prefill, bootstrap port)] * 2, [decode] * 2)."""
    flavor = request.param
    started: list[Service] = []
    try:
        prefill = [_start(flavor, "prefill", i) for i in range(2)]
        started += [service for service, _ in prefill]
        decode = [_start(flavor, "decode", i)[0] for i in range(2)]
        started += decode
        yield flavor, prefill, decode
    finally:
        for service in started:
            service.stop()


def _router(router_server, fleet, **settings):
    flavor, prefill, decode = fleet
    flags = []
    for service, bootstrap in prefill:
        flags += [service.url] + ([str(bootstrap)] if bootstrap else [])
    return router_server(
        prefill_workers=flags,
        decode_workers=[d.url for d in decode],
        pd_protocol=flavor,
        **settings,
    )


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _chat(i: int, stream: bool) -> dict:
    user = f"question {i}: " + "why? " * 30
    return {"model": "sim-model", "max_tokens": 6, "stream": stream,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": user}]}  # fmt: skip


def _answer_text(r: httpx.Response, stream: bool) -> str:
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]", r.text
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), r.text
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_every_request_is_prefilled_and_decoded_by_the_engines_protocol(router_server, fleet):
    flavor, prefill, decode = fleet
    router = _router(router_server, fleet)
    decode_urls = {d.url for d in decode}
    with httpx.Client(base_url=router.url, timeout=30) as client:
        served = 0
        for i in range(8):
            stream = i % 2 == 1
            r = client.post("/v1/chat/completions", json=_chat(i, stream))
            assert r.status_code == 200, r.text
            assert r.headers["x-cache-router-worker"] in decode_urls
            assert len(_answer_text(r, stream)) > 0
            served += 1
        # the client's request id reaches both legs (the workers name their answers by it)
        r = client.post("/v1/chat/completions", json=_chat(50, False),
                        headers={"x-request-id": "client-id-7"})  # fmt: skip
        assert r.status_code == 200 and "client-id-7" in r.json()["id"], r.text
        served += 1
        body = {"model": "sim-model", "prompt": SYSTEM + "complete this", "max_tokens": 4}
        for stream in (False, True):
            r = client.post("/v1/completions", json={**body, "stream": stream})
            assert r.status_code == 200, r.text
            served += 1
        if flavor == "sglang":  # its native endpoint too
            native = {"text": SYSTEM + "go", "sampling_params": {"max_new_tokens": 4}}
            r = client.post("/generate", json=native)
            assert r.status_code == 200, r.text
            assert r.headers["x-cache-router-worker"] in decode_urls
            served += 1
    sent = sum(_metric(p.url, "sim:kv_transfers_total", direction="sent") for p, _ in prefill)
    received = sum(_metric(d.url, "sim:kv_transfers_total", direction="received") for d in decode)
    assert sent >= served and received == served  # (a prefill leg may be retried)
    assert _metric(router.url, "cache_router_disaggregated_requests_total",
                   protocol=flavor, outcome="ok") == served  # fmt: skip
    # both roles were used, by the pickers of each role, and everything was released
    workers = httpx.get(router.url + "/workers", timeout=5).json()
    assert {w["role"] for w in workers} == {"prefill", "decode"}
    assert all(w["num_requests"] == 0 and w["held_tokens"] == 0 for w in workers)
    assert all(w["requests_total"] > 0 for w in workers)
    # the prefill workers' shadows learn from their cached-token reports; decodes' do not
    for w in workers:
        assert (w["accuracy"]["requests"] > 0) == (w["role"] == "prefill")


def test_no_decode_worker_is_a_clear_503_until_one_is_added(router_server, fleet):
    flavor, prefill, decode = fleet
    service, bootstrap = prefill[0]
    flags = [service.url] + ([str(bootstrap)] if bootstrap else [])
    router = router_server(prefill_workers=flags, pd_protocol=flavor)
    r = httpx.post(router.url + "/v1/chat/completions", json=_chat(0, False), timeout=10)
    assert r.status_code == 503, r.text
    assert "decode" in r.json()["error"]["message"]
    workers = httpx.get(router.url + "/workers", timeout=5).json()
    assert workers[0]["num_requests"] == 0
    bad = httpx.post(router.url + "/workers", json={"url": decode[0].url, "role": "x"}, timeout=5)
    assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
    added = httpx.post(router.url + "/workers", json={"url": decode[0].url, "role": "decode"},
                       timeout=5)  # fmt: skip
    assert added.status_code == 201 and added.json()["role"] == "decode"
    r = httpx.post(router.url + "/v1/chat/completions", json=_chat(1, False), timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-cache-router-worker"] == decode[0].url


def test_a_decode_worker_killed_mid_replay_loses_no_request_not_yet_streaming(router_server, fleet):
    flavor, prefill, _ = fleet
    # decode workers of their own: one of them is killed
    decode = [_start(flavor, "decode", 10 + i)[0] for i in range(2)]
    try:
        router = _router(router_server, (flavor, prefill, decode), health_interval_s=5.0)
        victim = decode[0]
        results: list[tuple[bool, int, str]] = []

        def one(i: int) -> tuple[bool, int, str]:
            stream = i % 2 == 0
            body = {**_chat(100 + i, stream), "max_tokens": 40}
            r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=60)
            return stream, r.status_code, r.text

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(one, i) for i in range(40)]
            assert wait_until(
                lambda: _metric(victim.url, "sim:kv_transfers_total", direction="received") >= 3,
                timeout=30,
            )
            victim.process.send_signal(signal.SIGKILL)
            results = [f.result(timeout=90) for f in futures]
        cut = [text for stream, status, text in results if stream and "worker_stream_cut" in text]
        failed = [
            (stream, status, text[:200])
            for stream, status, text in results
            if status != 200 or (stream and "[DONE]" not in text)
        ]
        assert not failed, failed  # every request either done, or cut after it streamed
        for text in cut:  # a cut stream had started: it holds tokens before the error event
            assert text.count("data:") >= 3
        hit = _metric(router.url, "cache_router_upstream_errors_total", worker=victim.url)
        print(
            f"\n{flavor}: {len(cut)} streams cut, {hit:.0f} failed exchanges with the victim, "
            f"{_metric(router.url, 'cache_router_retries_total'):.0f} retries"
        )
        assert hit > 0  # the kill hit requests in flight there
        time.sleep(0.2)
        workers = httpx.get(router.url + "/workers", timeout=5).json()
        assert all(w["num_requests"] == 0 for w in workers)
    finally:
        for service in decode:
            service.stop()


def test_a_dead_prefill_worker_is_retried_elsewhere_and_taken_out(router_server, fleet):
    """A prefill leg that cannot connect: another prefill worker serves the request (SGLang:
    the decode leg already waiting in the dead worker's room is cancelled first), the dead
    worker's circuit opens, and nothing stays booked."""
    flavor, prefill, decode = fleet
    dead = f"http://127.0.0.1:{free_port()}"
    service, bootstrap = prefill[0]
    flags = [dead] + (["9"] if bootstrap else []) + [service.url]
    flags += [str(bootstrap)] if bootstrap else []
    router = router_server(prefill_workers=flags, decode_workers=[decode[0].url],
                           pd_protocol=flavor, policy="round_robin",
                           health_interval_s=30.0)  # fmt: skip
    with httpx.Client(base_url=router.url, timeout=30) as client:
        for i in range(6):
            r = client.post("/v1/chat/completions", json=_chat(200 + i, i % 2 == 1))
            assert r.status_code == 200, r.text
            assert r.headers["x-cache-router-worker"] == decode[0].url
    workers = {w["url"]: w for w in httpx.get(router.url + "/workers", timeout=5).json()}
    assert not workers[dead]["healthy"] and workers[dead]["requests_total"] >= 1
    assert all(w["num_requests"] == 0 and w["held_tokens"] == 0 for w in workers.values())
    assert _metric(router.url, "cache_router_retries_total", reason="connect_error") >= 1


SGLANG_DEFAULT_BOOTSTRAP = 8998  # sglang's --disaggregation-bootstrap-port, and the router's


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_serve_as_it_ships_in_front_of_either_engine(flavor):
    """No --pd-protocol (auto: the engine of each prefill worker's /metrics), no --policy,
    no --decode-policy, and for SGLang one prefill URL with no bootstrap port (8998, the
    engine's default too): every request answered by a decode worker, by the engine's
    protocol, from the first one on."""
    if flavor == "sglang" and not _port_free(SGLANG_DEFAULT_BOOTSTRAP):
        pytest.skip(f"port {SGLANG_DEFAULT_BOOTSTRAP} (SGLang's default bootstrap) is taken")
    started: list[Service] = []
    try:
        prefill = [_start(flavor, "prefill", 20, default_bootstrap=True)]
        started.append(prefill[0][0])
        prefill.append(_start(flavor, "prefill", 21))
        started.append(prefill[1][0])
        decode = [_start(flavor, "decode", 20 + i)[0] for i in range(2)]
        started += decode
        flags = [service.url for service, _ in prefill] + (
            [str(prefill[1][1])] if prefill[1][1] else []
        )
        port = free_port()
        args = ["serve", "--port", str(port), "--prefill", *flags,
                "--decode", *(d.url for d in decode), "--log-level", "warning"]  # fmt: skip
        router = start_service(f"serve-{flavor}", args, port)
        started.append(router)
        decode_urls = {d.url for d in decode}
        served = 0
        with httpx.Client(base_url=router.url, timeout=30) as client:
            for i in range(8):
                stream = i % 2 == 1
                if i % 4 < 2:
                    r = client.post("/v1/chat/completions", json=_chat(300 + i, stream))
                else:
                    body = {"model": "sim-model", "prompt": SYSTEM + f"{i}", "max_tokens": 4}
                    r = client.post("/v1/completions", json={**body, "stream": stream})
                assert r.status_code == 200, (i, r.text)
                assert r.headers["x-cache-router-worker"] in decode_urls
                if i % 4 < 2:
                    assert len(_answer_text(r, stream)) > 0
                served += 1
        assert _metric(router.url, "cache_router_disaggregated_requests_total",
                       protocol=flavor, outcome="ok") == served  # fmt: skip
        workers = httpx.get(router.url + "/workers", timeout=5).json()
        assert all(w["num_requests"] == 0 for w in workers)
        assert {w["worker_metrics"]["engine"] for w in workers if w["role"] == "prefill"} == {
            flavor
        }
        received = sum(
            _metric(d.url, "sim:kv_transfers_total", direction="received") for d in decode
        )
        assert received == served
    finally:
        for service in reversed(started):
            service.stop()

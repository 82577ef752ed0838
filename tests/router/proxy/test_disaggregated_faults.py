"""A disaggregated fleet with a worker that misbehaves: who is blamed, what the client gets,
and what ``/health`` says. The broken worker is :class:`~pd_support.PdWorker`, a real
server on 127.0.0.1 answering as told; the good ones are sim workers in their P/D roles, or
PdWorkers answering as the engine does where a sim worker cannot play along (``null``
params, an SGLang room that fails):

- a vLLM prefill worker's 200 that is no prefill answer (not JSON, not an object, no
  ``kv_transfer_params``, params that are not an object) is a 502 ``bad_prefill_response``
  and that worker's failure, retried on another prefill worker; ``null`` params are a
  connector that needs none (the decode leg gets the request as it is);
- request failures never take out the last prefill worker, nor the last decode worker; a
  healthy decode worker does not keep the last prefill worker in;
- ``/health`` is 503 without a healthy prefill worker, or without a healthy decode worker;
- an SGLang decode leg that times out waiting for a hung prefill leg is not blamed, nor one
  that fails for want of the KV of a prefill leg failing at the same time; a slow prefill
  leg that answers is never blamed for its decode's own failure (a timeout while it runs,
  or a 502 after which it is cancelled);
- a decode worker that cuts a whole (not streamed) answer short is retried like one that
  sent nothing: the client never gets half a JSON body under a 200.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import wait_until

from traces.live.fleet import Service, free_port, start_service

sys.path.insert(0, str(Path(__file__).parent))

from pd_support import (
    CLOSE,
    CUT_BODY,
    GARBAGE,
    HANG,
    NULL_KV,
    OK,
    TEXT,
    Handoff,
    PdWorker,
    WorkerLoop,
)

CHAT = {"model": "sim-model", "max_tokens": 4,
        "messages": [{"role": "user", "content": "why is the sky blue? " * 20}]}  # fmt: skip


@pytest.fixture(scope="module")
def sim() -> Iterator[dict[str, Service]]:
    """A vLLM-flavour sim prefill worker and decode worker."""
    started: dict[str, Service] = {}
    try:
        for role in ("prefill", "decode"):
            port = free_port()
            args = ["sim-worker", "--port", str(port), "--flavor", "vllm", "--role", role,
                    "--time-scale", "50", "--log-level", "warning"]  # fmt: skip
            started[role] = start_service(f"vllm-{role}", args, port)
        yield started
    finally:
        for service in started.values():
            service.stop()


@pytest.fixture
def pd() -> Iterator[Callable[..., PdWorker]]:
    """``pd(role, flavor, behaviour)``: a started :class:`PdWorker`, closed after the test."""
    loop, handoff, made = WorkerLoop(), Handoff(), []

    def make(role: str, flavor: str = "vllm", behaviour: str = OK, **knobs) -> PdWorker:
        knobs.setdefault("model", "sim-model")
        worker = loop.run(PdWorker(role, flavor, handoff, **knobs).start())
        worker.behaviour = behaviour
        made.append(worker)
        return worker

    yield make
    for worker in made:
        loop.loop.call_soon_threadsafe(worker.close)
    loop.close()


def _workers(router) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router.url + "/workers", timeout=5).json()}


def _chat(router, n: int) -> list[httpx.Response]:
    with httpx.Client(base_url=router.url, timeout=30) as client:
        return [client.post("/v1/chat/completions", json=CHAT) for _ in range(n)]


def _error_code(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str), r.text
    return error["code"]


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_a_vllm_prefill_answering_no_prefill_result_is_a_502_counted_against_it(
    router_server, sim, pd, garbage
):
    bad = pd("prefill", behaviour=garbage)
    decode = sim["decode"].url
    router = router_server(prefill_workers=[bad.url], decode_workers=[decode], pd_protocol="vllm")
    for r in _chat(router, 4):
        assert r.status_code == 502, r.text
        assert _error_code(r) == "bad_prefill_response"
    workers = _workers(router)
    # the prefill worker failed, not the client's request nor the decode worker; the last
    # prefill worker stays in
    assert workers[bad.url]["consecutive_failures"] == 4 and workers[bad.url]["healthy"]
    assert workers[decode]["consecutive_failures"] == 0 and workers[decode]["requests_total"] == 0
    assert all(w["num_requests"] == 0 and w["held_tokens"] == 0 for w in workers.values())


def test_a_garbage_prefill_worker_is_retried_elsewhere_and_taken_out(router_server, sim, pd):
    bad = pd("prefill", behaviour="garbage:not_json")
    good, decode = sim["prefill"].url, sim["decode"].url
    router = router_server(prefill_workers=[bad.url, good], decode_workers=[decode],
                           pd_protocol="vllm", policy="round_robin",
                           health_failure_threshold=2, health_interval_s=30.0)  # fmt: skip
    for r in _chat(router, 6):
        assert r.status_code == 200 and r.headers["x-cache-router-worker"] == decode, r.text
    workers = _workers(router)
    assert not workers[bad.url]["healthy"] and "kv_transfer_params" not in str(
        workers[bad.url]["last_error"]
    )
    assert "not JSON" in workers[bad.url]["last_error"]
    assert (
        workers[good]["consecutive_failures"] == 0 and workers[decode]["consecutive_failures"] == 0
    )


def test_null_kv_transfer_params_are_a_connector_that_needs_none(router_server, pd):
    prefill, decode = pd("prefill", behaviour=NULL_KV), pd("decode")
    router = router_server(prefill_workers=[prefill.url], decode_workers=[decode.url],
                           pd_protocol="vllm")  # fmt: skip
    for r in _chat(router, 3):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == TEXT
    # the decode legs came without kv_transfer_params, as the prefill gave none
    assert decode.requests == 3 and decode.refused == [] and prefill.refused == []


def test_request_failures_never_take_out_the_last_prefill_worker(router_server, sim, pd):
    cut = pd("prefill", behaviour=CUT_BODY)  # 200, half its body, closed
    decode = sim["decode"].url
    router = router_server(prefill_workers=[cut.url], decode_workers=[decode], pd_protocol="vllm",
                           health_failure_threshold=1, health_interval_s=30.0)  # fmt: skip
    for r in _chat(router, 5):
        assert r.status_code == 502 and _error_code(r) == "worker_reset", r.text
    workers = _workers(router)
    assert workers[cut.url]["healthy"] and workers[cut.url]["consecutive_failures"] == 5
    assert httpx.get(router.url + "/health", timeout=5).status_code == 200
    # with another prefill worker, the broken one is taken out and the other serves
    good = sim["prefill"].url
    router = router_server(prefill_workers=[cut.url, good], decode_workers=[decode],
                           pd_protocol="vllm", policy="round_robin",
                           health_failure_threshold=1, health_interval_s=30.0)  # fmt: skip
    assert all(r.status_code == 200 for r in _chat(router, 4))
    assert not _workers(router)[cut.url]["healthy"]


def test_request_failures_never_take_out_the_last_decode_worker(router_server, sim, pd):
    broken = pd("decode", behaviour="status:500")
    router = router_server(prefill_workers=[sim["prefill"].url], decode_workers=[broken.url],
                           pd_protocol="vllm", health_failure_threshold=1,
                           health_interval_s=30.0)  # fmt: skip
    for r in _chat(router, 4):  # its own answer, relayed: no other decode worker is left
        assert r.status_code == 500 and r.headers["x-cache-router-worker"] == broken.url
    workers = _workers(router)
    assert workers[broken.url]["healthy"] and workers[broken.url]["consecutive_failures"] == 4
    assert workers[sim["prefill"].url]["consecutive_failures"] == 0


@pytest.mark.parametrize("dead_role", ["prefill", "decode"])
def test_health_is_503_without_a_healthy_worker_of_either_role(router_server, pd, dead_role):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: its probes fail
    alive = pd("decode" if dead_role == "prefill" else "prefill")
    roles = {dead_role: [dead], ("decode" if dead_role == "prefill" else "prefill"): [alive.url]}
    router = router_server(prefill_workers=roles["prefill"], decode_workers=roles["decode"],
                           pd_protocol="vllm", health_failure_threshold=1)  # fmt: skip
    assert wait_until(lambda: not _workers(router)[dead]["healthy"], 10)
    health = httpx.get(router.url + "/health", timeout=5)
    assert health.status_code == 503, health.text
    body = health.json()
    assert body["status"] == "unavailable" and body["healthy_workers"] == 1
    assert body["healthy_by_role"] == {dead_role: 0, alive.role: 1}
    r = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert r.status_code == 503 and _error_code(r) == "no_healthy_worker", r.text


def test_an_sglang_decode_waiting_for_a_hung_prefill_is_not_blamed(router_server, pd):
    bootstrap = free_port()
    prefill = pd("prefill", "sglang", HANG, bootstrap_port=bootstrap)
    decode = pd("decode", "sglang", kv_wait_s=10.0)  # waits for the KV longer than the router
    router = router_server(prefill_workers=[prefill.url, str(bootstrap)],
                           decode_workers=[decode.url], pd_protocol="sglang",
                           read_timeout_s=0.5, health_interval_s=30.0)  # fmt: skip
    for r in _chat(router, 3):
        assert r.status_code == 504 and _error_code(r) == "upstream_timeout", r.text
    workers = _workers(router)
    assert workers[prefill.url]["consecutive_failures"] == 3
    assert workers[decode.url]["consecutive_failures"] == 0
    assert all(w["num_requests"] == 0 for w in workers.values())


def test_an_sglang_decode_failing_with_its_prefill_leg_is_not_blamed(router_server, pd):
    """The decode answers 503 as soon as its prefill's room fails, about when that prefill
    closes its connection: the prefill worker is the one to blame and to replace."""
    ports = [free_port(), free_port()]
    broken = pd("prefill", "sglang", CLOSE, bootstrap_port=ports[0])
    good = pd("prefill", "sglang", bootstrap_port=ports[1])
    decode = pd("decode", "sglang")
    router = router_server(prefill_workers=[broken.url, str(ports[0]), good.url, str(ports[1])],
                           decode_workers=[decode.url], pd_protocol="sglang",
                           policy="round_robin", health_interval_s=30.0)  # fmt: skip
    for r in _chat(router, 4):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == TEXT
    workers = _workers(router)
    assert workers[broken.url]["consecutive_failures"] >= 1
    assert workers[decode.url]["consecutive_failures"] == 0 and workers[decode.url]["healthy"]


@pytest.mark.parametrize("failure", [HANG, "status:502"])
def test_a_slow_sglang_prefill_is_not_blamed_for_its_decode_failing(router_server, pd, failure):
    """The prefill answers slowly (its head, then its body, 0.35 s apart: never silent for
    the 0.6 s read timeout) beside a decode that fails on its own: a hung one times out while
    the prefill leg runs, one answering 502 has that leg cancelled after PREFILL_NEWS_S.
    The decode worker is counted, never the prefill, and every booking is released."""
    bootstrap = free_port()
    prefill = pd("prefill", "sglang", bootstrap_port=bootstrap, pace_s=0.35)
    decode = pd("decode", "sglang", failure)
    router = router_server(prefill_workers=[prefill.url, str(bootstrap)],
                           decode_workers=[decode.url], pd_protocol="sglang",
                           read_timeout_s=0.6, health_interval_s=30.0)  # fmt: skip
    (r,) = _chat(router, 1)
    assert r.status_code == (504 if failure == HANG else 502), r.text
    workers = _workers(router)
    assert workers[prefill.url]["consecutive_failures"] == 0, workers[prefill.url]
    assert workers[decode.url]["consecutive_failures"] == 1, workers[decode.url]
    assert all(w["num_requests"] == 0 for w in workers.values())


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_decode_cutting_a_whole_answer_short_is_retried_on_another(router_server, pd, flavor):
    bootstrap = free_port()
    prefill = pd("prefill", flavor, bootstrap_port=bootstrap)
    cut, good = pd("decode", flavor, CUT_BODY), pd("decode", flavor)
    flags = [prefill.url] + ([str(bootstrap)] if flavor == "sglang" else [])
    router = router_server(prefill_workers=flags, decode_workers=[cut.url, good.url],
                           pd_protocol=flavor, health_interval_s=30.0)  # fmt: skip
    completion = {"model": "sim-model", "prompt": "once upon a time " * 20, "max_tokens": 4}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", completion)):
        r = httpx.post(router.url + path, json=body, timeout=30)
        assert r.status_code == 200 and r.headers["x-cache-router-worker"] == good.url, r.text
        choice = orjson.loads(r.content)["choices"][0]
        assert choice.get("text", choice.get("message", {}).get("content")) == TEXT
    assert cut.requests >= 1 and _workers(router)[cut.url]["consecutive_failures"] == cut.requests

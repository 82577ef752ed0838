"""``--dispatch-hold-tokens``: streamed requests wait at the router while their worker has
prefill in flight, and go in the ttft policy's order (shortest predicted prefill first)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.router.conftest import wait_until

LONG = "a long cold prompt " * 2000  # about 9.5k pseudo-tokens
SHORT = "a short one"


def _stream(url: str, prompt: str, out: list, delay: float = 0.0) -> None:
    body = {"model": "fake-model", "prompt": prompt, "max_tokens": 4, "stream": True}
    headers = {"x-fake-delay": str(delay)}
    try:
        with httpx.stream(
            "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=20
        ) as r:
            r.read()
            out.append(r.status_code)
    except httpx.HTTPError as exc:
        out.append(type(exc).__name__)


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("cache_router_dispatch"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _prompts(worker) -> list[str]:
    return [q["body"]["prompt"] for q in worker.requests if q["path"] == "/v1/completions"]


def _busy(fake_workers, router_server, out: list, prompt: str = "first " + LONG):
    """One worker behind a router holding past 1 token, busy with a slow first prefill of
    ``prompt``: (worker, router, the first request's thread)."""
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], policy="ttft", dispatch_hold_tokens=1)
    first = threading.Thread(target=_stream, args=(router.url, prompt, out, 1.0))
    first.start()
    assert wait_until(lambda: worker.prefilling == 1)
    return worker, router, first


def _held_in_turn(router, prompts: list[str], out: list) -> list[threading.Thread]:
    """Each of ``prompts`` sent once the one before it is held at the router."""
    threads = []
    for n, prompt in enumerate(prompts, start=1):
        threads.append(threading.Thread(target=_stream, args=(router.url, prompt, out)))
        threads[-1].start()
        assert wait_until(lambda n=n: _metrics(router.url).get("cache_router_dispatch_held") == n)
    return threads


def test_held_requests_go_when_their_worker_has_room_shortest_first(fake_workers, router_server):
    out: list = []
    worker, router, first = _busy(fake_workers, router_server, out)
    # while its prefill is in flight, a long prompt and then a short one wait at the router
    threads = _held_in_turn(router, [LONG, SHORT], out)
    assert len(_prompts(worker)) == 1  # nothing more reached the worker
    for t in (first, *threads):
        t.join(20)
    assert out == [200, 200, 200]
    # the short prompt went first when there was room, though sent after the long one
    assert _prompts(worker) == ["first " + LONG, SHORT, LONG]
    m = _metrics(router.url)
    assert m["cache_router_dispatch_held"] == 0
    assert m["cache_router_dispatch_sent_prefill_tokens"] == 0
    assert m["cache_router_dispatch_held_requests_total"] == 2


def test_a_turn_on_a_held_prefix_goes_after_the_request_that_computes_it(
    fake_workers, router_server
):
    """The next turn's prefix is booked (so it is priced short) but not computed while its
    first turn is held: released first it would compute it itself; it goes right after."""
    out: list = []
    worker, router, first = _busy(fake_workers, router_server, out)
    turn = LONG + " and the next turn"
    threads = _held_in_turn(router, [LONG, turn, SHORT], out)
    for t in (first, *threads):
        t.join(20)
    assert out == [200] * 4
    assert _prompts(worker) == ["first " + LONG, SHORT, LONG, turn]
    assert _metrics(router.url)["cache_router_dispatch_held"] == 0


def test_a_client_gone_while_held_leaves_nothing_behind(fake_workers, router_server):
    out: list = []
    worker, router, first = _busy(fake_workers, router_server, out, LONG)
    body = json.dumps({"model": "fake-model", "prompt": SHORT, "max_tokens": 4, "stream": True})
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n{body}".encode()
        )
        assert wait_until(lambda: _metrics(router.url).get("cache_router_dispatch_held") == 1)
    # the client left while held
    assert wait_until(lambda: _metrics(router.url).get("cache_router_dispatch_held") == 0)
    first.join(20)
    assert out == [200]
    assert _prompts(worker) == [LONG]  # the one that left never reached the worker
    pool = router.app.pool  # every count released once: in flight, the worker's bookings
    assert wait_until(lambda: pool.stats.in_flight == 0)
    assert pool.workers[0].state.num_requests == 0
    # the count is clean: a new request goes at once
    _stream(router.url, SHORT, out)
    assert out == [200, 200] and _prompts(worker) == [LONG, SHORT]
    assert _metrics(router.url)["cache_router_dispatch_sent_prefill_tokens"] == 0


def test_plain_answers_and_routers_without_the_flag_are_not_held(fake_workers, router_server):
    (worker,) = fake_workers(1)
    for hold in (1, 0):
        router = router_server(workers=[worker.url], policy="ttft", dispatch_hold_tokens=hold)
        out: list = []
        first = threading.Thread(target=_stream, args=(router.url, LONG, out, 1.0))
        first.start()
        assert wait_until(lambda: worker.prefilling == 1)
        if hold:  # a plain (not streamed) request is neither held nor counted
            body = {"model": "fake-model", "prompt": SHORT, "max_tokens": 4}
            r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=20)
        else:  # no hold: a streamed one goes at once
            r = httpx.post(
                f"{router.url}/v1/completions",
                json={"model": "fake-model", "prompt": SHORT, "max_tokens": 4, "stream": True},
                timeout=20,
            )
        assert r.status_code == 200
        assert worker.prefilling == 1  # answered while the first one still prefills
        first.join(20)
        assert out == [200]


@pytest.mark.parametrize("engine_priority", [False, True])
def test_serve_holds_by_default_and_not_with_engine_priority(
    fake_workers, router_server, engine_priority
):
    """The defaults as shipped (no hold flag): 8192 tokens with ttft, so a streamed request
    waits while its worker prefills one of about 9.5k; with --engine-priority it goes."""
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], policy="ttft", engine_priority=engine_priority)
    out: list = []
    first = threading.Thread(target=_stream, args=(router.url, "first " + LONG, out, 1.0))
    first.start()
    assert wait_until(lambda: worker.prefilling == 1)
    if engine_priority:  # answered at once, while the first one still prefills
        _stream(router.url, SHORT, out)
        assert worker.prefilling == 1
        assert "cache_router_dispatch_held" not in _metrics(router.url)
        first.join(20)
    else:
        short = threading.Thread(target=_stream, args=(router.url, SHORT, out))
        short.start()
        assert wait_until(lambda: _metrics(router.url).get("cache_router_dispatch_held") == 1)
        assert worker.prefilling == 1  # nothing more reached the worker
        for t in (first, short):
            t.join(20)
    assert sorted(out) == [200, 200]


def test_the_endpoint_picker_refuses_dispatch_hold(capsys):
    from router.cli import main

    argv = ["epp", "--worker", "http://127.0.0.1:9", "--plaintext", "--dispatch-hold-tokens", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--dispatch-hold-tokens" in err and "cache-router serve" in err

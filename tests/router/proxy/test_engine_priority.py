"""``--engine-priority``: the proxy adds the engine's ``priority`` to what the workers get."""

from __future__ import annotations

import threading

import httpx
import pytest

from router.core.engine_priority import CLIENT_BAND
from tests.router.conftest import wait_until

PROMPT = "the same long prefix " * 200


def _send(router, prompt: str = PROMPT, **extra) -> None:
    body = {"model": "fake-model", "prompt": prompt, "max_tokens": 4, **extra}
    r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text


def _forwarded(workers) -> list[dict]:
    return [q["body"] for w in workers for q in w.requests if q["path"] == "/v1/completions"]


def test_the_ttft_router_sets_an_integer_priority_on_each_request(fake_workers, router_server):
    workers = fake_workers(2)
    router = router_server(workers=[w.url for w in workers], policy="ttft", engine_priority=True)
    _send(router)
    _send(router, priority=2)  # the client's own priority stays the major key
    first, second = _forwarded(workers)
    assert isinstance(first["priority"], int) and 0 < first["priority"] < CLIENT_BAND
    assert second["priority"] // CLIENT_BAND == 2
    assert first["prompt"] == second["prompt"] == PROMPT  # the rest of the body as sent


@pytest.mark.parametrize(
    ("policy", "flag"), [("ttft", False), ("llmd_precise", True), ("round_robin", True)]
)
def test_no_priority_without_the_flag_or_with_a_picker_that_sets_none(
    fake_workers, router_server, policy, flag
):
    workers = fake_workers(2)
    router = router_server(workers=[w.url for w in workers], policy=policy, engine_priority=flag)
    _send(router)
    _send(router, priority=3)
    first, second = _forwarded(workers)
    assert "priority" not in first
    assert second["priority"] == 3  # the client's, untouched


def test_a_client_priority_that_is_no_integer_passes_untouched(fake_workers, router_server):
    workers = fake_workers(1)
    router = router_server(workers=[w.url for w in workers], policy="ttft", engine_priority=True)
    _send(router, priority="high")  # the fake worker accepts it; vLLM would answer 400
    (body,) = _forwarded(workers)
    assert body["priority"] == "high"


def test_the_endpoint_picker_refuses_engine_priority(capsys):
    from router.cli import main

    argv = ["epp", "--worker", "http://127.0.0.1:9", "--plaintext", "--engine-priority"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--engine-priority" in err and "cache-router serve" in err


def test_a_streamed_request_keeps_the_usage_the_router_asked_for(fake_workers, router_server):
    workers = fake_workers(1)
    router = router_server(workers=[w.url for w in workers], policy="ttft", engine_priority=True)
    body = {"model": "fake-model", "prompt": PROMPT, "max_tokens": 4, "stream": True}
    body["stream_options"] = {"continuous_usage_stats": False}
    with httpx.stream("POST", f"{router.url}/v1/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        r.read()
    (sent,) = _forwarded(workers)
    assert isinstance(sent["priority"], int)
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


def test_a_turn_on_a_prefix_still_in_the_engines_queue_goes_after_it(fake_workers, router_server):
    """The next turn's prefix is booked (priced short) but not computed while its first turn
    waits in the engine: its priority is at least the first's, so the engine takes the
    first, which computes the prefix; once the first token came, a turn keys by its own."""
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], policy="ttft", engine_priority=True)
    long = "a long cold prompt " * 2000
    body = {"model": "fake-model", "prompt": long, "max_tokens": 4, "stream": True}

    def first() -> None:
        with httpx.stream("POST", f"{router.url}/v1/completions", json=body,
                          headers={"x-fake-delay": "1.0"}, timeout=20) as r:  # fmt: skip
            r.read()

    thread = threading.Thread(target=first)
    thread.start()
    assert wait_until(lambda: worker.prefilling == 1)
    _send(router, long + " and the next turn")
    thread.join(20)
    _send(router, long + " and a turn after its first token")
    cold, turn, later = (b["priority"] for b in _forwarded([worker]))
    assert turn >= cold  # went after the request computing its prefix
    assert later < cold  # that prefix was computed: its own (short) key

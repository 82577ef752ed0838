"""Live replay against real simulated workers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from traces.live.fleet import sim_workers
from traces.live.replay import ReplayConfig, replay
from traces.trace.prompts import prompt_text, prompt_token_ids
from traces.trace.record import TraceRequest


def shared_prefix_trace(n: int, gap: float, input_length: int = 1100) -> list[TraceRequest]:
    """``n`` requests every ``gap`` s; all share two 512-token blocks, then diverge."""
    return [
        TraceRequest(i * gap, f"s{i}", 0, input_length, 4, (11, 12, 100 + i), request_id=i)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def slow_worker():
    # 500 prefill tokens/s: a 1,100-token prompt takes about 2 s of prefill, in real time
    flat = ["--gpu-profile", "flat", "--prefill-tokens-per-s", "500", "--time-scale", "1"]
    with sim_workers(1, flat) as (worker,):
        yield worker.url


def test_replay_is_open_loop_against_a_slow_worker(slow_worker):
    trace = shared_prefix_trace(20, gap=0.05)
    cfg = ReplayConfig(url=slow_worker, vocab_size=4096)
    outcome = asyncio.run(replay(trace, cfg, "slow"))
    run = outcome.run
    assert outcome.errors == 0 and run.requests == 20
    # every request left on schedule although each takes seconds to answer
    assert outcome.send_lag.max() < 0.25
    assert np.median(run.first_token - run.arrival) > 1.0
    # the worker saw the shared prefix: all but the first hit its two blocks
    assert outcome.reported_hit_rate > 0.5
    assert outcome.worker_hit_rate == pytest.approx(outcome.reported_hit_rate, abs=0.02)


def test_session_pacing_sends_each_turn_after_its_answer_and_think_time(slow_worker):
    # two sessions of three turns recorded 50 ms apart; each answer takes about a second
    trace = [
        TraceRequest(0.05 * i, f"s{i % 2}", 0, 600, 4, (11, 20 + i), request_id=i, think_s=0.3)
        for i in range(6)
    ]
    cfg = ReplayConfig(url=slow_worker, vocab_size=4096, pacing="session")
    outcome = asyncio.run(replay(trace, cfg, "paced"))
    run = outcome.run
    assert outcome.errors == 0 and run.requests == 6
    for i in range(2, 6):  # a later turn: sent 0.3 s after its session's previous answer
        assert run.arrival[i] >= run.finish[i - 2] + 0.3
        assert run.arrival[i] < run.finish[i - 2] + 0.3 + 0.25
    assert run.arrival[0] == 0.0 and run.arrival[1] == pytest.approx(0.05)
    assert outcome.send_lag.max() < 0.25  # lag is counted from the release, not the recording


def test_prompts_share_exactly_the_trace_prefix():
    a, b = shared_prefix_trace(2, gap=0.0)
    ta, tb = prompt_token_ids(a, vocab_size=4096), prompt_token_ids(b, vocab_size=4096)
    assert len(ta) == len(tb) == 1100
    assert ta[:1024] == tb[:1024] and ta[1024:] != tb[1024:]
    assert prompt_token_ids(a, salt=1)[:512] != ta[:512]
    xa, xb = prompt_text(a), prompt_text(b)
    assert len(xa) == 4 * 1100 and xa.isascii()
    assert xa[:4096] == xb[:4096] and xa[4096:] != xb[4096:]


async def _flaky_server(plan: dict[str, list[str]]) -> asyncio.Server:
    """A real HTTP server on 127.0.0.1 whose answer per session follows ``plan``: for each
    connection in turn, ``drop`` (close before answering), ``cut`` (one token, then close)
    or ``ok`` (a whole stream); ``ok`` once the plan runs out."""

    token = b'data: {"choices":[{"text":"a"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        await reader.readexactly(int(fields.get("content-length", 0)))
        steps = plan.get(fields.get("x-session-id", ""), [])
        step = steps.pop(0) if steps else "ok"
        if head.startswith("get"):  # /metrics: none here
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        elif step == "cut":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(token), token))
        elif step == "ok":
            body = token + token + usage
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("retries", [0, 2])
def test_a_connection_lost_before_the_first_token_is_retried_and_one_lost_mid_stream_is_not(
    retries,
):
    plan = {"s0": ["drop", "drop"], "s1": ["drop", "drop", "drop"], "s2": ["cut"], "s3": []}
    trace = [TraceRequest(i * 0.05, f"s{i}", 0, 600, 2, (1, 2), request_id=i) for i in range(4)]

    async def main():
        server = await _flaky_server({k: list(v) for k, v in plan.items()})
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        cfg = ReplayConfig(url=url, model="m", worker_urls=(url,), retries=retries)
        async with server:
            return await asyncio.wait_for(replay(trace, cfg, "flaky"), 30)

    outcome = asyncio.run(main())
    if retries == 0:  # s0, s1 and s2 lost; only s2 had streamed
        assert (outcome.errors, outcome.retried, outcome.lost_streaming) == (3, 0, 1)
        assert outcome.run.requests == 1
    else:  # s0 succeeds on its third send; s1 fails its three; s2 is not sent again
        assert (outcome.errors, outcome.retried, outcome.lost_streaming) == (2, 4, 1)
        assert outcome.run.requests == 2
        assert list(outcome.run.output_length) == [2, 2]


def test_a_requests_own_model_is_sent() -> None:
    from traces.live.replay import _body

    req = TraceRequest(0.0, "s", 1, 600, 4, (1,), model="lora-2")
    cfg = ReplayConfig(url="http://127.0.0.1:1")
    assert _body(req, cfg, "default")["model"] == "lora-2"
    req.model = None
    assert _body(req, cfg, "default")["model"] == "default"


def test_bodies_are_built_before_the_clock_within_a_budget(monkeypatch) -> None:
    """What a run sends does not depend on whether its prompts were built earlier; a body
    past the budget is left to be built when sent."""
    import orjson

    import traces.live.replay as replay_module
    from traces.live.replay import _body, prebuilt_bodies

    trace = shared_prefix_trace(6, 0.0, input_length=4000)
    cfg = ReplayConfig(url="http://127.0.0.1:1", prompt_mode="text", salt=3)
    bodies = prebuilt_bodies(trace, cfg, "m")
    assert bodies == [orjson.dumps(_body(r, cfg, "m")) for r in trace]
    monkeypatch.setattr(replay_module, "PREBUILD_BYTES", 2 * len(bodies[0]) + 10)
    assert [b is not None for b in prebuilt_bodies(trace, cfg, "m")] == [True, True] + [False] * 4

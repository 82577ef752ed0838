"""Live replay against real simulated workers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from traces.fleet import sim_workers
from traces.prompts import prompt_text, prompt_token_ids
from traces.record import TraceRequest
from traces.replay import ReplayConfig, replay


def shared_prefix_trace(n: int, gap: float, input_length: int = 1100) -> list[TraceRequest]:
    """``n`` requests every ``gap`` s; all share two 512-token blocks, then diverge."""
    return [
        TraceRequest(i * gap, f"s{i}", 0, input_length, 4, (11, 12, 100 + i), request_id=i)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def slow_worker():
    # 500 prefill tokens/s: a 1,100-token prompt takes about 2 s of prefill, in real time
    with sim_workers(1, ["--prefill-tokens-per-s", "500", "--time-scale", "1"]) as (worker,):
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


def test_prompts_share_exactly_the_trace_prefix():
    a, b = shared_prefix_trace(2, gap=0.0)
    ta, tb = prompt_token_ids(a, vocab_size=4096), prompt_token_ids(b, vocab_size=4096)
    assert len(ta) == len(tb) == 1100
    assert ta[:1024] == tb[:1024] and ta[1024:] != tb[1024:]
    assert prompt_token_ids(a, salt=1)[:512] != ta[:512]
    xa, xb = prompt_text(a), prompt_text(b)
    assert len(xa) == 4 * 1100 and xa.isascii()
    assert xa[:4096] == xb[:4096] and xa[4096:] != xb[4096:]

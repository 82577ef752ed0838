"""The worker model against hand-computed timelines."""

from __future__ import annotations

import pytest

from traces.worker_model import SimRequest, WorkerModel, WorkerModelConfig

CFG = WorkerModelConfig(
    kv_capacity_tokens=512 * 20,
    chunk_tokens=1024,
    prefill_tokens_per_s=1024.0,  # one chunk per second
    step_overhead_s=0.010,
    decode_s_per_seq=0.001,
)


class Driver:
    """Runs a model to completion, recording first-token and finish times."""

    def __init__(self, config: WorkerModelConfig = CFG) -> None:
        self.first: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.model = WorkerModel(
            config,
            on_first_token=lambda r, t: self.first.__setitem__(r.tag, t),
            on_finish=lambda r, t: self.done.__setitem__(r.tag, t),
        )

    def run(self, arrivals: list[tuple[float, SimRequest]], until: float = 1e9) -> None:
        arrivals = sorted(arrivals, key=lambda a: a[0])
        for _ in range(100_000):
            nxt = self.model.next_event
            if arrivals and (nxt is None or arrivals[0][0] < nxt):
                t, req = arrivals.pop(0)
                self.model.submit(req, t)
            elif nxt is not None and nxt <= until:
                self.model.advance(nxt)
            else:
                return
        raise AssertionError("model did not settle")


def req(tag: str, blocks: tuple[int, ...], input_length: int, output: int) -> SimRequest:
    return SimRequest(blocks, input_length, output, tag=tag)


def test_single_request_timeline():
    d = Driver()
    d.run([(0.0, req("a", (1, 2), 1024, 5))])
    # one prefill step: overhead + 0 decoding seqs + 1024 tokens at 1024 tok/s
    assert d.first["a"] == pytest.approx(1.010)
    # then 4 decode steps of 10 ms + 1 ms
    assert d.done["a"] == pytest.approx(1.010 + 4 * 0.011)
    assert d.model.cache.total_tokens == 4  # two blocks stay cached (2 pseudo-tokens each)
    assert d.model.cache.protected_tokens == 0 and d.model.extra_blocks == 0


def test_cached_prefix_skips_prefill_and_is_reported():
    d = Driver()
    d.run([(0.0, req("a", (1, 2), 1024, 1)), (5.0, req("b", (1, 2, 3), 1536, 1))])
    assert d.model.stats.cached_tokens == 1024
    assert d.first["b"] == pytest.approx(5.0 + 0.010 + 512 / 1024)
    assert d.model.stats.prompt_tokens == 1024 + 1536


def test_long_prefill_is_chunked_and_decode_runs_beside_it():
    d = Driver()
    d.run([(0.0, req("a", (1,), 512, 3)), (0.5, req("b", tuple(range(10, 14)), 2048, 1))])
    # a: prefill 0.51 s; b arrives during it and is admitted at 0.51
    assert d.first["a"] == pytest.approx(0.51)
    # b's two chunks each share a step with a's decoding: 0.010 + 0.001 + 1.0
    assert d.first["b"] == pytest.approx(0.51 + 2 * 1.011)
    assert d.done["a"] == pytest.approx(0.51 + 2 * 1.011)


def test_arrival_during_decode_stretch_joins_at_next_boundary():
    d = Driver()
    d.run([(0.0, req("a", (1,), 512, 101)), (0.6, req("b", (1,), 512, 1))])
    start = 0.51  # a decodes from here in 11 ms steps
    boundary = start + 9 * 0.011  # the first step boundary after 0.6
    # b hits a's cached block: a zero-token prefill step after admission
    assert d.model.stats.cached_tokens == 512
    assert d.first["b"] == pytest.approx(boundary + 0.010 + 0.001)
    assert d.done["a"] > boundary


def test_waits_for_memory_held_by_running_requests():
    cfg = WorkerModelConfig(
        kv_capacity_tokens=512 * 4,
        chunk_tokens=4096,
        prefill_tokens_per_s=1024.0,
        step_overhead_s=0.01,
        decode_s_per_seq=0.0,
    )
    d = Driver(cfg)
    # a holds 3 blocks until it finishes; b needs 3 more: must wait for a
    d.run([(0.0, req("a", (1, 2, 3), 1536, 50)), (0.1, req("b", (7, 8, 9), 1536, 1))])
    assert d.first["b"] > d.done["a"]
    assert d.model.cache.total_tokens <= 2 * 4  # a's blocks were evicted for b


def test_oversized_request_runs_alone():
    d = Driver()
    d.run([(0.0, req("big", tuple(range(30)), 512 * 30, 1))])
    assert "big" in d.done

import itertools
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest
from traces.trace.stats import hit_ceiling
from traces.trace.synth import SynthConfig, synthesize
from traces.trace.writer import write_jsonl


def sessions(requests: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    out: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in requests:
        out[r.session_id].append(r)
    return out


def test_seeded() -> None:
    cfg = SynthConfig(sessions=50)
    assert synthesize(cfg) == synthesize(cfg)
    assert synthesize(cfg) != synthesize(SynthConfig(sessions=50, seed=1))


def test_each_turn_extends_the_previous_prompt() -> None:
    cfg = SynthConfig(sessions=300, seed=4)
    for turns in sessions(synthesize(cfg)).values():
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        for prev, cur in itertools.pairwise(turns):
            assert cur.arrival >= prev.arrival
            assert cur.input_length > prev.input_length + prev.output_length  # + user message
            assert cur.blocks[: len(prev.blocks)] == prev.blocks
        for r in turns:
            assert len(r.blocks) == r.input_length // 512 and r.input_length <= cfg.max_context


def test_system_prompts_are_shared_and_nothing_else_is() -> None:
    cfg = SynthConfig(sessions=200, system_prompts=3, system_prompt_tokens=1100, seed=2)
    by_session = sessions(synthesize(cfg))
    heads = Counter(turns[0].blocks[:2] for turns in by_session.values())
    assert len(heads) == 3  # 2 whole blocks of each 1100-token prompt; block 3 straddles
    owner: dict[int, str] = {}
    for sid, turns in by_session.items():
        for r in turns:
            for key in r.blocks[2:]:
                assert owner.setdefault(key, sid) == sid
    no_prompt = synthesize(SynthConfig(sessions=100, system_prompts=0))
    assert hit_ceiling(no_prompt).hit_blocks == sum(
        len(t[i].blocks) for t in sessions(no_prompt).values() for i in range(len(t) - 1)
    )  # only a session's own previous prompt can hit


def test_heavy_tailed_turns_and_poisson_sessions() -> None:
    cfg = SynthConfig(sessions=4000, rate=2.0, max_context=10**9, user_tokens=8, output_tokens=8)
    by_session = sessions(synthesize(cfg))
    sizes = np.array([len(t) for t in by_session.values()])
    pmf = np.arange(1, 65, dtype=float) ** -2.0
    pmf /= pmf.sum()
    assert (sizes == 1).mean() == pytest.approx(pmf[0], abs=0.03)  # ~61% single-turn
    assert (sizes >= 20).mean() == pytest.approx(pmf[19:].sum(), abs=0.01)
    assert sizes.max() <= 64 and sizes.max() >= 30
    starts = np.sort([t[0].arrival for t in by_session.values()])
    gaps = np.diff(starts)
    assert gaps.mean() == pytest.approx(1 / cfg.rate, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential gaps


def test_written_trace_loads_back(tmp_path: Path) -> None:
    requests = synthesize(SynthConfig(sessions=40, seed=9))
    out = tmp_path / "s.jsonl"
    write_jsonl(requests, out)
    loaded = load_trace(out)
    assert [(r.session_id, r.turn, r.input_length) for r in loaded] == [
        (r.session_id, r.turn, r.input_length) for r in requests
    ]
    assert hit_ceiling(loaded) == hit_ceiling(requests)


@pytest.mark.parametrize(
    "bad",
    [
        SynthConfig(rate=0),
        SynthConfig(max_turns=0),
        SynthConfig(sessions=-1),
        SynthConfig(max_context=1000, system_prompt_tokens=2048),
    ],
)
def test_rejects_bad_config(bad: SynthConfig) -> None:
    with pytest.raises(ValueError):
        synthesize(bad)

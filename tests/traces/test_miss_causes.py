"""The fleet ledger (traces/sim/miss_causes.py): each missed block's state at admission, on
timelines worked out by hand (tests/traces/hit_gap_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from traces.commands.options import make_sim_picker
from traces.sim.config import SimConfig
from traces.sim.miss_causes import ELSEWHERE, HIT, NEW, PREFILLING, QUEUED, UNSERVED
from traces.sim.simulator import simulate

sys.path.insert(0, str(Path(__file__).parent))

from hit_gap_support import TIMELINE, TIMELINE_PICKS, req, run


def _by_request(states, trace) -> list[list[int]]:
    out, start = [], 0
    for r in trace:
        out.append(states[start : start + len(r.blocks)].tolist())
        start += len(r.blocks)
    return out


def test_each_state_on_the_timeline() -> None:
    states = _by_request(run(TIMELINE, TIMELINE_PICKS, 2).block_states, TIMELINE)
    assert states[0] == [NEW] * 4
    assert states[1] == [ELSEWHERE] * 4 + [NEW] * 2  # w0 finished them at 0.149
    assert states[2] == [NEW] * 16
    assert states[3] == [PREFILLING] * 16 + [NEW]  # w0 prefills them until 2.558
    assert states[4] == [NEW] * 64
    # 6 came after 5 but went first, on the idle w1: 5 still waited on w0 ...
    assert states[6] == [QUEUED] * 4 + [NEW]
    # ... and at 3.558 computes them again while w1 holds them
    assert states[5] == [ELSEWHERE] * 4


def test_a_prefix_prefilling_on_the_same_worker_is_a_hit() -> None:
    """The worker model caches a prompt's blocks when it admits it, before its prefill: a
    request admitted behind it at the next step boundary (the first of two chunks done)
    hits them, so "in flight" misses are always another worker's."""
    trace = [req(0.0, range(1, 33), 16_384), req(0.1, range(1, 34), 16_896)]
    result = run(trace, [0, 0], 1)
    assert result.first_token[0] > 0.6  # two chunks: 1 was admitted at 0.558, before that
    assert result.cached.tolist() == [0, 16_384]
    assert _by_request(result.block_states, trace)[1] == [HIT] * 32 + [NEW]


def test_another_worker_s_cpu_tier_holds_it_elsewhere() -> None:
    """w0's GPU holds 3 blocks: 1 2 3 4 there evict 1, which its CPU tier keeps; 1 on w1
    then misses a prefix that sits elsewhere, and 1 again on w0 loads it (a hit)."""
    trace = [req(10.0 * i, (k,), 511) for i, k in enumerate((1, 2, 3, 4, 1, 1))]
    result = run(trace, [0, 0, 0, 0, 1, 0], 2, kv_tokens=3 * 512, cpu_tokens=100 * 512)
    states = _by_request(result.block_states, trace)
    assert states[4] == [ELSEWHERE]
    assert states[5] == [HIT] and result.cpu_cached[5] == 511


def test_a_refused_request_stays_unserved() -> None:
    """Flow control refuses the sheddable second request (the first's 32k tokens put the
    fleet's predicted TTFT past the target): its blocks keep UNSERVED."""
    trace = [req(0.0, range(1, 65), 32_768), req(0.0, range(1, 3), 1_024, priority=-1)]
    result = run(trace, [0], 1, flow_control=True, flow_target_ttft_s=0.1)
    assert result.rejected.tolist() == [False, True]
    assert _by_request(result.block_states, trace)[1] == [UNSERVED] * 2


def test_off_by_default_and_off_for_a_disaggregated_fleet() -> None:
    trace = TIMELINE[:2]
    plain = simulate(trace, make_sim_picker("round_robin"), SimConfig(workers=2))
    assert plain.block_states is None
    pd = SimConfig(prefill_workers=1, decode_workers=1, hit_gap=True)
    assert simulate(trace, make_sim_picker("round_robin"), pd).block_states is None

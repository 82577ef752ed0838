"""ttft: predicted time to first token, affinity within a margin, KV-pressure charge."""

from __future__ import annotations

import pytest

from policies.base import NoHealthyWorker, RequestFeatures
from policies.lmetric import LMetricPicker
from policies.ttft import TTFTPicker
from router.cache.block_lru import BlockLRU
from router.cache.worker_state import WorkerState
from router.cache.workload import SessionFootprint

STEP, SEQ, RATE, CHUNK = 0.012, 0.00015, 15_000.0, 8192


def test_keeps_a_warm_session_on_the_idle_warm_worker_where_lmetric_goes_cold(worker, request_for):
    # turn 2 of a session: its first 4 blocks (turn 1) are cached on worker 1, which still
    # decodes one request; worker 0 is idle and cold. 5 blocks = 2,560 tokens.
    cold, warm = worker(0), worker(1, cached=(1, 2, 3, 4))
    req = request_for((1, 2, 3, 4, 5), session="s")
    # LMetric: cold (0 + 2560) * 0 = 0 beats warm (0 + 512) * 1 = 512
    assert LMetricPicker().pick(req, [cold, warm]).worker == 0
    # ttft, by hand: cold 2560/15000 + (2560/8192 + 1) * 0.012          = 0.186417 s
    #                warm  512/15000 + ( 512/8192 + 1) * (0.012 + 0.00015) = 0.047043 s
    #   + share on the busy warm worker: 512/15000 * 1 request * g(w), w = 512/15000 s,
    #     g(w) = w^2 / (w^2 + 4^2) = 0.0000728: + 0.0000025 s       = 0.047045 s
    picker = TTFTPicker()
    costs = picker.costs(req, [cold, warm], [0, 2048])
    assert costs[0] == pytest.approx(2560 / RATE + (2560 / CHUNK + 1) * STEP)
    assert costs[0] == pytest.approx(0.186417, abs=1e-6)
    w = 512 / RATE
    assert costs[1] == pytest.approx(
        w + (512 / CHUNK + 1) * (STEP + SEQ) + w * w * w / (w * w + 16)
    )
    assert costs[1] == pytest.approx(0.047045, abs=1e-6)
    pick = picker.pick(req, [cold, warm])
    assert (pick.worker, pick.branch, pick.hit_tokens, pick.best_hit_tokens) == (
        1,
        "cost",
        2048,
        2048,
    )


def test_both_idle_the_seed_lmetric_takes_the_first_cold_one(worker, request_for):
    cold, warm = worker(0), worker(0, cached=(1, 2, 3))
    req = request_for((1, 2, 3, 4))
    assert LMetricPicker(tie_break="first").pick(req, [cold, warm]).worker == 0
    assert TTFTPicker().pick(req, [cold, warm]).worker == 1


def test_queue_ahead_outweighs_a_small_hit(worker, request_for):
    # warm worker has 30k tokens of prefill queued: 2s; the cold one costs 4 blocks: 0.14s
    busy_warm = worker(3, cached=(1,), pending=30_000)
    idle_cold = worker(0)
    assert TTFTPicker().pick(request_for((1, 2, 3, 4)), [busy_warm, idle_cold]).worker == 1


def test_cold_idle_fleet_goes_round_robin(worker, request_for):
    workers = [worker(0), worker(0), worker(0)]
    picker = TTFTPicker()
    picks = [picker.pick(request_for((10 + i,)), workers) for i in range(4)]
    assert [p.worker for p in picks] == [0, 1, 2, 0]
    assert {p.branch for p in picks} == {"tie_rr"}


def test_session_sticks_within_the_margin_then_moves(worker, request_for):
    a, b = worker(0), worker(0)
    picker = TTFTPicker(affinity_margin=0.1, affinity_slack_s=0.0)
    first = picker.pick(request_for((1, 2), session="s"), [a, b])
    bound = first.worker
    other = 1 - bound
    ws = [a, b]
    # the bound worker is now 5% worse than the other: stays
    ws[bound].pending_prefill_tokens = 1_000
    ws[other].pending_prefill_tokens = 800
    assert picker.pick(request_for((1, 2), session="s"), ws).branch == "affinity_stick"
    # far worse: moves, and the session is bound to its new worker
    ws[bound].pending_prefill_tokens = 60_000
    moved = picker.pick(request_for((1, 2), session="s"), ws)
    assert (moved.worker, moved.branch) == (other, "affinity_moved")
    ws[bound].pending_prefill_tokens = 0
    ws[other].pending_prefill_tokens = 0
    assert picker.pick(request_for((1, 2), session="s"), ws).worker == other


def test_unhealthy_workers_are_skipped(worker, request_for):
    picker = TTFTPicker()
    ws = [worker(0, cached=(1, 2), healthy=False), worker(2)]
    assert picker.pick(request_for((1, 2)), ws).worker == 1
    with pytest.raises(NoHealthyWorker):
        picker.pick(request_for((1, 2)), [worker(0, healthy=False)])


def _state(name: str, capacity_tokens: int) -> WorkerState:
    return WorkerState(name=name, blocks=BlockLRU(capacity_tokens // 512, 512))


def test_a_placement_that_pushes_out_warm_sessions_pays_their_recompute(request_for):
    # both workers idle and cold for this request; worker 0's KV (8 blocks) is full of two
    # sessions seen a moment ago, worker 1 holds none
    full, free = _state("full", 8 * 512), _state("free", 8 * 512)
    full.footprint.touch("x", 2048, now=10.0)
    full.footprint.touch("y", 2048, now=11.0)
    free.footprint.touch("z", 0, now=11.0)
    req = request_for((1, 2, 3, 4), session="new")
    picker = TTFTPicker()
    costs = picker.costs(req, [full, free], [0, 0])
    # worker 0: 4096 warm + 2048 new - 4096 capacity = 2048 tokens pushed out (all uncached)
    assert costs[0] - costs[1] == pytest.approx(2048 / RATE)
    assert picker.pick(req, [full, free]).worker == 1
    # once those sessions are older than the horizon, nothing warm is pushed out
    full.footprint.horizon_s = 1.0
    free.footprint.touch("z", 0, now=20.0)
    costs = picker.costs(req, [full, free], [0, 0])
    assert costs[0] == pytest.approx(costs[1])


def test_the_session_itself_is_not_counted_as_displaced(request_for):
    state = _state("w", 8 * 512)
    state.footprint.touch("s", 4096, now=1.0)  # the session fills the worker alone
    req = request_for((1, 2, 3, 4, 5, 6, 7, 8), session="s")
    cost = TTFTPicker().costs(req, [state], [2048])[0]
    assert cost == pytest.approx(2048 / RATE + (2048 / CHUNK + 1) * STEP)


def test_displacement_is_charged_per_session_up_to_the_cap(request_for):
    # worker 0 holds one big warm session (100k tokens of a 104k-token KV); the new request's
    # 4 blocks push it out: it will recompute 100k tokens, charged at most the 40k cap
    big, free = _state("big", 104_448), _state("free", 104_448)
    big.footprint.touch("whale", 100_000, now=1.0)
    free.footprint.touch("z", 0, now=1.0)
    req = request_for((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), session="new")
    picker = TTFTPicker()
    costs = picker.costs(req, [big, free], [0, 0])
    assert costs[0] - costs[1] == pytest.approx(40_000 / RATE)
    assert TTFTPicker(displace_cap_tokens=1 << 30).costs(req, [big, free], [0, 0])[0] - costs[
        1
    ] == pytest.approx(100_000 / RATE)


def test_a_session_bound_elsewhere_is_pushed_out_for_free(request_for):
    a, b = _state("a", 8 * 512), _state("b", 8 * 512)
    picker = TTFTPicker()
    # "x" was served by worker 0, then the picker sent it to worker 1
    a.footprint.touch("x", 4096, now=1.0)
    picker.sessions.bind("x", 1)
    req = request_for((1, 2, 3, 4), session="new")
    costs = picker.costs(req, [a, b], [0, 0])
    assert costs[0] == pytest.approx(costs[1])


def test_a_request_that_cannot_fit_beside_the_running_ones_waits_for_them(request_for):
    # worker 0 runs one request holding 6 of its 8 blocks with 400 output tokens booked;
    # a 4-block prompt does not fit beside it: it waits about half that output's decode
    busy, idle = _state("busy", 8 * 512), _state("idle", 8 * 512)
    running = request_for((11, 12, 13, 14, 15, 16))
    busy.book(running, expected_output_tokens=400, now=0.0)
    busy.pending_prefill_tokens = 0  # its prefill is done: it decodes
    req = request_for((1, 2, 3, 4))
    picker = TTFTPicker(share_weight=0.0)
    costs = picker.costs(req, [busy, idle], [0, 0])
    step = STEP + SEQ
    own = 2048 / RATE + (2048 / CHUNK + 1) * step
    assert costs[0] == pytest.approx(own + 0.5 * 400 * step)
    assert picker.pick(req, [busy, idle]).worker == 1
    # a 1-block prompt fits (3,072 + 512 + 400 tokens <= 4,096): no wait
    small = request_for((1,))
    assert picker.costs(small, [busy], [0])[0] == pytest.approx(
        512 / RATE + (512 / CHUNK + 1) * step
    )


def test_a_long_cold_prefill_goes_where_fewest_live_sessions_would_queue_behind_it(request_for):
    # 200 blocks (102,400 tokens), cold everywhere: 6.8 s of prefill wherever it goes (past
    # hopeless_s). Worker 0 serves two sessions seen 10 s ago, worker 1 one seen 10 s ago and
    # one 100 s ago (past live_s: not live), worker 2 one that has moved to worker 0.
    a, b, c = (_state(n, 1 << 20) for n in "abc")
    a.footprint.touch("x", 1000, now=90.0)
    a.footprint.touch("y", 1000, now=90.0)
    b.footprint.touch("old", 1000, now=0.0)
    b.footprint.touch("z", 1000, now=90.0)
    c.footprint.touch("m", 1000, now=100.0)
    picker = TTFTPicker()
    picker.sessions.bind("m", 0)
    req = request_for(tuple(range(1, 201)), session="new")
    plain = TTFTPicker(block_weight=0.0).costs(req, [a, b, c], [0, 0, 0])
    costs = picker.costs(req, [a, b, c], [0, 0, 0])
    own = 102_400 / RATE
    # block_i = own prefill x live sessions: 2, 1, 0
    assert [x - y for x, y in zip(costs, plain, strict=True)] == pytest.approx([2 * own, own, 0])
    assert picker.pick(req, [a, b, c]).worker == 2
    # the request's own session does not count, and a short prefill pays nothing
    assert picker.costs(request_for(tuple(range(1, 201)), session="z"), [b], [0])[0] == (
        pytest.approx(plain[1])
    )
    short = request_for((1, 2, 3, 4), session="new")
    assert picker.costs(short, [a, b, c], [0, 0, 0]) == pytest.approx(
        TTFTPicker(block_weight=0.0).costs(short, [a, b, c], [0, 0, 0])
    )


def test_a_hopeless_prompt_does_not_gather_where_it_pushes_out_a_live_session(request_for):
    """A long prompt cold everywhere goes where few sessions live (block_i), unless it would
    push one out there: that session comes back as a cold prompt of all its tokens (not the
    cap) and delays the sessions there as this one would."""
    a, b = _state("a", 262_144), _state("b", 262_144)
    a.footprint.touch("whale", 200_000, now=90.0)
    for session in ("x", "y", "z"):
        b.footprint.touch(session, 1000, now=90.0)
    req = request_for(tuple(range(1, 201)), session="new")  # 102,400 tokens: 6.8 s
    picker = TTFTPicker()
    kept = TTFTPicker(eviction_weight=0.0).costs(req, [a, b], [0, 0])
    costs = picker.costs(req, [a, b], [0, 0])
    assert kept[1] - kept[0] == pytest.approx(2 * 102_400 / RATE)  # live: 3 against 1
    # 200,000 + 102,400 tokens exceed a's 262,144: the whale is pushed out. No session has
    # returned yet (return rate 1); it delays itself and the one session live there (x2)
    assert costs[0] - kept[0] == pytest.approx(2 * 200_000 / RATE)
    assert costs[1] == pytest.approx(kept[1])
    assert picker.pick(req, [a, b]).worker == 1
    # a short prompt pushing the whale out pays the capped charge, unscaled
    short = request_for(tuple(range(1, 131)), session="new")  # 66,560 tokens: 4.4 s
    assert TTFTPicker(hopeless_s=10.0).costs(short, [a], [0])[0] - TTFTPicker(
        hopeless_s=10.0, eviction_weight=0.0
    ).costs(short, [a], [0])[0] == pytest.approx(40_000 / RATE)


def test_no_block_charge_where_the_request_is_warm_somewhere(request_for):
    # the same long prompt, cached on worker 0: its best own prefill is short, so it is
    # placed for its own TTFT and keeps its cache, live sessions or not
    a, b = _state("a", 1 << 20), _state("b", 1 << 20)
    a.footprint.touch("x", 1000, now=90.0)
    b.footprint.touch("y", 0, now=90.0)
    req = request_for(tuple(range(1, 201)), session="new")
    picker = TTFTPicker()
    costs = picker.costs(req, [a, b], [100_000, 0])
    assert costs == pytest.approx(TTFTPicker(block_weight=0.0).costs(req, [a, b], [100_000, 0]))
    assert picker.pick(req, [a, b]).worker == 0


def _learn(state: WorkerState, tokens_per_s: float) -> None:
    for _ in range(200):
        state.rate.observe(8192, 8192 / tokens_per_s + STEP)


def _sessions_per_worker(picker: TTFTPicker, fleet: list[WorkerState], request_for) -> list[int]:
    """12 new sessions, one after another on an idle fleet (each served before the next)."""
    for k in range(12):
        req = request_for(tuple(range(1000 * k, 1000 * k + 2)), session=f"s{k}")
        chosen = picker.pick(req, fleet).worker
        fleet[chosen].book(req, expected_output_tokens=4, now=float(k)).finish()
    return [len(w.footprint) for w in fleet]


def test_new_sessions_spread_over_workers_that_differ_only_in_learned_rate(request_for):
    # three idle workers whose learned rates differ (noise on one machine: 25k, 18k, 20k
    # tokens/s). Without the balance every new session goes to the one that reads fastest.
    fleet = [_state(n, 1 << 20) for n in "abc"]
    for state, rate in zip(fleet, (25_000, 18_000, 20_000), strict=True):
        _learn(state, rate)
    assert _sessions_per_worker(TTFTPicker(balance_slack_s=0.0), fleet, request_for) == [12, 0, 0]
    fleet = [_state(n, 1 << 20) for n in "abc"]
    for state, rate in zip(fleet, (25_000, 18_000, 20_000), strict=True):
        _learn(state, rate)
    picker = TTFTPicker()
    assert _sessions_per_worker(picker, fleet, request_for) == [4, 4, 4]
    # a worker that is busy prefilling is not near-equal: the new session avoids it
    fleet[0].pending_prefill_tokens = fleet[1].pending_prefill_tokens = 5_000
    pick = picker.pick(request_for((7, 8), session="late"), fleet)
    assert (pick.worker, pick.branch) == (2, "cost")


def test_balance_keeps_a_truly_slow_worker_out(request_for):
    # more than twice slower at its learned rate: not near-equal, whatever its sessions
    fast, slow = _state("fast", 1 << 20), _state("slow", 1 << 20)
    _learn(fast, 40_000)
    _learn(slow, 5_000)
    fast.footprint.touch("x", 1000, now=1.0)
    pick = TTFTPicker().pick(request_for((1, 2, 3, 4), session="new"), [fast, slow])
    assert (pick.worker, pick.branch) == (0, "cost")


def test_learned_rate_changes_the_comparison(request_for):
    slow, fast = _state("slow", 1 << 20), _state("fast", 1 << 20)
    for _ in range(200):
        slow.rate.observe(8192, 8192 / 5_000 + STEP)
        fast.rate.observe(8192, 8192 / 30_000 + STEP)
    assert slow.rate.tokens_per_s < 6_000 < 25_000 < fast.rate.tokens_per_s
    # same queue, same cache: the faster worker wins
    slow.pending_prefill_tokens = fast.pending_prefill_tokens = 10_000
    assert TTFTPicker().pick(request_for((1, 2, 3)), [slow, fast]).worker == 1


def test_views_without_learned_state_use_the_configured_rate(worker, request_for):
    costs = TTFTPicker(prefill_tokens_per_s=10_000).costs(request_for((1,)), [worker(0)], [0])
    assert costs[0] == pytest.approx(512 / 10_000 + (512 / CHUNK + 1) * STEP)


def test_parameters_are_validated():
    with pytest.raises(ValueError):
        TTFTPicker(prefill_tokens_per_s=0)
    with pytest.raises(ValueError):
        TTFTPicker(affinity_margin=-1)
    with pytest.raises(ValueError):
        TTFTPicker(live_s=-1)


def test_footprint_is_a_session_footprint():
    assert isinstance(_state("w", 512).footprint, SessionFootprint)


def test_a_lora_request_goes_where_its_adapter_is_resident_and_spreads_when_slots_are_full():
    from router.cache.features import RequestFeatures
    from router.cache.lora import AdapterSlots

    def worker(name: str, max_loras: int = 1) -> WorkerState:
        return WorkerState(name=name, blocks=BlockLRU(100), adapters=AdapterSlots(max_loras))

    a, b = worker("a"), worker("b")
    picker = TTFTPicker()
    first = RequestFeatures(blocks=[], input_length=100, adapter="lora-1", session_id="s1")
    a.book(first, 50)  # lora-1 runs on a: resident there
    other = RequestFeatures(blocks=[], input_length=100, adapter="lora-1", session_id="s2")
    assert picker.pick(other, [a, b]).worker == 0  # despite a's load: no adapter load
    # a's only slot runs lora-1: a lora-2 request would wait for it to drain -> b
    new = RequestFeatures(blocks=[], input_length=100, adapter="lora-2", session_id="s3")
    assert picker.pick(new, [a, b]).worker == 1
    assert picker.costs(new, [a, b], [0, 0])[0] > picker.costs(new, [a, b], [0, 0])[1]


def _lora_worker(worker, pending: int = 0, resident=(), running=(), max_loras: int = 2):
    """A fake view with adapter slots: ``resident`` adapters loaded and idle, ``running``
    ones booked (one request each)."""
    from router.cache.lora import AdapterSlots

    view = worker(len(running), pending=pending)
    slots = AdapterSlots(max_loras)
    for adapter in (*resident, *running):
        slots.recent[adapter] = None
    slots.running.update(dict.fromkeys(running, 1))
    view.adapters = slots
    return view


def _lora_request(adapter: str | None, session: str | None = None):
    from router.cache.features import RequestFeatures

    return RequestFeatures([], 1000, session, adapter=adapter)


def test_adapter_affinity_prefers_a_worker_holding_the_adapter_within_the_slack(worker):
    # home holds lora-1 but has 3,000 tokens queued; cold is idle and pays one load (50 ms):
    # home 4000/15000 + (4000/8192 + 1) * 0.012 = 0.2845 s, cold 0.0801 + 0.05 = 0.1301 s
    home, cold = _lora_worker(worker, 3000, resident=["lora-1"]), _lora_worker(worker)
    picker = TTFTPicker()
    costs = picker.costs(_lora_request("lora-1"), [home, cold], [0, 0])
    assert costs[0] == pytest.approx(4000 / RATE + (4000 / CHUNK + 1) * STEP)
    assert costs[1] == pytest.approx(1000 / RATE + (1000 / CHUNK + 1) * STEP + 0.05)
    assert costs[1] < costs[0] <= costs[1] + picker.params.adapter_slack_s  # within 10 * 50 ms
    pick = picker.pick(_lora_request("lora-1", "s1"), [home, cold])
    assert (pick.worker, pick.branch) == (0, "adapter_stick")
    assert picker.sessions.get("s1") == 0  # the session is bound where it went
    # without the rule (no slack) the cheaper cold worker loads the adapter
    plain = TTFTPicker(adapter_slack_s=0.0).pick(_lora_request("lora-1"), [home, cold])
    assert (plain.worker, plain.branch) == (1, "cost")
    # the default slack follows the load's cost
    assert TTFTPicker(lora_load_s=0.1).params.adapter_slack_s == pytest.approx(1.0)


def test_adapter_affinity_lets_go_when_the_adapters_worker_is_clearly_worse(worker):
    # 15,000 tokens queued on the adapter's worker: a second more than the cold one
    home, cold = _lora_worker(worker, 15_000, resident=["lora-1"]), _lora_worker(worker)
    pick = TTFTPicker().pick(_lora_request("lora-1"), [home, cold])
    assert (pick.worker, pick.branch) == (1, "cost")
    # a relative margin widens the rule for long prompts
    wide = TTFTPicker(adapter_margin=10.0).pick(_lora_request("lora-1"), [home, cold])
    assert (wide.worker, wide.branch) == (0, "adapter_stick")


def test_adapter_affinity_skips_a_worker_where_the_adapter_is_blocked(worker):
    # lora-1 is resident on home but both its slots run other adapters: it would wait
    home = _lora_worker(worker, 3000, resident=["lora-1"], running=["lora-2", "lora-3"])
    assert home.adapters.resident("lora-1") and home.adapters.blocked("lora-1")
    cold = _lora_worker(worker)
    picker = TTFTPicker(adapter_slack_s=100.0)  # any home would do: still not a blocked one
    assert picker._homes("lora-1", [home, cold], [0, 0]) == []
    pick = picker.pick(_lora_request("lora-1"), [home, cold])
    assert (pick.worker, pick.branch) == (1, "cost")
    # once a slot runs it again it is a home
    home.adapters.running["lora-1"] = 1
    del home.adapters.running["lora-3"]
    pick = picker.pick(_lora_request("lora-1"), [home, cold])
    assert (pick.worker, pick.branch) == (0, "adapter_stick")


def test_a_bound_session_stays_on_its_worker_over_its_adapters_worker(worker):
    # the session's worker lost lora-1 (it pays a load); another worker holds it. Within the
    # session margin the session stays: its prefix under lora-1 lives on its worker.
    home = _lora_worker(worker, resident=["lora-1"])
    mine = _lora_worker(worker)
    picker = TTFTPicker()
    picker.sessions.bind("s1", 1)
    pick = picker.pick(_lora_request("lora-1", "s1"), [home, mine])
    assert (pick.worker, pick.branch) == (1, "affinity_stick")
    # beyond the session margin, it goes where its adapter is (though a third is cheaper)
    mine.pending_prefill_tokens = 30_000
    busy_home = _lora_worker(worker, 3000, resident=["lora-1"])
    picker.sessions.bind("s1", 1)
    pick = picker.pick(_lora_request("lora-1", "s1"), [busy_home, mine, _lora_worker(worker)])
    assert (pick.worker, pick.branch) == (0, "adapter_stick")


def test_a_request_without_an_adapter_takes_the_old_path(worker):
    # adapters resident anywhere make no difference to a base-model request
    fleet = [_lora_worker(worker, 3000, resident=["lora-1"]), _lora_worker(worker)]
    for slack in (0.0, 100.0):
        picker = TTFTPicker(adapter_slack_s=slack, adapter_margin=slack)
        pick = picker.pick(_lora_request(None), fleet)
        assert (pick.worker, pick.branch) == (1, "cost")


def test_adapter_parameters_must_not_be_negative():
    with pytest.raises(ValueError):
        TTFTPicker(adapter_margin=-0.1)
    with pytest.raises(ValueError):
        TTFTPicker(adapter_slack_s=-1.0)


def test_a_long_prefill_in_progress_on_the_sessions_worker_counts_what_is_left(request_for):
    """Counted whole until its first token, a long prompt half done would read twice its
    wait, and the session would move and recompute its prefix elsewhere."""
    home, other = _state("home", 1 << 22), _state("other", 1 << 22)
    picker = TTFTPicker()
    turn = request_for(tuple(range(1, 41)), session="s")  # 20k tokens
    picker.sessions.bind("s", 0)
    home.book(turn, now=0.0).finish()  # its prefix is cached on home
    home.book(request_for(tuple(range(100, 300))), now=1.0)  # 102k cold tokens, ~6.8 s
    nxt = request_for(tuple(range(1, 42)), session="s")  # 512 new tokens; 21k cold elsewhere
    tick = request_for((999,), session="tick")
    other.book(tick, now=1.0).finish()  # the latest booking: the picker's clock
    assert picker.pick(nxt, [home, other]).branch == "affinity_moved"
    picker.sessions.bind("s", 0)
    other.book(tick, now=6.0).finish()  # 5 s later: ~75k of the 102k done
    assert home.prefill_left(6.0) < 30_000 < home.pending_prefill_tokens
    assert picker.pick(nxt, [home, other]).branch == "affinity_stick"


def test_a_request_that_fills_the_last_step_of_a_queue_pays_the_wait_it_adds(request_for):
    """A chunked engine's step ends at a whole chunk while prefill is queued: a request sent
    behind a queue that ends mid-chunk fills that step, and the queue's last request waits
    for its tokens too (fill_i)."""
    mid, whole = _state("mid", 1 << 22), _state("whole", 1 << 22)
    picker = TTFTPicker(share_weight=0.0)  # fill_i alone on top of ttft_i
    mid.book(request_for(tuple(range(100, 112))), now=0.0)  # 6144 tokens: 2048 of a chunk free
    whole.book(request_for(tuple(range(200, 216))), now=0.0)  # 8192: ends at a whole chunk
    assert mid.prefill_tail(CHUNK) == (2048, 1) and whole.prefill_tail(CHUNK) == (0, 0)
    small = request_for((1, 2))  # 1024 tokens, all of them in the free part
    costs = picker.costs(small, [mid, whole], [0, 0])

    def alone(pending: int) -> float:
        work = pending + 1024
        return work / RATE + (work / CHUNK + 1.0) * (STEP + SEQ)

    assert costs[0] == pytest.approx(alone(6144) + 1024 / RATE)
    assert costs[1] == pytest.approx(alone(8192))
    big = request_for(tuple(range(1, 11)))  # 5120 tokens: it fills the free 2048 at most
    work = 6144 + 5120
    expected = work / RATE + (work / CHUNK + 1.0) * (STEP + SEQ) + 2048 / RATE
    assert picker.costs(big, [mid, whole], [0, 0])[0] == pytest.approx(expected)


def test_a_session_pushed_out_is_charged_by_the_chance_that_it_comes_back(request_for):
    """Only a session that sends another turn pays to recompute what was pushed out: the
    charge is scaled by the share of turns the picker saw come from a known session."""
    full, free = _state("full", 8 * 512), _state("free", 8 * 512)
    full.footprint.touch("x", 2048, now=10.0)
    full.footprint.touch("y", 2048, now=11.0)
    free.footprint.touch("z", 0, now=11.0)
    picker = TTFTPicker()
    assert picker.return_rate == 1.0  # before any turn: every warm session comes back
    for session in ("a", "b"):  # an opening burst of first turns is no reading yet
        picker.pick(request_for((50, 51), session=session), [_state("w", 1 << 22)])
    assert picker.return_rate == 1.0
    for session in ("a", "c"):  # four turns, one of a session seen before
        picker.pick(request_for((50, 51), session=session), [_state("w", 1 << 22)])
    assert picker.return_rate == pytest.approx(0.25)
    req = request_for((1, 2, 3, 4), session="new")
    costs = picker.costs(req, [full, free], [0, 0])
    assert costs[0] - costs[1] == pytest.approx(0.25 * 2048 / RATE)


def test_as_shipped_a_small_request_avoids_the_queue_whose_last_step_it_would_fill(request_for):
    """Defaults: ``mid``'s queue is 1,024 tokens shorter, but three requests end in its last
    step, half empty; a small prompt sent there delays all three by its own prefill, so it
    goes behind ``whole``, whose queue ends at a whole chunk (without fill_i, mid is cheaper)."""
    mid, whole = _state("mid", 1 << 22), _state("whole", 1 << 22)
    for blocks in (tuple(range(100, 108)), tuple(range(110, 114)), (120, 121)):
        mid.book(request_for(blocks), now=0.0)  # 4,096 + 2,048 + 1,024: ends 1,024 short
    for blocks in (tuple(range(200, 208)), tuple(range(210, 214)), tuple(range(220, 224))):
        whole.book(request_for(blocks), now=0.0)  # 4,096 + 2,048 + 2,048: a whole chunk
    assert mid.prefill_tail(CHUNK) == (1024, 3) and whole.prefill_tail(CHUNK) == (0, 0)
    small = request_for((1, 2))
    picker = TTFTPicker()
    costs = picker.costs(small, [mid, whole], [0, 0])
    assert costs[0] - 3 * 1024 / RATE < costs[1] < costs[0]  # fill_i alone decides it
    assert picker.pick(small, [mid, whole]).worker == 1


def test_with_a_gpu_profile_ttft_prices_the_attention_over_a_queued_prefix():
    from router.cache.cost_model import CostTerms, WorkerCost
    from router.cache.cost_profile import resolve

    def fleet(terms: CostTerms | None) -> list[WorkerState]:
        states = [WorkerState(f"w{i}", BlockLRU(1024, 512), cost=WorkerCost(terms)) for i in (0, 1)]
        # worker 0 prefills 8k new tokens after 120k cached (attention-heavy); worker 1 a
        # cold 24k-token prompt: the flat rate reads worker 0's queue 2.7x shorter, the
        # H100 profile 1.6x longer (0.21 s of tokens + 1.6 s of attention against 1.07 s)
        long_prompt = list(range(1000, 1000 + 250))  # 128,000 tokens
        states[0].blocks.insert(long_prompt[:234])  # 119,808 tokens cached
        states[0].book(RequestFeatures(long_prompt, 128_000), 100, now=0.0)
        states[1].book(RequestFeatures(list(range(5000, 5048)), 24_576), 100, now=0.0)
        return states

    request = RequestFeatures([9, 10], 1024)
    flat, priced = fleet(None), fleet(CostTerms.of_profile(resolve("h100-llama8b")))
    assert [s.pending_prefill_tokens for s in flat] == [8192, 24_576]
    assert TTFTPicker().pick(request, flat).worker == 0
    costs = TTFTPicker().costs(request, priced, [0, 0])
    assert costs[0] == pytest.approx(priced[0].cost.ttft_s(1024, 0, 0.0), rel=0.01)
    assert costs[0] > 1.5 * costs[1]
    assert TTFTPicker().pick(request, priced).worker == 1


def test_with_a_gpu_profile_share_prices_the_prompts_own_prefill_with_the_profile():
    # a cold 100k-token prompt delays whoever comes behind it by its attention too: 2.3 s of
    # tokens and 8.0 s of attention on an H100, where the flat rate reads 6.7 s in all
    from router.cache.cost_model import CostTerms, WorkerCost
    from router.cache.cost_profile import resolve

    worker = WorkerState(
        "w0", BlockLRU(1024, 512), cost=WorkerCost(CostTerms.of_profile(resolve("h100-llama8b")))
    )
    for first in (5000, 6000):  # two requests in flight, their queue a whole number of chunks
        worker.book(RequestFeatures(list(range(first, first + 16)), 8192), 100, now=0.0)
    assert worker.num_requests == 2 and worker.prefill_tail(CHUNK) == (0, 0)
    request = RequestFeatures(list(range(9000, 9196)), 100_352)
    picker = TTFTPicker(eviction_weight=0.0, memory_weight=0.0, block_weight=0.0)
    ttft = worker.cost.ttft_s(100_352, 0, 0.0)
    own = worker.cost.prefill_s(100_352, 0)
    assert own > 1.4 * 100_352 / RATE
    wait = (2 * 8192 + 100_352) / worker.rate.tokens_per_s  # the gate keeps the rate
    share = own * 2 * wait * wait / (wait * wait + picker.params.share_tau_s**2)
    assert picker.costs(request, [worker], [0])[0] == pytest.approx(ttft + share, rel=1e-6)

"""Flow control's pure part on hand-made cases: classification, order, limits, saturation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from policies.base import NoHealthyWorker, RequestFeatures
from router.cache.cost_model import CostTerms, WorkerCost
from router.cache.cost_profile import resolve
from router.core.flow_queue import (
    DEFAULT_FLOW,
    KV_RESERVE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_BYTES,
    QUEUE_FULL,
    FlowQueue,
    Limits,
    Prediction,
    QueueFull,
    StepCost,
    Waiting,
    classify,
    memory_wait,
    predicted_ttft,
    saturated,
)


def headers(**values: str):
    table = {k.replace("_", "-"): v for k, v in values.items()}
    return table.get


def item(band=0, flow="a", cost=100, size=10, arrival=0.0, deadline=None, name=None):
    return Waiting(band, flow, cost, size, arrival, deadline, payload=name)


def drain(q: FlowQueue) -> list:
    out = []
    while (w := q.pop()) is not None:
        out.append(w.payload)
    return out


# ---- classification ---------------------------------------------------------------------


def test_priority_header_first_then_objective_then_body_priority():
    objectives = {"interactive": 10, "batch": -1}
    c = classify(headers(x_priority="3", x_llm_d_inference_objective="batch"), {}, objectives)
    assert c.band == 3
    c = classify(headers(x_llm_d_inference_objective="batch"), {"priority": 5}, objectives)
    assert c.band == -1
    c = classify(headers(x_llm_d_inference_objective="unknown"), {"priority": 2}, objectives)
    assert c.band == -2  # vLLM's field: lower first
    assert classify(headers(), None, objectives).band == 0
    assert classify(headers(x_priority="high"), {"priority": True}, {}).band == 0


def test_a_priority_outside_the_range_counts_as_its_bound():
    assert classify(headers(x_priority="9" * 40), None, {}).band == PRIORITY_MAX
    assert classify(headers(x_priority="-12345"), None, {}).band == PRIORITY_MIN
    assert classify(headers(), {"priority": -(10**9)}, {}).band == PRIORITY_MAX  # vLLM's field
    assert classify(headers(x_llm_d_inference_objective="x"), None, {"x": 10**6}).band == 1000
    assert classify(headers(x_priority="-7"), None, {}).band == -7  # inside: as it is


def test_flow_from_fairness_header_else_api_key_tenant_else_default():
    c = classify(headers(x_llm_d_inference_fairness_id="tenant-a"), None, {}, api_key="sk-1")
    assert c.flow == "tenant-a"
    by_key = classify(headers(), None, {}, api_key="sk-secret").flow
    assert by_key.startswith("key-") and "secret" not in by_key
    assert by_key == classify(headers(), None, {}, api_key="sk-secret").flow
    assert classify(headers(), None, {}).flow == DEFAULT_FLOW
    custom = classify(headers(x_tenant="t9"), None, {}, fairness_header="x-tenant")
    assert custom.flow == "t9"


def test_slo_header_in_milliseconds():
    assert classify(headers(x_llm_d_slo_ttft_ms="250"), None, {}).slo_s == 0.25
    assert classify(headers(x_llm_d_slo_ttft_ms="nan"), None, {}).slo_s is None
    assert classify(headers(x_llm_d_slo_ttft_ms="-5"), None, {}).slo_s is None


# ---- order ------------------------------------------------------------------------------


def test_strict_priority_across_bands():
    q = FlowQueue()
    q.push(item(band=0, name="low"))
    q.push(item(band=-1, name="shed"))
    q.push(item(band=5, name="high"))
    q.push(item(band=0, name="low2"))
    assert drain(q) == ["high", "low", "low2", "shed"]
    assert len(q) == 0


def test_fair_share_by_attained_prompt_tokens():
    q = FlowQueue()
    for i in range(4):
        q.push(item(flow="heavy", cost=100, arrival=i, name=f"h{i}"))
    q.push(item(flow="light", cost=100, arrival=10, name="l0"))
    q.push(item(flow="light", cost=100, arrival=11, name="l1"))
    # equal service: alternate, though the heavy flow's requests all came first
    assert drain(q) == ["h0", "l0", "h1", "l1", "h2", "h3"]


def test_weights_divide_attained_service():
    q = FlowQueue(weights={"gold": 2.0})
    for i in range(3):
        q.push(item(flow="gold", cost=100, arrival=i, name=f"g{i}"))
        q.push(item(flow="free", cost=100, arrival=i, name=f"f{i}"))
    order = drain(q)
    assert order[:3].count("g0") + order[:3].count("g1") == 2  # gold twice as often early


def test_an_idle_flow_banks_no_credit():
    q = FlowQueue()
    for i in range(5):
        q.push(item(flow="busy", cost=100, arrival=i, name=f"b{i}"))
    assert [q.pop().payload for _ in range(3)] == ["b0", "b1", "b2"]
    q.push(item(flow="new", cost=100, arrival=9, name="n0"))
    q.push(item(flow="new", cost=100, arrival=9, name="n1"))
    # the new flow starts level with the busy one, not 300 tokens behind: they alternate
    assert drain(q) == ["b3", "n0", "b4", "n1"]


def test_within_a_flow_fcfs_or_earliest_deadline():
    q = FlowQueue(Limits(ttl_s=30))
    q.push(item(arrival=0, name="first"))
    q.push(item(arrival=1, name="second"))
    q.push(item(arrival=2, deadline=2.5, name="urgent"))
    assert drain(q) == ["urgent", "first", "second"]


def test_limits_per_band():
    q = FlowQueue(Limits(max_requests=2, max_bytes=0))
    q.push(item(band=0))
    q.push(item(band=0))
    with pytest.raises(QueueFull) as full:
        q.push(item(band=0))
    assert full.value.reason == QUEUE_FULL
    q.push(item(band=1))  # another band has its own room
    q = FlowQueue(Limits(max_requests=0, max_bytes=100))
    q.push(item(size=60))
    with pytest.raises(QueueFull) as full:
        q.push(item(size=60))
    assert full.value.reason == QUEUE_BYTES
    q.pop()
    q.push(item(size=60))  # the bytes were given back


def test_ttl_expiry_and_removal():
    q = FlowQueue(Limits(ttl_s=5))
    a, b, c = item(arrival=0, name="a"), item(arrival=3, name="b"), item(flow="x", name="c")
    for w in (a, b, c):
        q.push(w)
    assert q.expired(4.9) == []
    assert {w.payload for w in q.expired(5.0)} == {"a", "c"}
    assert q.remove(b) and not q.remove(b)
    assert len(q) == 0 and q.head() is None
    assert q.snapshot() == {"queued": 0, "bands": {}}


def test_many_priorities_leave_no_structure_behind_past_the_kept_bands():
    q = FlowQueue()
    for band in range(-500, 500):  # each band pushed and emptied once
        q.push(item(band=band, flow=f"f{band}"))
        assert q.pop() is not None
    assert len(q.bands) <= FlowQueue.BANDS_KEPT + 1
    q.push(item(band=3, name="a"))
    q.push(item(band=7, name="b"))
    assert drain(q) == ["b", "a"]  # the order unchanged


def test_snapshot_counts_bands_and_flows():
    q = FlowQueue()
    q.push(item(band=1, flow="a", size=5))
    q.push(item(band=1, flow="b", size=7))
    q.push(item(band=0, flow="a", size=1))
    snap = q.snapshot()
    assert snap["queued"] == 3
    assert snap["bands"]["1"]["bytes"] == 12
    assert snap["bands"]["1"]["flows"]["b"]["queued"] == 1
    assert q.ahead_of(1) == 2 and q.ahead_of(0) == 3 and q.ahead_of(2) == 0


# ---- saturation -------------------------------------------------------------------------


@dataclass
class View:
    pending_prefill_tokens: int = 0
    hit: int = 0
    healthy: bool = True
    num_requests: int = 0
    ongoing_decode_tokens: int = 0
    held_tokens: int = 0
    kv_capacity_tokens: int = 0
    cost: WorkerCost | None = None  # the router's cost model (None: the flat prediction)
    tiered: bool = False  # no CPU tier read (policies.base.CPUTier)

    def estimate_cache_hit(self, blocks, tokens=None) -> int:
        return self.hit


def features(n: int) -> RequestFeatures:
    return RequestFeatures(blocks=(), input_length=n)


PREFILL_ONLY = StepCost(0.0, 0.0)  # engine steps free: the prefill terms alone


def test_predicted_ttft_is_the_best_workers_queue_plus_own_uncached_prefill():
    views = [View(pending_prefill_tokens=4000), View(pending_prefill_tokens=1000, hit=500)]
    p = predicted_ttft(features(1000), views, default_rate=1000.0, cost=PREFILL_ONLY)
    assert p.ttft_s == pytest.approx(1.5)  # (1000 + 500) / 1000 on the second
    assert p.own_s == pytest.approx(0.5)
    assert saturated(p, 1.0) and not saturated(p, 2.0)
    with pytest.raises(NoHealthyWorker):
        predicted_ttft(features(10), [View(healthy=False)], 1000.0)


@dataclass
class TieredView(View):
    """A worker whose CPU KV tier the router reads (WorkerState's tier interface)."""

    cpu_hit: int = 0
    kv_load_s_per_token: float = 0.0
    tiered: bool = True

    def estimate_tiers(self, blocks, tokens=None) -> tuple[int, int]:
        return self.hit, self.cpu_hit


def test_predicted_ttft_counts_a_cpu_tier_hit_at_its_load_time():
    views = [TieredView(cpu_hit=800, kv_load_s_per_token=0.0001), View(pending_prefill_tokens=0)]
    p = predicted_ttft(features(1000), views, default_rate=1000.0, cost=PREFILL_ONLY)
    # the first: 200 tokens to prefill (0.2 s) and 800 to load (0.08 s); the second: 1 s
    assert p.ttft_s == pytest.approx(0.28)
    assert p.own_s == pytest.approx(0.2)


def test_a_prompt_too_long_for_the_target_goes_once_a_worker_is_free():
    alone = Prediction(ttft_s=5.0, own_s=5.0)
    assert not saturated(alone, 2.0)
    assert saturated(Prediction(ttft_s=5.1, own_s=5.0), 2.0)


def test_a_long_prompt_goes_to_a_free_worker_though_another_would_prefill_it_faster():
    """Issue 52: "its own prefill alone" is per worker. 3000 tokens at 1000/s: the first
    worker holds 2000 of them but has 4000 queued (1 s alone, 5 s there), the second is free
    and cold (3 s alone, past a 2 s target). The second starts it at once, so waiting cannot
    help it; compared with the first worker's 1 s alone, it waited for that queue to empty
    and held its whole band (and every lower one) behind it meanwhile."""
    views = [View(pending_prefill_tokens=4000, hit=2000), View()]
    p = predicted_ttft(features(3000), views, default_rate=1000.0, cost=PREFILL_ONLY)
    assert p.ttft_s == pytest.approx(3.0) and p.own_s == pytest.approx(1.0)
    assert p.wait_s == 0.0 and not saturated(p, 2.0)
    views[1] = View(pending_prefill_tokens=100)  # no worker free: it waits
    p = predicted_ttft(features(3000), views, default_rate=1000.0, cost=PREFILL_ONLY)
    assert p.wait_s == pytest.approx(0.1) and saturated(p, 2.0)


def test_below_the_highest_priority_seen_a_request_leaves_kv_room_for_it():
    """Issue 52: interactive requests waited for KV room at workers that the batch band's
    long decodes had filled. While a higher priority has been seen within the TTL, a lower
    band stops at 1 - KV_RESERVE of every worker's KV; the highest band does not."""
    from router.core.flow import PLACE, QUEUE, SHED, FlowAdmission

    views = [View(held_tokens=700, num_requests=1, kv_capacity_tokens=1000) for _ in range(2)]
    flow = FlowAdmission(FlowQueue(Limits(ttl_s=30.0)), lambda model: views, 1000.0, 2.0)
    assert flow.decide(features(100), 0, now=0.0) == PLACE  # the highest seen: no reserve
    assert flow.decide(features(100), 1, now=1.0) == PLACE
    assert flow.kv_limit_for(0, now=2.0) == pytest.approx(1.0 - KV_RESERVE)
    assert flow.decide(features(100), 0, now=2.0) == QUEUE  # 800 of 1000 > 60% everywhere
    assert flow.decide(features(100), -1, now=2.0) == SHED
    assert flow.decide(features(100), 1, now=3.0) == PLACE
    assert flow.decide(features(100), 0, now=40.0) == PLACE  # none past the TTL: no reserve
    off = FlowAdmission(FlowQueue(), lambda model: views, 1000.0, 2.0, kv_reserve=0.0)
    off.decide(features(100), 1, now=0.0)
    assert off.decide(features(100), 0, now=1.0) == PLACE


def test_kv_limit_saturates_when_every_worker_is_full():
    views = [View(held_tokens=900, kv_capacity_tokens=1000), View(held_tokens=100)]
    assert not predicted_ttft(features(200), views, 1000.0, kv_limit=1.0).kv_full
    views[1] = View(held_tokens=950, kv_capacity_tokens=1000)
    p = predicted_ttft(features(200), views, 1000.0, kv_limit=1.0)
    assert p.kv_full and saturated(p, 10.0)
    assert not predicted_ttft(features(200), views, 1000.0).kv_full  # off by default
    assert math.isfinite(p.ttft_s)


def test_kv_limit_lets_a_prompt_past_its_share_go_to_a_worker_that_holds_nothing():
    """9000 tokens against half of 16384: no worker can take it under the limit, so it goes
    once one holds nothing (the worker answers it alone), never held for the TTL."""
    busy = [View(held_tokens=100, kv_capacity_tokens=16384) for _ in range(2)]
    p = predicted_ttft(features(9000), busy, 1000.0, kv_limit=0.5)
    assert p.kv_full and saturated(p, 100.0)
    busy[1] = View(held_tokens=0, kv_capacity_tokens=16384)
    p = predicted_ttft(features(9000), busy, 1000.0, kv_limit=0.5)
    assert not p.kv_full and not saturated(p, 100.0)


# ---- the decode the prefill's steps carry (issue 52) ---------------------------------------


def test_every_step_of_queued_prefill_carries_the_decode_of_the_held_context():
    """16384 queued + 8192 own tokens at 10k/s: 2.4576 s of prefill in 24576 / 8192 + 1 = 4
    engine steps, each carrying a decode step of 0.01 s + 1e-8 s x 1M held tokens."""
    cost = StepCost(step_s=0.01, token_s=1e-8, chunk_tokens=8192)
    views = [View(pending_prefill_tokens=16384, held_tokens=1_000_000, num_requests=8)]
    p = predicted_ttft(features(8192), views, 10_000.0, cost=cost)
    assert p.ttft_s == pytest.approx(2.4576 + 4 * 0.02)
    # its own prefill alone there: 8192 tokens, 2 steps of the same decode
    assert p.own_s == pytest.approx(0.8192 + 2 * 0.02)


def test_a_fleet_of_long_running_sequences_is_saturated_before_its_prefill_alone_says_so():
    """Issue 52: 24576 tokens of prefill at 15k/s is 1.64 s, within a 2 s target; but every
    one of its 4 steps also decodes 32 sequences of 128k context (0.18 s a step, at the
    default cost: the H100 8B profile's), so the first token comes past the target."""
    views = [
        View(pending_prefill_tokens=16384, held_tokens=32 * 131072, num_requests=32)
        for _ in range(2)
    ]
    prefill_only = predicted_ttft(features(8192), views, 15_000.0, cost=PREFILL_ONLY)
    assert not saturated(prefill_only, 2.0)
    p = predicted_ttft(features(8192), views, 15_000.0)
    assert p.ttft_s == pytest.approx(24576 / 15_000 + 4 * (0.008 + 4.3e-8 * 32 * 131072))
    assert saturated(p, 2.0)


def test_an_empty_prefill_queue_takes_a_long_prompt_whatever_decodes_there():
    """The request's own prefill with the decode it carries is its floor: a prompt too long
    for the target goes to a worker whose prefill queue is empty, however much runs there
    (waiting for one with nothing running could last as long as its sequences)."""
    busy = {"held_tokens": 2_000_000, "num_requests": 16}
    views = [View(**busy), View(pending_prefill_tokens=20_000, **busy)]
    p = predicted_ttft(features(60_000), views, 15_000.0)
    assert p.ttft_s > 4.0 and p.ttft_s == pytest.approx(p.own_s)
    assert not saturated(p, 2.0)


def test_a_worker_whose_kv_is_full_waits_for_running_sequences_to_finish():
    """4 running requests hold 1000 of 1000 KV tokens with 400 tokens of output booked: 250
    more need one of them to finish, about 100 / 5 = 20 decode steps away."""
    cost = StepCost(step_s=0.01, token_s=0.0)
    full = View(
        num_requests=4, held_tokens=1000, kv_capacity_tokens=1000, ongoing_decode_tokens=400
    )
    assert memory_wait(250, full, cost.terms(1000.0)) == pytest.approx(20 * 0.01)
    # 750 more need three of them: 60 steps
    assert memory_wait(750, full, cost.terms(1000.0)) == pytest.approx(60 * 0.01)
    p = predicted_ttft(features(250), [full], 1000.0, cost=cost)
    steps = 250 / 8192 + 1
    assert p.ttft_s == pytest.approx(0.25 + steps * 0.01 + 0.2)
    assert p.own_s == pytest.approx(0.25 + steps * 0.01)  # the wait is the others': no floor
    room = View(num_requests=4, held_tokens=500, kv_capacity_tokens=1000, ongoing_decode_tokens=400)
    assert memory_wait(250, room, cost.terms(1000.0)) == 0.0


def test_a_worker_that_holds_nothing_never_waits_for_kv_room():
    """A prompt larger than the worker's KV is the worker's to answer alone, not a wait."""
    empty = View(kv_capacity_tokens=1000)
    assert memory_wait(5000, empty) == 0.0
    assert memory_wait(5000, View(num_requests=1, held_tokens=100)) == 0.0  # capacity unknown


def test_the_decode_cost_settings_default_to_the_constants_flow_control_uses():
    from router.config import Settings
    from router.core.flow_queue import DECODE_STEP_S, DECODE_TOKEN_S

    settings = Settings()
    assert settings.flow_decode_step_s == DECODE_STEP_S
    assert settings.flow_decode_token_s == DECODE_TOKEN_S


# ---- one predictor: the router's cost model when a GPU profile prices it (issue 52) -------

H100_TERMS = CostTerms.of_profile(resolve("h100-llama8b"))


def attention_heavy(cost: WorkerCost) -> View:
    """A worker with two 8k-token prefills queued, each after 150k cached tokens (a long
    agentic turn extending the previous one), booked on ``cost``; the request after them
    hits 150k cached tokens too."""
    for _ in range(2):
        cost.book(8192, 150_000, 158_192, 256, now=0.0)
    return View(
        pending_prefill_tokens=16_384,
        hit=150_000,
        num_requests=2,
        held_tokens=2 * (158_192 + 256),
        cost=cost,
    )


def test_with_a_gpu_profile_saturation_reads_the_cost_models_prediction():
    """The attention over the cached prefix is most of these prefills' cost: 2k new tokens
    after 150k cached behind two such 8k chunks take about 4.6 s on an H100 (the profile),
    while the flat rate (15k tokens/s plus the decode of the held context) says 1.4 s. Flow
    control reads the cost model's prediction, the one the ttft picker prices with, so the
    fleet is saturated at a 2 s target where the flat formula would dispatch."""
    request = features(152_048)
    flat = predicted_ttft(request, [attention_heavy(WorkerCost())], 15_000.0, now=0.0)
    assert flat.ttft_s < 2.0 and not saturated(flat, 2.0)
    cost = WorkerCost(H100_TERMS)
    view = attention_heavy(cost)
    p = predicted_ttft(request, [view], 15_000.0, now=0.0)
    assert p.ttft_s == pytest.approx(cost.ttft_s(2048, 150_000, 0.0))
    assert p.ttft_s > 4.0 and saturated(p, 2.0)
    # its own prefill alone there: the cost model's, with nothing queued ahead
    assert p.own_s == pytest.approx(H100_TERMS.ttft_s(2048, 2048 * 150_000 + 2048**2 / 2, 0, 0))
    # the learned correction is the cost model's too
    cost.factor = 0.5
    assert predicted_ttft(request, [view], 15_000.0, now=0.0).ttft_s == pytest.approx(p.ttft_s / 2)


def test_with_a_gpu_profile_the_queue_ahead_progresses_as_the_cost_model_says():
    cost = WorkerCost(H100_TERMS)
    view = attention_heavy(cost)
    request = features(152_048)
    later = predicted_ttft(request, [view], 15_000.0, now=1.0)
    assert later.ttft_s == pytest.approx(cost.ttft_s(2048, 150_000, 1.0))
    assert later.ttft_s < predicted_ttft(request, [view], 15_000.0, now=0.0).ttft_s


def test_the_flat_prediction_is_the_cost_models_arithmetic_on_the_step_costs_terms():
    """Without a profile (a flat WorkerCost, or none) flow control keeps its own terms (the
    learned rate, each step's decode by held context) but prices them with CostTerms.ttft_s:
    one formula for a worker's TTFT."""
    cost = StepCost(step_s=0.01, token_s=1e-8, chunk_tokens=8192)
    view = View(pending_prefill_tokens=16384, held_tokens=1_000_000, cost=WorkerCost())
    p = predicted_ttft(features(8192), [view], 10_000.0, cost=cost)
    assert p.ttft_s == pytest.approx(cost.terms(10_000.0).ttft_s(24_576, 0.0, 0, 1_000_000))
    assert p.ttft_s == pytest.approx(2.4576 + 4 * 0.02)


def test_with_a_gpu_profile_a_full_kv_waits_at_the_profiles_decode_step():
    cost = WorkerCost(H100_TERMS)
    full = View(
        num_requests=4,
        held_tokens=1000,
        kv_capacity_tokens=1000,
        ongoing_decode_tokens=400,
        cost=cost,
    )
    p = predicted_ttft(features(250), [full], 1000.0)
    wait = 20 * H100_TERMS.decode_step_s(4, 1000)  # one of 4 to finish: 100 / 5 steps
    assert memory_wait(250, full, H100_TERMS) == pytest.approx(wait)
    assert p.ttft_s == pytest.approx(cost.ttft_s(250, 0) + wait)

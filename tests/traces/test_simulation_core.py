"""The simulator decides with the router's own core (issue 51): the objects it holds are the
live router's, a simulated request reaches the same methods as one ``serve`` routes, and the
same requests, spaced so that timing does not decide, go to the same workers both ways.

No mocks: the calls are recorded with ``sys.setprofile`` while real code runs."""

from __future__ import annotations

import ast
import asyncio
import inspect
import sys
from collections.abc import Callable
from types import CodeType, SimpleNamespace

import traces.sim.simulator as simulator_module
from policies.base import RequestFeatures
from policies.registry import make_picker
from router.cache.sizing import shadow_sizes
from router.config import load_settings
from router.core.flow import FlowAdmission, FlowControl
from router.core.flow_queue import Classified
from router.core.metrics import RouterMetrics
from router.core.routing import Routed, RouterCore
from router.core.tokenize import make_tokenizer
from router.core.usage import Usage
from router.fleet.placement import Placement
from router.fleet.pool import WorkerPool
from traces.live.fleet import reset_caches, router, sim_workers, time_scaled_router_args
from traces.live.replay import ReplayConfig, replay
from traces.sim.config import SimConfig
from traces.sim.simulator import Simulation, simulate
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.record import BLOCK_TOKENS, TraceRequest

# the decisions: one implementation, which both front ends must reach
DECISIONS = {
    "choose": Placement.choose,
    "book": Placement.book,
    "report": Placement.report,
    "correct": Placement.correct,
    "release": Placement.release,
    "flow decide": FlowAdmission.decide,
    "flow predict": FlowAdmission.predict,
}


# the calls that decide, which only the core's objects may make
DECIDING = {"pick", "book", "finish", "first_token", "report_cached", "correct_shadow",
            "predicted_ttft", "saturated", "ahead_of"}  # fmt: skip


def calls(run: Callable[[], object]) -> set[CodeType]:
    """The code objects of every Python function called while ``run`` runs."""
    seen: set[CodeType] = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def reached(seen: set[CodeType]) -> set[str]:
    return {name for name, fn in DECISIONS.items() if fn.__code__ in seen}


def small_trace() -> list[TraceRequest]:
    """Two sessions of three turns each, 2 s apart; a turn's prompt holds its previous one."""
    trace = []
    for i in range(6):
        session, turn = i % 2, i // 2
        blocks = tuple(1000 * session + j for j in range(3 + turn))
        trace.append(TraceRequest(2.0 * i, f"s{session}", turn, 512 * len(blocks) - 100, 8, blocks))
    return trace


CONFIG = SimConfig(
    workers=3,
    worker=WorkerModelConfig(kv_capacity_tokens=64 * BLOCK_TOKENS),
    shadow_capacity_tokens=32 * BLOCK_TOKENS,  # a guess: the correction runs
    flow_control=True,
    hit_gap=False,
)


def test_the_simulation_holds_the_routers_decision_objects() -> None:
    sim = Simulation(small_trace(), make_picker("lmetric"), CONFIG)
    assert type(sim.placement) is Placement
    assert sim.placement.decisions is sim.branches
    assert isinstance(sim.flow, FlowAdmission) and issubclass(FlowControl, FlowAdmission)
    assert sim.flow.views_for(None) is sim.views is sim.states
    sizes = shadow_sizes(CONFIG.shadow_capacity_tokens, BLOCK_TOKENS, radix_key_tokens=2)
    for state in sim.states:  # sized by the pool's rule
        assert state.blocks.capacity_blocks == sizes.blocks
        assert state.radix.capacity_tokens == sizes.radix_tokens
        assert state.radix_token_weight == sizes.radix_weight
    run = sim.run()
    assert sum(run.branches.values()) == run.requests == 6  # every pick counted by the core


def test_the_simulator_calls_no_decision_of_its_own() -> None:
    """No pick, booking, release, report, correction or saturation test in the simulator's
    source but through the core's objects."""
    tree = ast.parse(inspect.getsource(simulator_module))
    own = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name in DECIDING and not receiver.endswith("placement"):
            own.add(ast.unparse(func))
    assert not own


def test_a_simulated_request_reaches_the_core_methods_serve_reaches() -> None:
    sim = Simulation(small_trace(), make_picker("lmetric"), CONFIG)
    offline = reached(calls(sim.run))

    settings = load_settings(
        workers=["http://127.0.0.1:9", "http://127.0.0.1:10"],
        policy="lmetric",
        flow_control=True,
        kv_capacity_tokens=32 * 512,
        correct_shadow=True,
    )
    pool = WorkerPool(settings)
    metrics = RouterMetrics(settings.policy)
    tokenizer = make_tokenizer(settings.tokenizer, settings.block_size)
    core = RouterCore(settings, pool, tokenizer, metrics)

    def route() -> None:
        features = RequestFeatures(blocks=(1, 2, 3), input_length=1600, session_id="s0")
        asyncio.run(core.flow.enter(features, Classified(0, "default", None), 100))
        request = SimpleNamespace(max_tokens=8, stream=True, stored_response_id=None)
        r = Routed("completions", request, features, pool.model_stats(None), {})
        worker, pick = core.choose(r)
        booking = core.book(r, worker, pick)
        booking.first_token()
        core.report(r, worker, booking, Usage(cached_tokens=0, prompt_tokens=1600))
        core.release(r, worker, booking, "ok")

    live = reached(calls(route))
    assert offline == live == set(DECISIONS)


def spaced_trace() -> list[TraceRequest]:
    """Four sessions, ten turns 5 s apart: each answered before the next is sent, so the
    fleet is idle at every pick and only the caches (and the router's learning) decide."""
    out = []
    turns: dict[int, int] = {}
    for i, s in enumerate([0, 1, 2, 0, 3, 1, 2, 0, 3, 1]):
        turn = turns[s] = turns.get(s, -1) + 1
        blocks = tuple(1000 * (s + 1) + j for j in range(3 + turn))
        out.append(TraceRequest(5.0 * i, f"s{s}", turn, 512 * len(blocks) - 100, 8, blocks))
    return out


def test_serve_and_the_simulator_choose_the_same_worker_for_each_request() -> None:
    """The same requests through ``serve`` in front of sim workers (5x real time, the
    router's times scaled alike) and through the simulator: the same worker each time. At
    10x, 0.3 s real apart, a loaded host's lag (ten times over, as modelled time) taught the
    router's cost model a slower worker and a tie between idle workers went the other way."""
    scale = 5.0
    trace = spaced_trace()
    with sim_workers(3, ["--time-scale", str(scale)]) as workers:
        urls = [w.url for w in workers]
        for policy in ("ttft", "lmetric"):
            config = SimConfig(workers=3, hit_gap=False)
            offline = simulate(trace, make_picker(policy), config).worker.tolist()
            with router(urls, policy, time_scaled_router_args(policy, scale)) as svc:
                cfg = ReplayConfig(
                    url=svc.url, worker_urls=tuple(urls), speedup=scale, vocab_size=4096
                )
                outcome = asyncio.run(replay(trace, cfg, policy))
            assert outcome.errors == 0 and outcome.run.requests == len(trace)
            live = [urls.index(outcome.served_by[w].rstrip("/")) for w in outcome.run.worker]
            assert live == offline, policy
            assert len(set(offline)) > 1  # the sessions spread: the picks were choices
            assert reset_caches(urls)

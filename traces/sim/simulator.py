"""The offline simulator: a trace through N worker models and a router, in virtual time.

The router part is the live router's own code, not a copy of it (:class:`Simulation`): the
same pickers (``policies``), the same per-worker
:class:`router.cache.worker_state.WorkerState` (block-hash LRU and radix shadows, load
counters) sized by the pool's rule (:mod:`router.cache.sizing`), and the same decisions:
:class:`router.fleet.placement.Placement` chooses, books (at dispatch), scores the reports,
corrects the shadows' capacity while it is a guess and releases (pending prefill at the first
token, everything at completion), and :class:`router.core.flow.FlowAdmission` admits with flow
control. Only the clock and the workers are simulated: each
worker is a :class:`traces.sim.worker_model.WorkerModel` with a real radix KV cache, so the hit
rate reported here is the workers' true one, and the shadow's error is measured against it.

Precise mode (``kv_events``): the worker models record their KV events, each engine step's
events become one batch that reaches the router ``kv_event_delay_s`` later (a fraction
``kv_event_loss`` of batches never arrives) and feeds the router's own
:class:`router.cache.kv_index.KVEventFeed` / ``KVIndex``, which answers the estimates while
synced. A gap is filled from the worker's replay buffer at once (the live sim worker serves
the same buffer over its replay socket).

LoRA adapters: every worker serves ``base_model`` and, as LoRA adapters of it, every other
model a request names (``TraceRequest.model``). An adapter's request reaches the picker as
the proxy hands it over (:func:`router.cache.lora.under_adapter`: its own block chain, the
adapter booked on the worker's slots, which the router knows hold ``max_loras``, as the
workers' ``vllm:lora_requests_info`` tells the live router) and runs on the worker model
under the adapter (``max_loras`` per batch, a load per swap); ``lora_swaps`` counts the
workers' loads.

Disaggregated fleets (``prefill_workers`` and ``decode_workers`` both > 0; ``workers`` is
then ignored: the fleet is P + D): vLLM's NixlConnector flow. The policy under test picks a
prefill worker among the prefill workers' states (its shadows, its booking, so the hit rate
reported is the prefill workers' true one); the prefill runs there as a request with one output
token (booked with an expected output of 1). At its first token the prefill booking is
released and ``decode_policy`` (:mod:`policies.decode_load` by default) picks a decode worker
among the decode workers' states, booked with the request's full expected output. The
prompt's KV then crosses in ``kv_transfer_latency_s + tokens * kv_bytes_per_token /
(kv_transfer_gbps * 1e9)`` seconds, ``tokens`` the prompt less the prefix the decode
worker's model already holds (whole blocks, counted when the transfer starts), after which
the decode worker model admits it with ``kv_transferred`` (no prompt token computed; its first
token one step after admission). TTFT is arrival to the decode worker's first token, TPOT
the decode worker's. The prefill worker keeps the blocks cached as any finished request's
(the transfer reads them while they are still fresh; the model does not pin them for it).

A request no worker could take (its prompt plus ``max_tokens``, the output length, past
``max_model_len``, by default the worker's GPU KV capacity, to which vLLM caps it; the sim
worker does the same) is
refused at its arrival, as the engine answers it 400: counted in ``rejected`` and
``rejected_too_long``, never picked, booked or served, and left out of the hit rate's prompt
tokens (no worker looked it up).

Picks are timed with the wall clock (``pick_us``); everything else is virtual time.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Sequence
from itertools import takewhile

import numpy as np

from policies.base import Picker, RequestFeatures, check_views
from policies.registry import make_picker, picker_params
from router.cache.block_hash import KEY_TOKENS, keys_as_tokens
from router.cache.block_lru import BlockLRU
from router.cache.kv_index import KVEventFeed, KVIndex
from router.cache.lora import AdapterSlots, under_adapter
from router.cache.sizing import cpu_blocks, new_worker_state
from router.cache.worker_state import Booking, WorkerState
from router.core.dispatch_hold import DispatchHold, Slot
from router.core.engine_priority import engine_priority, orders_engine
from router.core.flow import PLACE, FlowAdmission
from router.core.flow_queue import (
    DEFAULT_FLOW,
    SHED,
    FlowQueue,
    Limits,
    QueueFull,
    StepCost,
    Waiting,
)
from router.core.prefix_owners import Claim, PrefixOwners, owner_key
from router.fleet.placement import Placement
from traces.sim.config import SimConfig
from traces.sim.miss_causes import FleetLedger
from traces.sim.worker_model import SimRequest, WorkerModel
from traces.trace.pacing import predecessors, release_time
from traces.trace.record import BLOCK_TOKENS, TraceRequest
from traces.trace.run import PolicyRun


class Ingest:
    """The router reading request bodies: processor sharing of ``bytes_per_s`` among the
    bodies in flight, so of a burst sent at once the small bodies are read first and the
    big ones late (what `serve`'s event loop does live: docs/live-vs-offline.md). The first
    ``window_bytes`` of a body are in when sent (what the connection holds at once)."""

    def __init__(self, bytes_per_s: float, window_bytes: float = 0.0) -> None:
        self.rate = bytes_per_s
        self.window = window_bytes
        self.left: dict[int, float] = {}
        self.now = 0.0

    def __bool__(self) -> bool:
        return bool(self.left)

    def _advance(self, now: float) -> None:
        if self.left and now > self.now:
            done = (now - self.now) * self.rate / len(self.left)
            for i in self.left:
                self.left[i] -= done
        self.now = max(self.now, now)

    def admit(self, i: int, nbytes: float, now: float) -> bool:
        """Body ``i`` of ``nbytes`` sent at ``now``: True when it is in at once (within the
        window), else it is read at the shared rate (:meth:`pop` gives it when whole)."""
        if nbytes <= self.window:
            return True
        self._advance(now)
        self.left[i] = nbytes - self.window
        return False

    def next_done(self) -> float:
        if not self.left:
            return float("inf")
        return self.now + max(0.0, min(self.left.values())) * len(self.left) / self.rate

    def pop(self) -> tuple[float, int]:
        """The next body read whole: (when, request)."""
        when = self.next_done()
        self._advance(when)
        i = min(self.left, key=self.left.__getitem__)
        del self.left[i]
        return when, i


def make_worker_states(
    config: SimConfig, count: int | None = None, prefix: str = "sim"
) -> list[WorkerState]:
    """The router's view of the simulated fleet, shadows sized to the workers' KV cache by the
    router's own rule (:func:`router.cache.sizing.new_worker_state`, as ``serve``'s pool;
    the radix tree holds each block as ``KEY_TOKENS`` key tokens) (``count`` workers named
    ``{prefix}-{i}``; default ``config.workers``)."""
    capacity = config.shadow_capacity_tokens or config.worker.kv_capacity_tokens
    worker = config.worker
    tiered = worker.cpu_kv_capacity_tokens > 0 and config.router_tiers == "on"
    terms = config.cost_terms()
    states = []
    for i in range(config.workers if count is None else count):
        state = new_worker_state(
            f"{prefix}-{i}",
            capacity,
            BLOCK_TOKENS,
            shadow=config.shadow,
            prefill_tokens_per_s=worker.prefill_tokens_per_s,
            cost_terms=terms,
            radix_key_tokens=KEY_TOKENS,
            adapters=AdapterSlots(worker.max_loras),
        )
        if tiered:
            state.cpu = BlockLRU(
                cpu_blocks(worker.cpu_kv_capacity_tokens, BLOCK_TOKENS), BLOCK_TOKENS
            )
        if worker.cpu_kv_capacity_tokens:
            # the router's belief, as serve's: its cost profile's rate, else the flat flags'
            state.kv_load_s_per_token = (
                config.cost_profile.load_s_per_token()
                if config.cost_profile is not None
                else worker.kv_bytes_per_token / (worker.kv_load_gbps * 1e9)
            )
        states.append(state)
    return states


def read_exactly(state: WorkerState, model: WorkerModel) -> None:
    """``--router-tiers exact``: ``state`` answers hits from ``model`` itself, each tier, plus
    the blocks of requests booked there and not yet admitted (they will be cached first)."""
    pinned = state.blocks.is_pinned

    def tiers(blocks: Sequence[int]) -> tuple[int, int]:
        gpu = max(model.cached_prefix_blocks(blocks), sum(1 for _ in takewhile(pinned, blocks)))
        return gpu * BLOCK_TOKENS, model.cpu_prefix_blocks(blocks, gpu) * BLOCK_TOKENS

    state.exact = tiers


def simulate(
    trace: Sequence[TraceRequest],
    picker: Picker,
    config: SimConfig | None = None,
    name: str | None = None,
    progress: bool = False,
) -> PolicyRun:
    """Run ``trace`` through ``picker`` and ``config.workers`` worker models (or, for a
    disaggregated fleet, ``picker`` over the prefill workers and ``config.decode_policy``
    over the decode workers): :meth:`Simulation.run`."""
    return Simulation(trace, picker, config, name, progress).run()


class Simulation:
    """One policy over one trace, in virtual time: a front end of the router's own core.

    The router's decisions are the live router's objects: a
    :class:`router.fleet.placement.Placement` chooses (the picker's pick, its branch
    counted), books, scores the workers' reports (correcting the shadows' capacity while it
    is a guess) and releases, on the :class:`WorkerState` s that
    :func:`make_worker_states` sizes by ``serve``'s rule; with flow control a
    :class:`router.core.flow.FlowAdmission` decides whether a request goes on, waits or is
    shed, and when the queue's head goes. What is simulated is the clock and the workers
    (:class:`traces.sim.worker_model.WorkerModel`): the events are a heap of the models' next
    steps, the requests' sends (open loop or session pacing), the KV transfers of a
    disaggregated fleet and the KV event batches of precise mode. :meth:`run` returns the
    :class:`PolicyRun`.
    """

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        picker: Picker,
        config: SimConfig | None = None,
        name: str | None = None,
        progress: bool = False,
    ) -> None:
        self.config = config = config or SimConfig()
        self.trace = trace
        self.picker = picker
        self.name = name or picker.name
        self.progress = progress
        self.n = n = len(trace)
        # per-request outcomes
        self.out = {
            k: np.zeros(n) for k in ("arrival", "first_token", "finish", "estimated", "pick_us")
        }
        self.cached = np.zeros(n, dtype=np.int64)
        self.cpu_cached = np.zeros(n, dtype=np.int64)
        self.cpu_estimated = np.zeros(n)
        self.chosen = np.zeros(n, dtype=np.int64)
        self.est_blocks = np.zeros(n)
        self.est_radix = np.full(n, np.nan)
        self.est_kv = np.full(n, np.nan)
        self.predicted = np.full(n, np.nan)
        self.sent_at = np.zeros(n)
        self.rejected = np.zeros(n, dtype=bool)
        context = config.context_tokens
        self.too_long = np.fromiter(
            (r.context_tokens > context for r in trace), dtype=bool, count=n
        )
        self.bookings: list[Booking | None] = [None] * n
        self.sent = 0
        # the router: its states, its decisions
        self.branches: dict[str, int] = {}
        self.placement = Placement(self.branches)
        # the router sets engine priorities: workers that take them and a picker that does
        # (as serve --engine-priority: not on a disaggregated fleet)
        self.engine_order = (
            config.worker.scheduling_policy == "priority"
            and orders_engine(picker)
            and not config.disaggregated
        )
        # ... or holds requests for room on their workers, in that order (serve
        # --dispatch-hold-tokens: its streamed requests, and every one here is)
        self.hold = (
            DispatchHold(config.hold_tokens())
            if config.hold_tokens() and orders_engine(picker) and not config.disaggregated
            else None
        )
        self.slots: list[Slot | None] = [None] * n
        # under engine priority, the blocks the requests in the engines' queues will compute
        self.in_engine = PrefixOwners() if self.engine_order else None
        self.claims: list[Claim | None] = [None] * n
        self._make_fleet()
        self.views = self._picker_views()
        self.flow = self._make_flow()
        self._make_clock()

    # ---- setup ---------------------------------------------------------------------------

    def _make_fleet(self) -> None:
        """The router's states and the worker models (prefill or all workers first)."""
        config = self.config
        if config.disaggregated:
            self.states = make_worker_states(config, config.prefill_workers, "prefill")
            self.decode_states = make_worker_states(config, config.decode_workers, "decode")
        else:
            self.states = make_worker_states(config)
            self.decode_states = []
        self.all_states = self.states + self.decode_states
        states = self.states
        # the shadows' configured sizes, the bounds of the capacity correction
        self.capacity_blocks = states[0].blocks.capacity_blocks if states else 0
        self.radix_capacity = states[0].radix.capacity_tokens if states else 0
        correcting = config.correct_shadow
        if correcting is None:  # as the proxy: while the capacity is a guess
            correcting = config.shadow_capacity_tokens is not None
        self.correcting = correcting
        events = config.kv_events
        if not config.disaggregated:
            self.disagg = None
            self.models = [
                WorkerModel(config.worker, self._first_token, self._finished, events=events)
                for _ in states
            ]
        else:
            self.disagg = disagg = _Disaggregated(config, self.trace, self.decode_states)
            self.models = [
                WorkerModel(config.worker, self._prefilled, _ignore, events=events) for _ in states
            ]
            disagg.offset = len(self.models)
            disagg.decode_models = [
                WorkerModel(
                    config.worker, self._decode_first_token, self._decode_finished, events=events
                )
                for _ in self.decode_states
            ]
            self.models += disagg.decode_models
        self.ledger = (
            FleetLedger(self.trace, self.models)
            if config.hit_gap and not config.disaggregated
            else None
        )
        if config.router_tiers == "exact":
            for state, model in zip(self.all_states, self.models, strict=True):
                read_exactly(state, model)
        self.events = _EventLink(self.all_states, config) if config.kv_events else None

    def _picker_views(self) -> Sequence:
        """What the picker sees: the states; a reference picker (traces/sim/oracle.py) reads the
        models' truth instead."""
        picker, states = self.picker, self.states
        truth_views = getattr(picker, "truth_views", None)
        views = (
            truth_views(states, self.models[: len(states)]) if truth_views is not None else states
        )
        check_views(picker, views)
        return views

    def _views_for(self, model: str | None) -> Sequence:
        """The views for a request naming ``model`` (every simulated worker serves every
        model: the base model and, as LoRA adapters, the others)."""
        return self.views

    def _make_flow(self) -> FlowAdmission | None:
        """Flow control's admission, the live router's rule (:mod:`router.core.flow`)."""
        config = self.config
        if not config.flow_control:
            return None
        return FlowAdmission(
            FlowQueue(Limits(config.flow_queue_max, 0, config.flow_queue_ttl_s)),
            self._views_for,
            config.worker.prefill_tokens_per_s,
            config.flow_target_ttft_s,
            cost=StepCost(config.flow_decode_step_s, config.flow_decode_token_s),
            kv_reserve=config.flow_kv_reserve,
        )

    def _make_clock(self) -> None:
        """The event queues: model steps, sends (pacing), KV transfers, bodies read, and the
        in-flight samples."""
        config, trace, n = self.config, self.trace, self.n
        self.wakeups: list[tuple[float, int, int]] = []  # (time, worker, version)
        # requests due to be sent, (time, index): all of them at their arrival in open loop;
        # in session pacing a turn enters when its session's previous turn finishes
        previous = predecessors(trace, config.pacing)
        self.successor = successor = [-1] * n
        for j, p in enumerate(previous):
            if p >= 0:
                successor[p] = j
        self.arrivals = [
            (trace[j].arrival / config.speedup, j) for j in range(n) if previous[j] < 0
        ]
        heapq.heapify(self.arrivals)
        # disaggregated: KV transfers under way, (done, index); empty otherwise
        self.transfers: list[tuple[float, int]] = (
            self.disagg.transfers if self.disagg is not None else []
        )
        self.ingest = None
        if config.ingest_bytes_per_s > 0:
            self.ingest = Ingest(config.ingest_bytes_per_s, config.ingest_window_bytes)
        # the recorded span (a session-paced run that falls behind goes on past its last
        # sample)
        span = (trace[-1].arrival / config.speedup) if n else 0.0
        self.sample_times = np.linspace(0.0, span, config.samples) if n else np.zeros(0)
        self.inflight = np.zeros((len(self.sample_times), len(self.all_states)), dtype=np.int32)
        self.next_sample = 0

    # ---- the run -------------------------------------------------------------------------

    def run(self) -> PolicyRun:
        """Every request sent, placed (or refused) and answered; the outcomes."""
        started = time.perf_counter()
        while self._busy():
            self._step()
        if self.progress:
            sys.stderr.write("\n")
        leaked = [s.name for s in self.all_states if s.num_requests or s.pending_prefill_tokens]
        if leaked:  # every booking must have been released by its worker model
            raise RuntimeError(f"simulation ended with bookings held on {leaked}")
        return self._result(time.perf_counter() - started)

    def _busy(self) -> bool:
        return bool(
            self.arrivals
            or self.wakeups
            or self.transfers
            or (self.events is not None and self.events.deliveries)
            or self.ingest
            or (self.flow is not None and len(self.flow.queue))
        )

    def _step(self) -> None:
        """The next event: a KV event batch delivered, a KV transfer done, a model's step,
        or a request reaching the router."""
        events = self.events
        if self.flow is not None and not (
            self.arrivals or self.wakeups or self.transfers or self.ingest
        ):
            self._queue_only()
            return
        arrival = self.arrivals[0][0] if self.arrivals else float("inf")
        if self.ingest is not None:  # the next send, or the next body read whole
            arrival = min(arrival, self.ingest.next_done())
        wakeup = self.wakeups[0][0] if self.wakeups else float("inf")
        transfers = self.transfers
        if transfers:
            wakeup = min(wakeup, transfers[0][0])
        if events is not None and events.due(wakeup, arrival):
            events.deliver()
        elif transfers and transfers[0][0] <= arrival and transfers[0][0] <= wakeup:
            when, i = heapq.heappop(transfers)
            if events is not None:
                events.clock[0] = when
            self._schedule(self.disagg.transferred(i, when))
        elif self.wakeups and self.wakeups[0][0] <= arrival:
            self._wake()
        else:
            self._arrive(arrival)

    def _queue_only(self) -> None:
        """Only flow control's queue is left, the fleet idle: its head goes (never saturated
        then)."""
        events, queue = self.events, self.flow.queue
        if events is not None and events.deliveries:
            events.deliver()
            return
        now = max(float(np.nanmax(self.out["finish"])), 0.0) if self.sent else 0.0
        before = len(queue)
        self._drain(now)
        if len(queue) == before:  # (a guard: the head goes all the same)
            head = queue.pop()
            self._place(*head.payload, now)

    def _wake(self) -> None:
        """A worker model's next step."""
        when, w, version = heapq.heappop(self.wakeups)
        model = self.models[w]
        if version != model.version:
            return
        events = self.events
        if events is not None:
            events.clock[0] = when
        model.advance(when)
        if events is not None:
            events.publish(w, model.take_events(), when)
        self._schedule(w)
        if self.flow is not None and len(self.flow.queue):
            self._drain(when)

    def _schedule(self, w: int) -> None:
        model = self.models[w]
        if model.next_event is not None:
            heapq.heappush(self.wakeups, (model.next_event, w, model.version))

    def _arrive(self, arrival: float) -> None:
        """A request is sent (or its body read whole): refused, admitted or placed."""
        if self.events is not None:
            self.events.clock[0] = arrival
        while (
            self.next_sample < len(self.sample_times)
            and self.sample_times[self.next_sample] <= arrival
        ):
            self.inflight[self.next_sample] = [s.num_requests for s in self.all_states]
            self.next_sample += 1
        taken = self._take(arrival)
        if taken is None:
            return
        arrival, i = taken
        if self.too_long[i]:  # the engine's 400: answered at once, nothing booked
            self._refuse(i, arrival)
            return
        features, adapter = self._features(i, arrival)
        if self.flow is None:
            self._place(i, features, adapter, arrival)
        else:
            self._admit(i, features, adapter, arrival)
            if len(self.flow.queue):
                self._drain(arrival)
        sent, n = self.sent, self.n
        if self.progress and (sent % 500 == 0 or sent == n):
            sys.stderr.write(f"\r  {self.name:<20} {sent:>7}/{n} requests")
            sys.stderr.flush()

    def _take(self, arrival: float) -> tuple[float, int] | None:
        """The request that reaches the picker at ``arrival``: the next sent, or with the
        router's reading of bodies the next read whole (None: a body still being read)."""
        ingest = self.ingest
        if ingest is None:
            _, i = heapq.heappop(self.arrivals)
            self.sent_at[i] = arrival
            return arrival, i
        if self.arrivals and self.arrivals[0][0] <= arrival:
            _, i = heapq.heappop(self.arrivals)
            self.sent_at[i] = arrival
            body = self.trace[i].input_length * self.config.body_bytes_per_token
            if not ingest.admit(i, body, arrival):  # else it is in at once, in send order
                return None
            return arrival, i
        return ingest.pop()

    def _features(self, i: int, arrival: float) -> tuple[RequestFeatures, str | None]:
        """Request ``i`` as the router reads it, and the LoRA adapter it runs under."""
        req, config = self.trace[i], self.config
        features = RequestFeatures(
            blocks=req.blocks,
            input_length=req.input_length,
            session_id=req.session_id,
            tokens=keys_as_tokens(req.blocks)
            if config.shadow == "radix" or self.events is not None
            else None,
            model=req.model,
            arrival=arrival,
        )
        adapter = req.model if req.model not in (None, config.base_model) else None
        if adapter is not None:
            features = under_adapter(features, adapter)
        return features, adapter

    # ---- the router's decisions ----------------------------------------------------------

    def _admit(self, i: int, features: RequestFeatures, adapter: str | None, now: float) -> None:
        """Flow control's admission (:meth:`FlowAdmission.decide`): placed, shed or queued."""
        req = self.trace[i]
        band, tenant = req.priority, req.tenant or DEFAULT_FLOW
        decision = self.flow.decide(features, band, now)
        if decision == PLACE:
            self._place(i, features, adapter, now)
            return
        if decision == SHED:
            self._refuse(i, now)
            return
        item = Waiting(band, tenant, req.input_length, 0, now, payload=(i, features, adapter))
        try:
            self.flow.queue.push(item)
        except QueueFull:
            self._refuse(i, now)

    def _drain(self, now: float) -> None:
        """The queue's expired requests refused; its heads placed while the fleet is not
        saturated for them (:meth:`FlowAdmission.release`)."""
        flow = self.flow
        for item in flow.queue.expired(now):
            self._refuse(item.payload[0], now)
        while (item := flow.release(now, _queued_features)) is not None:
            self._place(*item.payload, now)

    def _place(
        self, i: int, features: RequestFeatures, adapter: str | None, arrival: float
    ) -> None:
        """Choose, book and submit request ``i`` at ``arrival`` (its send, or its release
        from the flow-control queue)."""
        req, disagg = self.trace[i], self.disagg
        t0 = time.perf_counter_ns()
        pick = self.placement.choose(self.picker, features, self.views)
        self.out["pick_us"][i] = (time.perf_counter_ns() - t0) / 1000
        # a prefill worker's request is the prompt and one output token
        expected = 1 if disagg is not None else req.output_length
        booking = self.placement.book(self.states[pick.worker], features, expected, now=arrival)
        self.bookings[i] = booking
        ordered = self.engine_order or self.hold is not None
        key = 0
        if ordered:
            registries = (self.hold, self.in_engine)
            after = owner_key(registries, pick.worker, booking.blocks, booking.cached_blocks)
            key = engine_priority(booking, self.sent_at[i], after=after)
            if self.in_engine is not None:
                claim = self.claims[i] = Claim(key, booking.blocks)
                self.in_engine.add(pick.worker, claim)
        self._record_estimates(i, booking, arrival)
        self.out["arrival"][i] = self.sent_at[i]  # TTFT counts from the client's send
        self.chosen[i] = pick.worker
        output = 1 if disagg is not None else max(1, req.output_length)
        sim_req = SimRequest(req.blocks, req.input_length, output, tag=i, adapter=adapter)
        sim_req.priority = key if self.engine_order else 0
        if disagg is not None:
            disagg.features[i] = features
        self.sent += 1
        if self.hold is not None:
            slot = self.slots[i] = self.hold.enter(
                pick.worker, booking.new_prefill, key, sim_req, booking.blocks
            )
            if not slot.sent:
                return  # sent when its worker has room (_first_token)
        self._submit(pick.worker, sim_req, arrival)

    def _submit(self, w: int, sim_req: SimRequest, now: float) -> None:
        self.models[w].submit(sim_req, now)
        if self.views is not self.states:
            self.views[w].queue(sim_req)
        self._schedule(w)

    def _record_estimates(self, i: int, booking: Booking, arrival: float) -> None:
        """The estimates request ``i`` was booked on, and the predicted TTFT."""
        if self.disagg is None and booking.cost_entry is not None:
            self.predicted[i] = arrival - self.sent_at[i] + booking.cost_entry.predicted_s
        # the active GPU estimate (the KV index's when it answered), split by tier
        self.out["estimated"][i] = booking.gpu_estimate + booking.cpu_estimate
        self.cpu_estimated[i] = cpu = booking.cpu_estimate  # each shadow's, with the CPU tier's
        self.est_blocks[i] = booking.blocks_estimate + cpu
        if booking.radix_estimate is not None:
            self.est_radix[i] = booking.radix_estimate + cpu
        if booking.kv_estimate is not None:
            self.est_kv[i] = booking.gpu_estimate + cpu

    def _refuse(self, i: int, now: float) -> None:
        """Request ``i`` refused (flow control's 429, or the engine's 400)."""
        self.rejected[i] = True
        self.out["arrival"][i] = self.sent_at[i]
        self.out["first_token"][i] = np.nan
        self.out["finish"][i] = now
        self._release_next(i, now)

    def _release_next(self, i: int, now: float) -> None:
        after = self.successor[i]
        if after >= 0:  # session pacing: the session's next turn can now be sent
            when = release_time(self.trace[after], self.config.speedup, now)
            heapq.heappush(self.arrivals, (when, after))

    # ---- the workers' answers ------------------------------------------------------------

    def _correct(self, booking: Booking, req: SimRequest) -> None:
        """The proxy's capacity correction, when the usage arrives (at the end), while the
        shadows' capacity is a guess."""
        if self.correcting:
            self.placement.correct(
                booking, req.cached_tokens, self.capacity_blocks, self.radix_capacity
            )

    def _first_token(self, req: SimRequest, now: float) -> None:
        i = req.tag
        if self.hold is not None:
            self._left_hold(i, now)
        claim = self.claims[i]
        if claim is not None:
            self.claims[i] = None
            self.in_engine.remove(self.chosen[i], claim)
        self.out["first_token"][i] = now
        self.cached[i] = req.cached_tokens
        self.cpu_cached[i] = req.cpu_cached_tokens
        booking = self.bookings[i]
        self.placement.first_token(booking, now)
        self.placement.report(booking, req.cached_tokens, req.cpu_cached_tokens)

    def _left_hold(self, i: int, now: float) -> None:
        """Request ``i``'s prefill is through (or it ended): the held requests that now fit
        on its worker are sent."""
        slot, self.slots[i] = self.slots[i], None
        if slot is not None:
            for released in self.hold.leave(slot):
                self._submit(released.worker, released.payload, now)

    def _finished(self, req: SimRequest, now: float) -> None:
        i = req.tag
        if self.hold is not None:
            self._left_hold(i, now)
        self.out["finish"][i] = now
        booking = self.bookings[i]
        self._correct(booking, req)
        self.placement.release(booking)
        self.bookings[i] = None
        self._release_next(i, now)

    def _prefilled(self, req: SimRequest, now: float) -> None:
        """The prefill worker's part ends at its first token (its one output token): the
        usage arrives, the prefill booking is released, the decode side takes over."""
        i = req.tag
        self.cached[i] = req.cached_tokens
        booking = self.bookings[i]
        self.placement.first_token(booking, now)
        self.placement.report(booking, req.cached_tokens)
        self._correct(booking, req)
        self.placement.release(booking)
        self.bookings[i] = None
        self.disagg.prefilled(req, now)

    def _decode_first_token(self, req: SimRequest, now: float) -> None:
        self.out["first_token"][req.tag] = now
        self.disagg.decoded(req.tag, now, first_token=True)

    def _decode_finished(self, req: SimRequest, now: float) -> None:
        self.out["finish"][req.tag] = now
        self.disagg.decoded(req.tag, now, first_token=False)
        self._release_next(req.tag, now)

    # ---- the outcome ---------------------------------------------------------------------

    def _result(self, wall_seconds: float) -> PolicyRun:
        trace, out, config = self.trace, self.out, self.config
        run = PolicyRun(
            name=self.name,
            requests=self.n,
            worker=self.chosen,
            arrival=out["arrival"],
            first_token=out["first_token"],
            finish=out["finish"],
            output_length=np.array([max(1, r.output_length) for r in trace]),
            input_length=np.array([r.input_length for r in trace]),
            cached=self.cached,
            estimated=out["estimated"],
            pick_us=out["pick_us"],
            branches=self.branches,
            inflight_t=self.sample_times,
            inflight=self.inflight,
            wall_seconds=wall_seconds,
            estimates={
                k: v
                for k, v in (
                    ("blocks", self.est_blocks),
                    ("radix", self.est_radix),
                    ("kv", self.est_kv),
                )
                if not np.isnan(v).all()
            },
            lora_swaps=sum(m.stats.lora_swaps for m in self.models),
            slo_ttft_s=config.slo_ttft_s,
        )
        if self.ledger is not None:
            run.block_states = self.ledger.states
        if config.worker.cpu_kv_capacity_tokens > 0:
            run.cpu_cached, run.cpu_estimated = self.cpu_cached, self.cpu_estimated
        too_long = self.too_long
        if too_long.any():
            run.too_long = too_long
        disagg = self.disagg
        if disagg is None:
            run.predicted_ttft = self.predicted
        if (
            self.flow is not None
            or too_long.any()
            or any(r.priority or r.tenant is not None for r in trace)
        ):
            run.rejected = self.rejected
            run.priority = np.array([r.priority for r in trace], dtype=np.int64)
            run.tenant = np.array([r.tenant or DEFAULT_FLOW for r in trace])
        if disagg is not None:
            run.prefill_workers, run.decode_workers = len(self.states), len(self.decode_states)
            run.decode_worker = disagg.decode_worker
            run.prefill_done = disagg.prefill_done
            run.transfer_s = disagg.transfer_s
            run.transferred = disagg.transferred_tokens
            run.decode_branches = disagg.branches
        return run


def _queued_features(item: Waiting) -> RequestFeatures:
    """A queued request's features (its payload: index, features, adapter)."""
    return item.payload[1]


def _ignore(req: SimRequest, now: float) -> None:
    """A prefill worker's finish: everything happened at its first token."""


class _Disaggregated:
    """The hand-over of a disaggregated fleet: prefill done, decode pick, KV transfer.

    Worker models are indexed prefill workers first, then decode workers (``offset``).
    """

    def __init__(
        self,
        config: SimConfig,
        trace: Sequence[TraceRequest],
        decode_states: list[WorkerState],
    ) -> None:
        n = len(trace)
        self.config = config
        self.trace = trace
        self.decode_states = decode_states
        self.decode_models: list[WorkerModel] = []
        self.offset = 0  # the first decode model's index among all models
        params = {"seed": config.seed} if "seed" in picker_params(config.decode_policy) else {}
        self.picker = make_picker(config.decode_policy, **params)
        check_views(self.picker, decode_states)
        self.branches: dict[str, int] = {}
        self.placement = Placement(self.branches)  # the decode side's choices and bookings
        self.features: list[RequestFeatures | None] = [None] * n
        self.bookings: list[Booking | None] = [None] * n
        self.decode_worker = np.zeros(n, dtype=np.int64)
        self.prefill_done = np.zeros(n)
        self.transfer_s = np.zeros(n)
        self.transferred_tokens = np.zeros(n, dtype=np.int64)
        self.transfers: list[tuple[float, int]] = []  # (done, request): KV under way

    def prefilled(self, req: SimRequest, now: float) -> None:
        """A prefill worker's first token: pick and book a decode worker, start the KV
        transfer."""
        i = req.tag
        self.prefill_done[i] = now
        features = self.features[i]
        placement = self.placement
        pick = placement.choose(self.picker, features, self.decode_states)
        d = pick.worker
        self.decode_worker[i] = d
        self.bookings[i] = placement.book(
            self.decode_states[d], features, self.trace[i].output_length, now=now
        )
        # the decode worker's model already holds a prefix: only the rest crosses
        held = self.decode_models[d].cached_prefix_blocks(features.blocks) * BLOCK_TOKENS
        tokens = features.input_length - min(held, features.input_length)
        self.transferred_tokens[i] = tokens
        seconds = self.config.transfer_s(tokens)
        self.transfer_s[i] = seconds
        heapq.heappush(self.transfers, (now + seconds, i))

    def transferred(self, i: int, now: float) -> int:
        """Request ``i``'s KV is on its decode worker: submit it there; returns that model's
        index among all models, for the caller to schedule."""
        d = int(self.decode_worker[i])
        req = self.trace[i]
        sim_req = SimRequest(
            req.blocks,
            req.input_length,
            max(1, req.output_length),
            tag=i,
            adapter=self.features[i].adapter,
            kv_transferred=True,
        )
        self.decode_models[d].submit(sim_req, now)
        return self.offset + d

    def decoded(self, i: int, now: float, first_token: bool) -> None:
        """The decode worker's first token or finish: its booking follows."""
        booking = self.bookings[i]
        if first_token:
            self.placement.first_token(booking, now)
        else:
            self.placement.release(booking)
            self.bookings[i] = None


class _EventLink:
    """The workers' KV event batches on their way to the router's feeds (virtual time)."""

    def __init__(self, states: Sequence[WorkerState], config: SimConfig) -> None:
        self.clock = [0.0]  # the virtual time the indexes read (PIN_GRACE_S)
        self.delay = config.kv_event_delay_s
        self.loss = config.kv_event_loss
        self.rng = np.random.default_rng(config.seed)
        self.feeds = []
        for state in states:
            index = KVIndex(clock=lambda: self.clock[0])
            index.synced = True  # a fresh worker's empty cache is a complete history
            index.block_size = KEY_TOKENS  # the models' events: one block key per 2 tokens
            state.kv_index = index
            self.feeds.append(KVEventFeed(index, last_seq=-1))
        self.published: list[list[Batch]] = [[] for _ in states]  # the replay buffers
        self.deliveries: list[tuple[float, int, int, Batch]] = []
        self._order = 0

    def publish(self, w: int, events: list, now: float) -> None:
        """One engine step's batch; it arrives ``delay`` later unless lost."""
        if not events:
            return
        buffer = self.published[w]
        batch = (len(buffer), now, events)
        buffer.append(batch)
        if self.loss and self.rng.random() < self.loss:
            return
        self._order += 1
        heapq.heappush(self.deliveries, (now + self.delay, self._order, w, batch))

    def due(self, next_wakeup: float, arrival: float) -> bool:
        return bool(self.deliveries) and self.deliveries[0][0] <= min(next_wakeup, arrival)

    def deliver(self) -> None:
        when, _, w, (seq, ts, events) = heapq.heappop(self.deliveries)
        self.clock[0] = when
        feed = self.feeds[w]
        replay_from = feed.live(seq, ts, events)
        if replay_from is not None:  # a lost batch: the replay buffer fills the gap
            feed.replayed(replay_from, self.published[w][replay_from:])


Batch = tuple[int, float, list]

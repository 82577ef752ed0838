"""ttft: send each request where its predicted time to first token is smallest (default).

Each healthy worker ``i`` is priced in seconds:

    work_i  = pending_prefill_i + uncached_i          (uncached = input - estimated hit)
    ttft_i  = work_i / rate_i + (work_i / chunk_tokens + 1) * (step_s + seq_s * num_requests_i)
    share_i = share_weight * uncached_i / rate_i * num_requests_i * g(work_i / rate_i)
    evict_i = returning * displaced_i / rate_i * eviction_weight
              (a hopeless request, see block_i: displaced_i not capped, and evict_i times
               1 + share_weight * num_requests_i + block_weight * live_i)
    fill_i  = min(uncached_i, free_i) / rate_i * ending_i
              (free_i: what the last engine step of worker i's queued prefill has left
               of its chunk; ending_i: the queued requests whose prefill ends in that step)
    wait_i  = memory_weight * ongoing_decode_i / num_requests_i / 2 * (step_s + seq_s * n_i)
              (only when the in-flight KV plus this prompt exceeds the worker's capacity)
    block_i = block_weight * uncached_i / rate_i * live_i
              (only when min_j uncached_j / rate_j >= hopeless_s)
    lora_i  = lora_load_s * (1 + n_i)           (a LoRA adapter not resident on worker i:
                                                 the load stalls every running request)
              + lora_load_s * (1 + n_i)         (... no free slot: an adapter gives way and
                                                 its next request reloads it)
              + drain_i                         (... every slot runs another adapter, or
                                                 this one takes the last: a slot's wait)
              drain_i = ongoing_decode_i / n_i / 2 * (step_s + seq_s * n_i) * H(k_i)
    load_i  = cpu_hit_i * kv_load_s_per_token_i    (a prefix in worker i's CPU KV tier past
                                                 its GPU hit: loaded, not recomputed, so it
                                                 counts in the hit; docs/tiered-kv.md)
    cost_i  = ttft_i + fill_i + share_i + evict_i + wait_i + block_i + lora_i + load_i
                                                         g(x) = x^2 / (x^2 + share_tau_s^2)

Terms not defined above: ``pending_prefill_i`` the prefill booked on worker ``i`` and not yet
answered, less what its oldest has had since it began; ``rate_i`` its learned prefill rate;
``displaced_i`` the KV of other sessions that this prompt pushes out; ``returning`` the share
of turns that another follows (1 until some session has returned); ``live_i`` the sessions
seen there within ``live_s``. With a GPU cost profile ``ttft_i`` (and the request's own
prefill in ``share_i``) is the worker's cost model. The rules on top of the costs: session
affinity within ``affinity_margin`` plus ``affinity_slack_s``; a new session among
near-equal workers goes where fewest sessions live (balance); a LoRA request goes where its
adapter is resident within ``adapter_slack_s``. Why each term and rule is there, and what
it measured: docs/ttft.md (the figures: docs/bench-history.md).

Exact ties (an idle, cold fleet) go round-robin. Bindings live in a bounded LRU table. The
picker reads the views only; the rate and the footprint are fed by the worker state's booking
and report code (:mod:`router.cache.worker_state`), the same in the proxy and the simulator.

Branches: ``affinity_stick`` (kept on its worker within the margin), ``adapter_stick`` (a
LoRA request sent to a worker holding its adapter within the adapter margin, though another
was cheaper), ``affinity_moved`` (a bound session sent elsewhere), ``balance`` (a new session
among near-equal workers), ``cost`` (one cheapest worker), ``tie_rr`` (round-robin among exact
ties); requests without a session take ``adapter_stick``, ``cost`` or ``tie_rr``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.base import (
    BlockShadow,
    CPUTier,
    LearnedRate,
    LoRASlots,
    Pick,
    PrefillProgress,
    RequestFeatures,
    SessionFootprints,
    WorkerView,
)
from policies.hits import UNHEALTHY, estimate_tier_hits
from policies.sessions import DEFAULT_MAX_SESSIONS, SessionTable
from policies.tiebreak import RoundRobinCounter
from router.cache.lora import AdapterSlots
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S, STEP_OVERHEAD_S, UNCAPPED

AFFINITY_MARGIN = 0.5
AFFINITY_SLACK_S = 0.05
ADAPTER_MARGIN = 0.0  # a swap costs absolute seconds: the slack alone (docs/ttft.md)
EVICTION_WEIGHT = 1.0
DISPLACE_CAP_TOKENS = 40_000
MEMORY_WEIGHT = 1.0
SHARE_WEIGHT = 1.0
SHARE_TAU_S = 4.0
BLOCK_WEIGHT = 1.0
HOPELESS_S = 4.0
LIVE_S = 60.0
LIVE_LIMIT = 8
BALANCE_SLACK_S = 0.005
CHUNK_TOKENS = 8192
SEQ_S = 0.00015
LORA_LOAD_S = 0.05  # loading an adapter from host memory into a GPU slot (the sim worker's)
ADAPTER_CHAIN = 10.0  # adapter_slack_s = ADAPTER_CHAIN * lora_load_s: a swap's chain of loads
INF = float("inf")
HARMONIC = [0.0]
for _k in range(1, 65):
    HARMONIC.append(HARMONIC[-1] + 1.0 / _k)  # H(k): the expected max of k exponentials


@dataclass(frozen=True, kw_only=True)
class TtftParams:
    """ttft's parameters: the picker params (``--picker-param key=value``), checked once."""

    affinity_margin: float = AFFINITY_MARGIN
    affinity_slack_s: float = AFFINITY_SLACK_S
    eviction_weight: float = EVICTION_WEIGHT
    displace_cap_tokens: int = DISPLACE_CAP_TOKENS
    memory_weight: float = MEMORY_WEIGHT
    share_weight: float = SHARE_WEIGHT
    share_tau_s: float = SHARE_TAU_S
    block_weight: float = BLOCK_WEIGHT
    hopeless_s: float = HOPELESS_S
    live_s: float = LIVE_S
    balance_slack_s: float = BALANCE_SLACK_S
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    chunk_tokens: int = CHUNK_TOKENS
    step_s: float = STEP_OVERHEAD_S
    seq_s: float = SEQ_S
    max_sessions: int = DEFAULT_MAX_SESSIONS
    lora_load_s: float = LORA_LOAD_S
    adapter_margin: float = ADAPTER_MARGIN
    adapter_slack_s: float | None = None  # None: ADAPTER_CHAIN * lora_load_s

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.chunk_tokens <= 0:
            raise ValueError("prefill_tokens_per_s and chunk_tokens must be positive")
        if self.adapter_slack_s is None:  # a swap's chain of loads (docs/ttft.md)
            object.__setattr__(self, "adapter_slack_s", ADAPTER_CHAIN * self.lora_load_s)
        knobs = (self.affinity_margin, self.affinity_slack_s, self.eviction_weight)
        knobs += (self.memory_weight, self.share_weight, self.block_weight, self.adapter_margin)
        times = (self.share_tau_s, self.hopeless_s, self.live_s, self.balance_slack_s)
        times += (self.lora_load_s, self.adapter_slack_s)
        if min(*knobs, *times, self.displace_cap_tokens) < 0:
            raise ValueError("margins, weights, times and displace_cap_tokens must be >= 0")


# The terms of the formula in the module docstring, one function each (seconds).


def ttft_i(p: TtftParams, work: float, rate: float, n: int) -> float:
    """The flat formula: ``work`` tokens of prefill at ``rate``, in chunked steps that carry
    the ``n`` requests in flight."""
    return work / rate + (work / p.chunk_tokens + 1.0) * (p.step_s + p.seq_s * n)


def fill_i(uncached: int, free: int, ending: int, rate: float) -> float:
    """The request's prefill that fills the queue's last step, waited by the ``ending``
    requests whose prefill ends in it (``free`` tokens left of its chunk)."""
    return (uncached if uncached < free else free) / rate * ending


def share_i(p: TtftParams, own: float, n: int, work: float, rate: float) -> float:
    """The request's own prefill ``own``, delayed for each of the ``n`` in flight, gated by
    ``g`` of the predicted wait ``work / rate``."""
    extra = p.share_weight * own * n
    tau2 = p.share_tau_s * p.share_tau_s
    if tau2:
        wait = work / rate
        wait *= wait
        extra *= wait / (wait + tau2)
    return extra


def hopeless(p: TtftParams, own_min: float) -> bool:
    """Whether the request's own prefill is at least ``hopeless_s`` on every worker (so
    ``block_i`` applies)."""
    return bool(p.block_weight) and p.hopeless_s <= own_min < INF


def block_i(p: TtftParams, uncached: int, rate: float, live: int) -> float:
    """The request's own prefill times the ``live`` sessions that queue behind it."""
    return p.block_weight * uncached / rate * live


def drain_i(p: TtftParams, decode: int, n: int, k: int) -> float:
    """The wait for the adapter with ``k`` requests running to drain: about ``H(k)`` times
    one request's remaining decode (``decode`` tokens booked over ``n`` requests)."""
    return decode / n / 2 * (p.step_s + p.seq_s * n) * HARMONIC[k]


def lora_i(p: TtftParams, slots: AdapterSlots, adapter: str, n: int, decode: int) -> float:
    """An adapter not resident on a worker with ``n`` requests in flight (``decode`` tokens
    of output booked): its load, a resident adapter's reload, the wait for a slot."""
    load = p.lora_load_s * (1 + n)  # the load stalls the step of every running request
    if not n:
        return load + load if slots.full() else load
    running = slots.running
    k = min(min(running.values(), default=1), len(HARMONIC) - 1)
    drain = drain_i(p, decode, n, k)
    cost = load + drain if slots.blocked(adapter) else load
    if slots.full():  # a resident adapter gives way: its next request here reloads it,
        cost += load  # and waits for a drain first when this one takes the last slot
        if len(running) + 1 >= slots.max_loras:
            cost += drain
    return cost


def evict_i(p: TtftParams, returning: float, pushed: float, rate: float, reload: float) -> float:
    """The recompute (or the reload from a CPU tier, whichever is cheaper) of the ``pushed``
    tokens of other sessions, as likely to come back as ``returning``."""
    per_token = min(1.0 / rate, reload) if reload else 1.0 / rate
    return p.eviction_weight * returning * pushed * per_token


def gather_i(p: TtftParams, n: int, live: int) -> float:
    """What ``evict_i`` is multiplied by for a hopeless request: each session it pushes out
    comes back as a cold prompt of its tokens, which delays the ``n`` requests in flight and
    the ``live`` sessions there as ``share_i`` and ``block_i`` price this one's prefill."""
    return 1.0 + p.share_weight * n + p.block_weight * live


def wait_i(p: TtftParams, memory: float, decode: int, n: int) -> float:
    """The wait for memory: about half the mean booked output at the current decode step."""
    return memory * 0.5 * decode / n * (p.step_s + p.seq_s * n)


class TTFTPicker:
    """Smallest predicted time to first token plus the recompute a placement causes.

    Its keyword arguments are :class:`TtftParams`' fields (the registry's picker params)."""

    name = "ttft"
    orders_engine = True  # its router sets engine priorities (router/core/engine_priority.py)
    needs = (LearnedRate, PrefillProgress, SessionFootprints, BlockShadow, CPUTier, LoRASlots)

    def __init__(self, **params: Any) -> None:
        self.params = TtftParams(**params)
        self.sessions = SessionTable(self.params.max_sessions)
        self._rr = RoundRobinCounter()
        # turns with a session id, and those of a session seen before: the share of turns
        # that a next turn follows, the chance a warm session pushed out comes back for it
        self._turns = 0
        self._returns = 0

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        p = self.params
        hits, loads, best_hit = estimate_tier_hits(request, workers)
        session = request.session_id
        bound = None
        if session is not None:
            bound = self.sessions.get(session)
            self._turns += 1
            self._returns += bound is not None
        if bound is not None and (bound >= len(workers) or hits[bound] == UNHEALTHY):
            bound = None
        homes = self._homes(request.adapter, workers, hits) if request.adapter is not None else ()
        costs = self.costs(request, workers, hits, keep=bound, exact=False, also=homes, loads=loads)
        best = min(costs)  # unhealthy workers cost inf; at least one is healthy
        if bound is not None:
            bound_cost = costs[bound]
            if bound_cost <= best * (1.0 + p.affinity_margin) + p.affinity_slack_s:
                return Pick(bound, "affinity_stick", hits[bound], best_hit)
        if homes:
            home = min(homes, key=costs.__getitem__)
            cost = costs[home]
            if best < cost <= best * (1.0 + p.adapter_margin) + p.adapter_slack_s:
                if session is not None:
                    self.sessions.bind(session, home)
                return Pick(home, "adapter_stick", hits[home], best_hit)
        if bound is None and session is not None and p.balance_slack_s:
            chosen = self._balance(request, workers, hits, costs, best, loads)
            if chosen is not None:
                self.sessions.bind(session, chosen)
                return Pick(chosen, "balance", hits[chosen], best_hit)
        if costs.count(best) == 1:
            chosen, branch = costs.index(best), "cost"
        else:
            tied = [i for i, c in enumerate(costs) if c == best]
            chosen, branch = self._rr.choose(tied), "tie_rr"
        if bound is not None:
            branch = "affinity_moved"
        if session is not None:
            self.sessions.bind(session, chosen)
        return Pick(chosen, branch, hits[chosen], best_hit)

    @staticmethod
    def _homes(adapter: str, workers: Sequence[WorkerView], hits: Sequence[int]) -> list[int]:
        """The healthy workers where ``adapter`` is resident and not blocked (a request for
        it runs there without a load or a wait for a slot)."""
        homes = []
        for i, worker in enumerate(workers):
            slots = worker.adapters
            if (
                slots is not None
                and hits[i] != UNHEALTHY
                and slots.resident(adapter)
                and not slots.blocked(adapter)
            ):
                homes.append(i)
        return homes

    def _balance(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        costs: Sequence[float],
        best: float,
        loads: Sequence[float] | None,
    ) -> int | None:
        """A new session's worker when several are equal but for their learned rates.

        Priced at the configured rate, the workers within ``balance_slack_s`` of the best
        (and at most twice the best at their learned rates) are near-equal; of those, the
        one with the fewest live sessions, then the fewest requests, round-robin among ties.
        None when fewer than two are near-equal (docs/ttft.md, "Balance").
        """
        if workers[0].footprint is None:
            return None
        p = self.params
        # first the queue and own prefill alone (cheap): usually one worker is clearly ahead
        length, rate = request.input_length, p.prefill_tokens_per_s
        first = workers[0].cost
        priced = first is not None and first.profiled
        clock = max(w.cost.clock for w in workers) if priced else 0.0
        base = []
        for i, w in enumerate(workers):
            uncached = max(length - hits[i], 0)
            work = w.pending_prefill_tokens + uncached
            if hits[i] == UNHEALTHY:
                base.append(INF)
            elif priced:
                own = w.cost.ttft_s(uncached, length - uncached, clock, corrected=False)
                base.append(own + (loads[i] if loads else 0.0))
            else:
                base.append(ttft_i(p, work, rate, w.num_requests) + (loads[i] if loads else 0.0))
        cut = min(base) + p.balance_slack_s
        if sum(1 for b in base if b <= cut) < 2:
            return None
        common = self.costs(request, workers, hits, learned_rates=False, loads=loads)
        limit = min(common) + p.balance_slack_s
        top = 2.0 * best
        near = [i for i, c in enumerate(common) if c <= limit and costs[i] <= top]
        if len(near) < 2:
            return None
        session = request.session_id
        since = max(w.footprint.clock for w in workers) - p.live_s
        peek = self.sessions.peek
        load = [
            (
                workers[i].footprint.live_sessions(session, since, peek, i, LIVE_LIMIT),
                workers[i].num_requests,
            )
            for i in near
        ]
        low = min(load)
        tied = [i for i, x in zip(near, load, strict=True) if x == low]
        return tied[0] if len(tied) == 1 else self._rr.choose(tied)

    def costs(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        keep: int | None = None,
        exact: bool = True,
        learned_rates: bool = True,
        also: Sequence[int] = (),
        loads: Sequence[float] | None = None,
    ) -> list[float]:
        """Predicted seconds per worker (inf for unhealthy ones): ``cost_i`` of the module
        docstring.

        With ``exact=False`` (what :meth:`pick` uses) the KV charges (``evict_i``, ``wait_i``,
        never negative) are added only where they can matter: to the cheapest worker before
        them, to ``keep`` (the session's worker), to every worker whose cost before them is
        at most the best total found so far, and to those of ``also`` (the adapter's
        workers) within the adapter slack of the best. The others keep a lower bound that is
        already above the minimum (or that slack), so the minimum, its ties, ``keep``'s cost
        and every cost of ``also`` that the adapter rule could accept are exact.
        """
        p = self.params
        first = workers[0] if workers else None
        # the views are of one kind: check the first
        learned = learned_rates and first is not None and first.rate is not None
        costs, own_min = self._queue_costs(request, workers, hits, learned, loads)
        footprints = first is not None and first.footprint is not None
        # a hopeless request: the sessions live on each worker (block_i, gather_i), else None
        live = (
            self._add_block(request, workers, hits, costs, learned)
            if footprints and hopeless(p, own_min)
            else None
        )
        tracked = p.eviction_weight and footprints
        shadow = first is not None and first.blocks is not None
        memory = p.memory_weight if shadow else 0.0
        if not (tracked or memory):
            return costs
        if exact:
            for i, worker in enumerate(workers):
                if costs[i] != INF:
                    costs[i] += self._charge(
                        request, workers, worker, i, hits[i], learned, memory, live
                    )
        else:
            self._add_charges(request, workers, hits, costs, keep, also, learned, memory, live)
        return costs

    def _queue_costs(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        learned: bool,
        loads: Sequence[float] | None,
    ) -> tuple[list[float], float]:
        """``ttft_i + load_i + fill_i + share_i + lora_i`` per worker (inf for unhealthy
        ones), and the request's own prefill where it is shortest (the hopeless test)."""
        p = self.params
        length = request.input_length
        first = workers[0] if workers else None
        # the latest booking anywhere: how far the workers' queued prefills have got since
        progress = first is not None and first.prefill_queue is not None
        now = max(w.footprint.clock for w in workers) if progress else 0.0
        # ttft_i from the workers' cost models when a GPU profile prices them
        priced = first is not None and first.cost is not None and first.cost.profiled
        clock = max(w.cost.clock for w in workers) if priced else 0.0
        costs: list[float] = []
        own_min = INF  # the request's own prefill on the worker where it is shortest
        for i, worker in enumerate(workers):
            hit = hits[i]
            if hit == UNHEALTHY:
                costs.append(INF)
                continue
            uncached = length - hit if length > hit else 0
            rate = worker.rate.tokens_per_s if learned else p.prefill_tokens_per_s
            n = worker.num_requests
            flat = uncached / rate  # its own prefill at the rate (block_i, the hopeless test)
            if flat < own_min:
                own_min = flat
            pending = worker.prefill_left(now) if progress else worker.pending_prefill_tokens
            work = pending + uncached
            if priced:  # the attention over its cached prefix, the queue's, the decode's
                cost = worker.cost.ttft_s(uncached, length - uncached, clock, learned)
                # what it adds to the prefill of anyone queued behind it (share_i)
                own = worker.cost.prefill_s(uncached, length - uncached, learned)
            else:
                cost = ttft_i(p, work, rate, n)
                own = flat
            if loads:  # load_i: its prefix's load from the CPU tier (the batch runs on)
                cost += loads[i]
            if progress and uncached:  # views that track the queue track where steps end
                free, ending = worker.prefill_tail(p.chunk_tokens)
                if ending:
                    cost += fill_i(uncached, free, ending, rate)
            if p.share_weight and uncached and n:
                cost += share_i(p, own, n, work, rate)
            if request.adapter is not None:
                slots = worker.adapters  # views without slots: no term
                if slots is not None and not slots.resident(request.adapter):
                    cost += lora_i(p, slots, request.adapter, n, worker.ongoing_decode_tokens)
            costs.append(cost)
        return costs, own_min

    def _add_charges(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        costs: list[float],
        keep: int | None,
        also: Sequence[int],
        learned: bool,
        memory: float,
        live: Sequence[int] | None,
    ) -> None:
        """Add the KV charges where they can matter (``costs``' ``exact=False``), in place."""

        def charge(i: int) -> float:
            worker = workers[i]
            return self._charge(request, workers, worker, i, hits[i], learned, memory, live)

        best_i = costs.index(min(costs))
        done = {best_i, keep}
        best = costs[best_i] = costs[best_i] + charge(best_i)
        if keep is not None and keep != best_i:
            costs[keep] += charge(keep)
            best = min(best, costs[keep])
        for i in range(len(workers)):
            if costs[i] <= best and i not in done:
                done.add(i)
                costs[i] += charge(i)
                if costs[i] < best:
                    best = costs[i]
        if also:  # the adapter's workers that the rule could still choose (charges only add)
            limit = best * (1.0 + self.params.adapter_margin) + self.params.adapter_slack_s
            for i in also:
                if i not in done and costs[i] <= limit:
                    costs[i] += charge(i)

    @property
    def return_rate(self) -> float:
        """The share of the turns so far that came from a session seen before: the chance a
        warm session sends another turn. 1 until some session has returned: before that the
        turns are all first turns (an opening burst of sessions reads 0), no reading of how
        many come back."""
        return self._returns / self._turns if self._returns else 1.0

    def _add_block(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        costs: list[float],
        learned: bool,
    ) -> list[int]:
        """Add ``block_i`` to ``costs`` in place: the request's own prefill on worker ``i``
        times the sessions live there (seen within ``live_s``, not bound elsewhere), who
        will queue behind it when their next turn comes. Returns those counts per worker
        (0 for unhealthy ones)."""
        p = self.params
        length = request.input_length
        since = max(w.footprint.clock for w in workers) - p.live_s
        home_of, sid = self.sessions.peek, request.session_id
        counts = [0] * len(workers)
        for i, worker in enumerate(workers):
            if costs[i] == INF:
                continue
            live = counts[i] = worker.footprint.live_sessions(sid, since, home_of, i, LIVE_LIMIT)
            if live:
                hit = hits[i]
                rate = worker.rate.tokens_per_s if learned else p.prefill_tokens_per_s
                costs[i] += block_i(p, length - hit if length > hit else 0, rate, live)
        return counts

    def _charge(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        worker: WorkerView,
        i: int,
        hit: int,
        learned: bool,
        memory: float,
        live: Sequence[int] | None,
    ) -> float:
        """Worker ``i``'s KV charges: ``evict_i + wait_i``, in seconds. ``live``: for a
        hopeless request (``block_i`` applies), the sessions live on each worker; else None."""
        p = self.params
        length = request.input_length
        uncached = length - hit if length > hit else 0
        rate = worker.rate.tokens_per_s if learned else p.prefill_tokens_per_s
        capacity = worker.kv_capacity_tokens
        charge = 0.0
        footprint = worker.footprint
        # footprint.warm_tokens + length is an upper bound of what it holds: check closer
        if (
            p.eviction_weight
            and footprint is not None
            and uncached
            and footprint.warm_tokens + length > capacity
        ):
            now = max(w.footprint.clock for w in workers)  # the latest booking anywhere
            pushed = footprint.pushed_out(
                request.session_id,
                length,
                uncached,
                capacity,
                now,
                UNCAPPED if live is not None else p.displace_cap_tokens,
                self.sessions.peek,
                i,
            )
            # a session pushed out of a worker with a CPU tier reloads rather than recomputes
            reload = worker.kv_load_s_per_token if worker.tiered else 0.0
            evict = evict_i(p, self.return_rate, pushed, rate, reload)
            if live is not None and evict:
                evict *= gather_i(p, worker.num_requests, live[i])
            charge += evict
        n = worker.num_requests
        if memory and n:
            blocks = worker.blocks
            decode = worker.ongoing_decode_tokens
            if blocks.pinned_blocks * blocks.block_size + decode + length > capacity:
                charge += wait_i(p, memory, decode, n)
        return charge


# the registry reads a picker's parameters from its signature: ttft's are TtftParams' fields
TTFTPicker.__signature__ = inspect.signature(TtftParams)  # type: ignore[attr-defined]

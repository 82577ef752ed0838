"""ttft: send each request where its predicted time to first token is smallest (default).

Beyond seed 002. LMetric's ``(pending + new_prefill) * num_requests`` is 0 on every idle
worker, warm or cold, so at low load it scatters sessions; and no seed picker asks whether a
session's working set still fits a worker's KV cache. This picker prices each healthy
worker ``i`` in seconds:

    work_i  = pending_prefill_i + uncached_i          (uncached = input - estimated hit)
    ttft_i  = work_i / rate_i + (work_i / chunk_tokens + 1) * (step_s + seq_s * num_requests_i)
    share_i = share_weight * uncached_i / rate_i * num_requests_i * g(work_i / rate_i)
    evict_i = returning * displaced_i / rate_i * eviction_weight
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

- ``pending_prefill_i``: the prefill booked there and not yet answered, less what the
  oldest of it (the one in progress: engines prefill in admission order) has had since it
  began, at ``rate_i`` (:meth:`router.cache.worker_state.WorkerState.prefill_left`; the
  clock is the latest booking anywhere). Counted whole until its first token, a long prompt
  half done read twice its wait, and sessions behind it moved and recomputed their prefix
  elsewhere (issue 31): over the 26 configurations of bench/pickers/affinity_margin.py, TTFT p90
  -1.4% and hit rate +0.3 points with it.
- With a GPU cost profile (``--cost-profile``), ``ttft_i`` is the worker's cost model
  instead (:class:`router.cache.cost_model.WorkerCost`, ``WorkerView.cost``): its queued
  prefill and the request's own uncached tokens, each priced with the attention over its
  cached prefix, in chunked steps that also carry the decode of every running sequence (by
  its context tokens), times the correction learned from the worker's answers. On the
  bundled agentic sample over 4 H100-profiled workers it predicts TTFT within 2-4.4%
  (median) where the flat formula is off by about 30% (docs/simulation.md). The flat
  profile keeps the formula above. Under a profile the request's own prefill in ``share_i``
  (``uncached_i / rate_i`` above: what it adds to the prefill of whoever queues behind it)
  is the profile's too (:meth:`router.cache.cost_model.WorkerCost.prefill_s`: its tokens,
  the attention over its cached prefix, its steps, times the learned correction). The flat
  rate, learned from whole TTFTs, read a cold 40k-token prompt's 2.2 s on an H100 as about
  2 s and a cold 191k one's 33 s as 8-14 s, so the fleet's biggest cold prompts went where
  many requests were in flight (issue 52 item 4; docs/bench-history.md, "The default's
  tail under the measured profile"). The other terms keep the rate, as measured there:
  ``block_i`` priced by the profile (55 s per live session for a cold 250k-token prompt)
  outweighed the queue, and two such prompts shared one worker of the agentic sample;
  ``fill_i`` and ``share_i``'s gate on the profile's seconds raised the Weka set's TTFT
  p90 at 1.5x ttft's capacity from 27 s to 50 s (8 workers x 262k).
- ``rate_i`` is the worker's effective prefill rate, learned online from observed time to
  first token and reported cached tokens (:class:`router.cache.workload.PrefillRate`, seeded
  from configuration, bounded); views without one use ``prefill_tokens_per_s``.
- The step term is chunked prefill's: every ``chunk_tokens`` of prefill share an engine
  step with the running batch, whose cost grows with it.
- ``load_i`` and the tiers: on a worker whose CPU tier the router reads
  (:func:`policies.hits.estimate_tier_hits`) ``uncached_i`` leaves out what the worker would
  load from that tier, and a session pushed out of such a worker costs its reload rather than
  its recompute (``evict_i``, whichever is cheaper).
- ``fill_i``: a chunked-prefill engine takes each step's ``chunk_tokens`` from the queued
  requests in admission order, so while prefill is queued every step is full, and a
  request's first token comes at the end of the step that computes its last prompt token.
  The last step of a worker's queue is full only if someone comes behind: a request sent
  there fills it with its own prefill (``min(uncached, free)`` tokens), and every request
  ending in that step waits those tokens longer (up to a chunk: 0.55 s at 15k tokens/s).
  ``ttft_i`` counts the queue as a stream of tokens and misses this: on the conversation
  trace, 8 workers at 1.8x, 49% of requests had their last step filled by followers (0.12 s
  per request on average), and 204 of the 1,238 over 2 s would have made it without that.
  The worker state tracks where steps end
  (:meth:`router.cache.worker_state.WorkerState.prefill_tail`: the prefill booked since its
  queue was last empty, cut into whole chunks; it matched the simulated engine's in 93% of
  the picks where prefill was queued and nothing waited for memory); a worker whose queue
  ends at a whole chunk, or an empty one, costs nobody anything. Its effect on capacity:
  docs/bench-history.md, "ttft prices the engine step it fills".
- ``displaced_i``: the KV held on worker ``i`` by *other* sessions seen there recently
  (:class:`router.cache.workload.SessionFootprint`). When it plus this prompt exceeds the
  worker's capacity, the tokens this request inserts (``min(uncached, overflow)``) push out
  other sessions' blocks, least recently seen first; each session pushed out is charged the
  recompute of its tokens, at most ``displace_cap_tokens`` each (one turn of it goes cold;
  what an eviction costs is a cold turn, so one huge session does not count as many small
  ones). The sessions past the capacity, the oldest ``overflow - uncached`` tokens, are out
  of the worker's cache already (its LRU pushed them out as newer ones came in): pushing
  them out again costs nothing, so the victims are the oldest sessions still held (before,
  with a footprint several times the capacity, the charge went to sessions long gone).
  A session this picker has since bound to another worker is stale here: pushing it
  out costs nothing. A session's own worker, which already holds its prefix, inserts little
  and displaces little, so under KV pressure sessions stay put and new ones go where they
  displace no one.
- ``returning``: a session pushed out costs its recompute only if it sends another turn.
  The picker counts the turns it has seen with a session id and those of a session it had
  seen before; their ratio is the chance that a turn is followed by another (1 before any
  turn). On the conversation trace 39% of turns come back, on the synthetic trace 44%, on
  the Weka agentic sample 81%: charging every warm session in full overpriced what a
  placement pushes out by 2.3-2.6x on the first two.
- ``wait_i``: an engine admits a request only when its KV fits beside the running ones'. When
  the worker's in-flight KV (the shadow's pinned blocks plus the output booked for them)
  and this prompt exceed its capacity, the request waits for running requests to finish:
  about half the mean booked output at the current decode step. Without it a session whose
  next turn cannot fit beside a long-running neighbour queues behind it (Weka at 1x: 25
  requests of one session waited 50-190 s behind one 136k-token request).
- ``share_i``: uncached work on a busy worker delays whatever arrives there behind it (chunked
  prefill serves requests in admission order). The gate ``g`` of the predicted wait
  ``work / rate`` keeps it near 0 for short prefills on a quiet worker (Mooncake's ~1 s
  prompts at light load) and near ``uncached / rate`` per request in flight for long ones
  or a backed-up queue (Weka's 60-100k-token cold prompts; the overload rows): big cold
  prompts go where few requests will queue behind them.
- ``block_i``: a request whose own prefill is long on every worker (at least ``hopeless_s``:
  a long prompt cold everywhere) will be slow wherever it goes; what its placement still
  decides is whom it delays. Sessions live on a worker (``live_i``: seen there within
  ``live_s``, not bound elsewhere, counted up to ``LIVE_LIMIT``) send their next turns
  there, and those queue behind its prefill; ``share_i`` counts only the requests in
  flight, while agentic sessions spend most of their time between turns. So it goes where
  few sessions live. Short requests never pay it: they are placed for their own TTFT. On
  Weka at 1x this took ttft's p90 from 1.25 s to 1.10 s (unified 1.42 s).
- Balance: a new session (unbound) whose best workers are equal but for their learned rates
  (priced at the configured rate, within ``balance_slack_s``; at their learned rates at
  most twice the best) goes to the one with the fewest live sessions, then the fewest
  requests. A rate learned from a few noisy samples would otherwise draw every new session
  to the worker that measured fastest, and each session brings its later turns with it
  (real vLLM workers on one machine: up to 1.75x the mean requests on one worker).
- ``lora_i``: a request for a LoRA adapter (:mod:`router.cache.lora`) the worker does not
  hold pays the adapter's load, ``lora_load_s``, once for itself and once for every
  request running there (the engine loads it before the step they share). With no free
  slot a resident adapter gives way: its next request there pays the load again. When
  every slot (``max_loras``) runs another adapter the request waits until one of them
  drains, and when it takes the last slot the adapter it displaced waits so: ``drain_i``,
  the longest of the ``k_i`` requests of the adapter with the fewest (``H(k)``, the
  harmonic number, times one request's remaining decode). So an adapter's requests go
  where it is resident, and adapters spread over workers once the slots run out. The
  adapter's own prefix cache (its blocks are no hit elsewhere) pulls the same way.
- Affinity: a session stays on the worker it was last sent to while that worker's cost is
  within ``affinity_margin`` (relative) plus ``affinity_slack_s`` of the best; the estimate is
  noisy and every move duplicates the session's prefix on a second worker. The margin is
  0.5, chosen against 0.1 over 26 offline configurations of traces, fleet sizes and loads
  (bench/pickers/affinity_margin.py; the figures: docs/bench-history.md, issue 31).
- Adapter affinity: a LoRA request that does not stay on its session's worker goes to the
  cheapest healthy worker where its adapter is resident and not blocked (no slot to wait
  for) while that worker's cost is within ``adapter_slack_s`` (plus ``adapter_margin``,
  relative, 0 by default) of the best, as LoRA-aware routers do (the Gateway API Inference
  Extension's LoRA-affinity filter, AIBrix). ``lora_i`` prices a swap as one request sees
  it; it leaves out the chain a swap starts once every slot is in use: the adapter it
  displaces reloads on its next request and displaces another, and so on, each load
  stalling a running batch. At light load, where a load looks cheap beside a prefill,
  ttft so kept adapters moving from worker to worker. The slack is absolute, not relative
  like the session margin: avoiding a swap saves the same seconds whatever the prompt's
  size (a relative margin moved 60k-token Weka prompts seconds away from their best
  worker, raising its TTFT p90). Its default, ``10 * lora_load_s`` (0.5 s), is about one
  chain once round a 4-worker fleet: about 5 loads, each stalling this request and a
  running one; well under the queue of one long prompt, so load still spreads adapters
  over workers (a request that spills loads a second copy, itself a home from then on).
  Session affinity wins where both apply: a session kept on its worker (within its margin)
  stays there even when its adapter is resident elsewhere. Its worker holds the session's
  prefix under this adapter (an adapter's blocks are no hit anywhere else), so leaving
  recomputes the whole prefix, seconds for an agentic session, against one adapter load
  (tens of ms per running request); and with adapter first a session would follow its
  adapter from worker to worker, duplicating its prefix at each move. A bound session
  that leaves its worker (beyond the session margin) goes where its adapter is, within
  the adapter slack. The rule applies only when no worker as cheap as the best holds the
  adapter (otherwise the cost or balance branches already choose one that does); a request
  without an adapter never reaches it.
- An idle worker is never scored 0 regardless of cache (unlike LMetric): its cost is its own
  uncached prefill, so the warm idle worker beats the cold idle one.

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

from collections.abc import Sequence

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
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S, STEP_OVERHEAD_S

AFFINITY_MARGIN = 0.5
AFFINITY_SLACK_S = 0.05
ADAPTER_MARGIN = 0.0  # a swap costs absolute seconds: the slack alone (see the module doc)
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


class TTFTPicker:
    """Smallest predicted time to first token plus the recompute a placement causes."""

    name = "ttft"
    needs = (LearnedRate, PrefillProgress, SessionFootprints, BlockShadow, CPUTier, LoRASlots)

    def __init__(
        self,
        *,
        affinity_margin: float = AFFINITY_MARGIN,
        affinity_slack_s: float = AFFINITY_SLACK_S,
        eviction_weight: float = EVICTION_WEIGHT,
        displace_cap_tokens: int = DISPLACE_CAP_TOKENS,
        memory_weight: float = MEMORY_WEIGHT,
        share_weight: float = SHARE_WEIGHT,
        share_tau_s: float = SHARE_TAU_S,
        block_weight: float = BLOCK_WEIGHT,
        hopeless_s: float = HOPELESS_S,
        live_s: float = LIVE_S,
        balance_slack_s: float = BALANCE_SLACK_S,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        chunk_tokens: int = CHUNK_TOKENS,
        step_s: float = STEP_OVERHEAD_S,
        seq_s: float = SEQ_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        lora_load_s: float = LORA_LOAD_S,
        adapter_margin: float = ADAPTER_MARGIN,
        adapter_slack_s: float | None = None,
    ) -> None:
        if prefill_tokens_per_s <= 0 or chunk_tokens <= 0:
            raise ValueError("prefill_tokens_per_s and chunk_tokens must be positive")
        if adapter_slack_s is None:  # a swap's chain of loads (see the module docstring)
            adapter_slack_s = ADAPTER_CHAIN * lora_load_s
        knobs = (affinity_margin, affinity_slack_s, eviction_weight, memory_weight, share_weight)
        times = (share_tau_s, hopeless_s, live_s, balance_slack_s, lora_load_s, adapter_slack_s)
        if min(*knobs, block_weight, adapter_margin, *times, displace_cap_tokens) < 0:
            raise ValueError("margins, weights, times and displace_cap_tokens must be >= 0")
        self.affinity_margin = affinity_margin
        self.affinity_slack_s = affinity_slack_s
        self.eviction_weight = eviction_weight
        self.displace_cap_tokens = displace_cap_tokens
        self.memory_weight = memory_weight
        self.share_weight = share_weight
        self.share_tau_s = share_tau_s
        self.block_weight = block_weight
        self.hopeless_s = hopeless_s
        self.live_s = live_s
        self.balance_slack_s = balance_slack_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.chunk_tokens = chunk_tokens
        self.step_s = step_s
        self.seq_s = seq_s
        self.lora_load_s = lora_load_s
        self.adapter_margin = adapter_margin
        self.adapter_slack_s = adapter_slack_s
        self.sessions = SessionTable(max_sessions)
        self._rr = RoundRobinCounter()
        # turns with a session id, and those of a session seen before: the share of turns
        # that a next turn follows, the chance a warm session pushed out comes back for it
        self._turns = 0
        self._returns = 0

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
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
            if bound_cost <= best * (1.0 + self.affinity_margin) + self.affinity_slack_s:
                return Pick(bound, "affinity_stick", hits[bound], best_hit)
        if homes:
            home = min(homes, key=costs.__getitem__)
            cost = costs[home]
            if best < cost <= best * (1.0 + self.adapter_margin) + self.adapter_slack_s:
                if session is not None:
                    self.sessions.bind(session, home)
                return Pick(home, "adapter_stick", hits[home], best_hit)
        if bound is None and session is not None and self.balance_slack_s:
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
        None when fewer than two are near-equal. Why: a rate learned from a few noisy
        samples would otherwise send every new session to the worker that measured fastest,
        and each session brings all its later turns with it.
        """
        if workers[0].footprint is None:
            return None
        # first the queue and own prefill alone (cheap): usually one worker is clearly ahead
        length, rate = request.input_length, self.prefill_tokens_per_s
        step_s, seq_s, chunk = self.step_s, self.seq_s, self.chunk_tokens
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
                base.append(
                    work / rate
                    + (work / chunk + 1.0) * (step_s + seq_s * w.num_requests)
                    + (loads[i] if loads else 0.0)
                )
        cut = min(base) + self.balance_slack_s
        if sum(1 for b in base if b <= cut) < 2:
            return None
        common = self.costs(request, workers, hits, learned_rates=False, loads=loads)
        limit = min(common) + self.balance_slack_s
        top = 2.0 * best
        near = [i for i, c in enumerate(common) if c <= limit and costs[i] <= top]
        if len(near) < 2:
            return None
        session = request.session_id
        since = max(w.footprint.clock for w in workers) - self.live_s
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
        """Predicted seconds per worker (inf for unhealthy ones); see the module docstring.

        With ``exact=False`` (what :meth:`pick` uses) the KV charges (``evict``, ``wait``,
        never negative) are added only where they can matter: to the cheapest worker before
        them, to ``keep`` (the session's worker), to every worker whose cost before them is
        at most the best total found so far, and to those of ``also`` (the adapter's
        workers) within the adapter slack of the best. The others keep a lower bound that is
        already above the minimum (or that slack), so the minimum, its ties, ``keep``'s cost
        and every cost of ``also`` that the adapter rule could accept are exact.
        """
        length = request.input_length
        default_rate = self.prefill_tokens_per_s
        chunk, step_s, seq_s = self.chunk_tokens, self.step_s, self.seq_s
        share = self.share_weight
        tau2 = self.share_tau_s * self.share_tau_s
        first = workers[0] if workers else None
        # the views are of one kind: check the first
        learned = learned_rates and first is not None and first.rate is not None
        costs: list[float] = []
        own_min = INF  # the request's own prefill on the worker where it is shortest
        adapter = request.adapter
        # the latest booking anywhere: how far the workers' queued prefills have got since
        progress = first is not None and first.prefill_queue is not None
        now = max(w.footprint.clock for w in workers) if progress else 0.0
        # ttft_i from the workers' cost models when a GPU profile prices them
        priced = first is not None and first.cost is not None and first.cost.profiled
        if priced:
            clock = max(w.cost.clock for w in workers)
        tails = progress  # views that track the queue track where its steps end
        for i, worker in enumerate(workers):
            hit = hits[i]
            if hit == UNHEALTHY:
                costs.append(INF)
                continue
            uncached = length - hit if length > hit else 0
            rate = worker.rate.tokens_per_s if learned else default_rate
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
                cost = work / rate + (work / chunk + 1.0) * (step_s + seq_s * n)
                own = flat
            if loads:  # its prefix's load from the CPU tier (the batch runs on meanwhile)
                cost += loads[i]
            if tails and uncached:  # fill_i: it fills the queue's last step
                free, ending = worker.prefill_tail(chunk)
                if ending:
                    cost += (uncached if uncached < free else free) / rate * ending
            if share and uncached and n:
                extra = share * own * n
                if tau2:
                    wait = work / rate
                    wait *= wait
                    extra *= wait / (wait + tau2)
                cost += extra
            if adapter is not None:
                slots = worker.adapters  # views without slots: no term
                if slots is not None and not slots.resident(adapter):
                    cost += self._lora(slots, adapter, n, worker.ongoing_decode_tokens)
            costs.append(cost)
        footprints = first is not None and first.footprint is not None
        if self.block_weight and footprints and self.hopeless_s <= own_min < INF:
            self._add_block(request, workers, hits, costs, learned)
        tracked = self.eviction_weight and footprints
        shadow = first is not None and first.blocks is not None
        memory = self.memory_weight if shadow else 0.0
        if not (tracked or memory):
            return costs
        charge = self._charge
        if exact:
            for i, worker in enumerate(workers):
                if costs[i] != INF:
                    costs[i] += charge(request, workers, worker, i, hits[i], learned, memory)
            return costs
        best_i = costs.index(min(costs))
        done = {best_i, keep}
        best = costs[best_i] = costs[best_i] + charge(
            request, workers, workers[best_i], best_i, hits[best_i], learned, memory
        )
        if keep is not None and keep != best_i:
            costs[keep] += charge(
                request, workers, workers[keep], keep, hits[keep], learned, memory
            )
            best = min(best, costs[keep])
        for i, worker in enumerate(workers):
            if costs[i] <= best and i not in done:
                done.add(i)
                costs[i] += charge(request, workers, worker, i, hits[i], learned, memory)
                if costs[i] < best:
                    best = costs[i]
        if also:  # the adapter's workers that the rule could still choose (charges only add)
            limit = best * (1.0 + self.adapter_margin) + self.adapter_slack_s
            for i in also:
                if i not in done and costs[i] <= limit:
                    costs[i] += charge(request, workers, workers[i], i, hits[i], learned, memory)
        return costs

    @property
    def return_rate(self) -> float:
        """The share of the turns so far that came from a session seen before: the chance a
        warm session sends another turn (1 before any turn)."""
        return self._returns / self._turns if self._turns else 1.0

    def _lora(self, slots: AdapterSlots, adapter: str, n: int, decode: int) -> float:
        """``lora_i`` of an adapter not resident on a worker with ``n`` requests in flight
        (``decode`` tokens of output booked): see the module docstring."""
        load = self.lora_load_s * (1 + n)  # the load stalls the step of every running request
        if not n:
            return load + load if slots.full() else load
        running = slots.running
        # the wait for a slot: until the first adapter running there drains, the longest of
        # its k requests (about H(k) times one request's remaining decode)
        k = min(min(running.values(), default=1), len(HARMONIC) - 1)
        drain = decode / n / 2 * (self.step_s + self.seq_s * n) * HARMONIC[k]
        cost = load + drain if slots.blocked(adapter) else load
        if slots.full():  # a resident adapter gives way: its next request here reloads it,
            cost += load  # and waits for a drain first when this one takes the last slot
            if len(running) + 1 >= slots.max_loras:
                cost += drain
        return cost

    def _add_block(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        hits: Sequence[int],
        costs: list[float],
        learned: bool,
    ) -> None:
        """Add ``block_i`` to ``costs`` in place: the request's own prefill on worker ``i``
        times the sessions live there (seen within ``live_s``, not bound elsewhere), who
        will queue behind it when their next turn comes."""
        length = request.input_length
        since = max(w.footprint.clock for w in workers) - self.live_s
        home_of, sid = self.sessions.peek, request.session_id
        for i, worker in enumerate(workers):
            if costs[i] == INF:
                continue
            live = worker.footprint.live_sessions(sid, since, home_of, i, LIVE_LIMIT)
            if live:
                hit = hits[i]
                rate = worker.rate.tokens_per_s if learned else self.prefill_tokens_per_s
                costs[i] += self.block_weight * (length - hit if length > hit else 0) / rate * live

    def _charge(
        self,
        request: RequestFeatures,
        workers: Sequence[WorkerView],
        worker: WorkerView,
        i: int,
        hit: int,
        learned: bool,
        memory: float,
    ) -> float:
        """Worker ``i``'s KV charges: the recompute it pushes onto other sessions
        (``evict``) and the wait for memory (``wait``), in seconds."""
        length = request.input_length
        uncached = length - hit if length > hit else 0
        rate = worker.rate.tokens_per_s if learned else self.prefill_tokens_per_s
        capacity = worker.kv_capacity_tokens
        charge = 0.0
        footprint = worker.footprint
        # footprint.warm_tokens + length is an upper bound of what it holds: check closer
        if (
            self.eviction_weight
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
                self.displace_cap_tokens,
                self.sessions.peek,
                i,
            )
            # a session pushed out of a worker with a CPU tier reloads rather than recomputes
            reload = worker.kv_load_s_per_token if worker.tiered else 0.0
            per_token = min(1.0 / rate, reload) if reload else 1.0 / rate
            charge += self.eviction_weight * self.return_rate * pushed * per_token
        n = worker.num_requests
        if memory and n:
            blocks = worker.blocks
            decode = worker.ongoing_decode_tokens
            if blocks.pinned_blocks * blocks.block_size + decode + length > capacity:
                charge += memory * 0.5 * decode / n * (self.step_s + self.seq_s * n)
        return charge

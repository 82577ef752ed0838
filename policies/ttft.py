"""ttft: send each request where its predicted time to first token is smallest (default).

Beyond seed 002. LMetric's ``(pending + new_prefill) * num_requests`` is 0 on every idle
worker, warm or cold, so at low load it scatters sessions; and no seed picker asks whether a
session's working set still fits a worker's KV cache. This picker prices each healthy
worker ``i`` in seconds:

    work_i  = pending_prefill_i + uncached_i          (uncached = input - estimated hit)
    ttft_i  = work_i / rate_i + (work_i / chunk_tokens + 1) * (step_s + seq_s * num_requests_i)
    evict_i = min(uncached_i, warm_i + input - kv_capacity_i)+  / rate_i * eviction_weight
    share_i = share_weight * uncached_i / rate_i * num_requests_i * q_i / (q_i + share_tau_s)
    cost_i  = ttft_i + evict_i + share_i                 (q_i = pending_prefill_i / rate_i)

- ``rate_i`` is the worker's effective prefill rate, learned online from observed time to
  first token and reported cached tokens (:class:`router.cache.workload.PrefillRate`, seeded
  from configuration, bounded); views without one use ``prefill_tokens_per_s``.
- The step term is chunked prefill's: every ``chunk_tokens`` of prefill share an engine
  step with the running batch, whose cost grows with it.
- ``warm_i`` is the KV held on worker ``i`` by *other* sessions seen there recently
  (:class:`router.cache.workload.SessionFootprint`). When it plus this request exceeds the
  worker's capacity, the tokens this request inserts push out blocks those sessions will ask
  for again: the placement is charged their recompute. A session's own worker, which already
  holds its prefix, inserts little and is charged little, so under KV pressure sessions stay
  put and new ones go where they displace no one.
- ``share_i``: uncached work on a worker with a queue delays whatever arrives there behind
  it; the gate ``q / (q + tau)`` makes that cost vanish on a worker with nothing queued and
  reach ``uncached / rate`` per request in flight on a backed-up one. At overload it keeps
  big cold prompts off the workers where warm turns are queueing (simulator: the overload
  rows of ``bench/RESULTS.md``); at light load it is 0.
- Affinity: a session stays on the worker it was last sent to while that worker's cost is
  within ``affinity_margin`` (relative) plus ``affinity_slack_s`` of the best; the estimate is
  noisy and every move duplicates the session's prefix on a second worker.
- An idle worker is never scored 0 regardless of cache (unlike LMetric): its cost is its own
  uncached prefill, so the warm idle worker beats the cold idle one.

Exact ties (an idle, cold fleet) go round-robin. Bindings live in a bounded LRU table. The
picker reads the views only; the rate and the footprint are fed by the worker state's booking
and report code (:mod:`router.cache.worker_state`), the same in the proxy and the simulator.

Branches: ``affinity_stick`` (kept on its worker within the margin), ``affinity_moved``
(a bound session sent elsewhere), ``cost`` (one cheapest worker), ``tie_rr`` (round-robin
among exact ties); requests without a session take ``cost`` or ``tie_rr``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Pick, RequestFeatures, WorkerView
from policies.hits import UNHEALTHY, estimate_hits
from policies.sessions import DEFAULT_MAX_SESSIONS, SessionTable
from policies.tiebreak import RoundRobinCounter
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S, STEP_OVERHEAD_S

AFFINITY_MARGIN = 0.1
AFFINITY_SLACK_S = 0.05
EVICTION_WEIGHT = 1.0
SHARE_WEIGHT = 1.0
SHARE_TAU_S = 1.0
CHUNK_TOKENS = 8192
SEQ_S = 0.00015
INF = float("inf")


class TTFTPicker:
    """Smallest predicted time to first token plus the recompute a placement causes."""

    name = "ttft"

    def __init__(
        self,
        *,
        affinity_margin: float = AFFINITY_MARGIN,
        affinity_slack_s: float = AFFINITY_SLACK_S,
        eviction_weight: float = EVICTION_WEIGHT,
        share_weight: float = SHARE_WEIGHT,
        share_tau_s: float = SHARE_TAU_S,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        chunk_tokens: int = CHUNK_TOKENS,
        step_s: float = STEP_OVERHEAD_S,
        seq_s: float = SEQ_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        if prefill_tokens_per_s <= 0 or chunk_tokens <= 0:
            raise ValueError("prefill_tokens_per_s and chunk_tokens must be positive")
        if min(affinity_margin, affinity_slack_s, eviction_weight, share_weight, share_tau_s) < 0:
            raise ValueError("margins, weights and share_tau_s must be >= 0")
        self.affinity_margin = affinity_margin
        self.affinity_slack_s = affinity_slack_s
        self.eviction_weight = eviction_weight
        self.share_weight = share_weight
        self.share_tau_s = share_tau_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.chunk_tokens = chunk_tokens
        self.step_s = step_s
        self.seq_s = seq_s
        self.sessions = SessionTable(max_sessions)
        self._rr = RoundRobinCounter()

    def pick(self, request: RequestFeatures, workers: Sequence[WorkerView]) -> Pick:
        hits, best_hit = estimate_hits(request, workers)
        costs = self.costs(request, workers, hits)
        session = request.session_id
        bound = self.sessions.get(session) if session is not None else None
        if bound is not None and (bound >= len(workers) or hits[bound] == UNHEALTHY):
            bound = None
        best = min(costs)  # unhealthy workers cost inf; at least one is healthy
        if bound is not None:
            bound_cost = costs[bound]
            if bound_cost <= best * (1.0 + self.affinity_margin) + self.affinity_slack_s:
                return Pick(bound, "affinity_stick", hits[bound], best_hit)
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

    def costs(
        self, request: RequestFeatures, workers: Sequence[WorkerView], hits: Sequence[int]
    ) -> list[float]:
        """Predicted seconds per worker (inf for unhealthy ones); see the module docstring."""
        length = request.input_length
        session = request.session_id
        default_rate = self.prefill_tokens_per_s
        chunk, step_s, seq_s = self.chunk_tokens, self.step_s, self.seq_s
        weight = self.eviction_weight
        share = self.share_weight
        tau = self.share_tau_s
        first = workers[0] if workers else None
        learned = getattr(first, "rate", None) is not None  # views of one kind: check once
        tracked = weight and getattr(first, "footprint", None) is not None
        now = -1.0  # the latest booking anywhere: found when a worker first needs it
        costs: list[float] = []
        for i, worker in enumerate(workers):
            hit = hits[i]
            if hit == UNHEALTHY:
                costs.append(INF)
                continue
            uncached = length - hit if length > hit else 0
            rate = worker.rate.tokens_per_s if learned else default_rate
            pending = worker.pending_prefill_tokens
            work = pending + uncached
            n = worker.num_requests
            cost = work / rate + (work / chunk + 1.0) * (step_s + seq_s * n)
            if share and uncached and n:
                extra = share * uncached / rate * n
                if tau:
                    queue = pending / rate
                    extra *= queue / (queue + tau)
                cost += extra
            if tracked and uncached:
                footprint = worker.footprint
                capacity = worker.kv_capacity_tokens
                if footprint.warm_tokens + length > capacity:  # an upper bound: check closer
                    if now < 0:
                        now = max(w.footprint.clock for w in workers)
                    over = footprint.others_tokens(session, now) + length - capacity
                    if over > 0:
                        cost += weight * (uncached if uncached < over else over) / rate
            costs.append(cost)
        return costs

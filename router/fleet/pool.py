"""The workers behind the proxy: their states, connections, health, and the picker over them.

Each :class:`Worker` owns one :class:`~router.cache.worker_state.WorkerState` (load counters and
both shadows, sized to the worker's KV capacity), one connection pool and its counters.
The picker indexes the list of states the pool hands it, so the order is stable: a new
worker is appended.

Removal. A removed worker leaves the list at once (no new request goes there); requests in
flight on it hold its ``WorkerState`` through their booking and release there as usual. The
sticky and unified pickers bind sessions to list *indices*, which shift on removal, so the
picker is rebuilt (same name, same parameters): every session is routed as new once, then
binds again. Adding a worker keeps the picker (indices do not move).

Health: a circuit breaker per worker. ``health_failure_threshold`` consecutive failures
(health probes; and of real requests: connect errors, resets, timeouts, 5xx answers) open
the circuit: the worker is taken out of picking. It stays out at least ``circuit_open_s``;
after that the first success (a probe, :mod:`router.fleet.health`) closes the circuit and brings
it back, with its shadow reset (unpinned entries forgotten, capacities restored): a worker
that was down most likely restarted with an empty cache. A failing real request never
takes out the *last* healthy worker of its side (probes still can): when every worker
answers 5xx, relaying their answers beats a router-made 503 for all. The sides are those of
a disaggregated request's legs: the decode workers, and the others (aggregated and prefill
workers, among which the picker chooses); a healthy decode worker serves nothing without a
prefill worker, so it does not keep the last one in. :meth:`WorkerPool.can_serve` says
whether a request can be served at all (``/health``). Transitions are counted
(``circuit_transitions_total``) and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.base import NoHealthyWorker, Pick, RequestFeatures, check_views
from policies.registry import make_picker
from router.cache.block_lru import BlockLRU
from router.cache.feedback import reset_shadow
from router.cache.kv_index import KVIndex
from router.cache.sizing import cpu_blocks, new_worker_state, shadow_sizes
from router.cache.worker_state import Booking, WorkerState
from router.config import Settings, normalize_url
from router.fleet.placement import Placement
from router.fleet.stats import MODEL_LABELS_MAX, ModelStats, PoolStats, WorkerStats
from router.fleet.upstream import UpstreamPool
from router.fleet.worker_truth import WorkerTruth

log = logging.getLogger("cache_router.pool")

BOTH, PREFILL, DECODE = "both", "prefill", "decode"
ROLES = (BOTH, PREFILL, DECODE)


@dataclass(eq=False)
class Worker:
    """One worker: its state for the pickers, its connections, its health and counters."""

    url: str
    state: WorkerState
    upstream: UpstreamPool
    capacity_tokens: int
    capacity_blocks: int
    consecutive_failures: int = 0
    last_failure_request: bool = False  # the last failure was a real request's, not a probe's
    last_error: str | None = None
    removed: bool = False
    opened_at: float | None = None  # time.monotonic() when the circuit last opened
    # the shadows are sized to the capacity the worker's own /metrics report (not a guess), so
    # the report-driven capacity correction (router/cache/feedback.py) leaves them alone
    capacity_reported: bool = False
    # its CPU KV tier in tokens (0: none), from the flags or, once reported, its /metrics
    cpu_capacity_tokens: int = 0
    cpu_capacity_reported: bool = False
    stats: WorkerStats = field(default_factory=WorkerStats)
    truth: WorkerTruth = field(default_factory=WorkerTruth)  # its /metrics (worker_metrics.py)
    kv_events: Any = None  # its KVEventSubscriber (kv_events.py) in precise mode
    # other router replicas' load on it (state_sync.py), included in ``state``'s counters:
    # (requests, pending prefill tokens, decode tokens)
    remote_load: tuple[int, int, int] = (0, 0, 0)
    # the models it serves, base and LoRA adapters (its /v1/models, or pinned with
    # --worker-models); None until known: it may serve anything
    models: frozenset[str] | None = None
    adapters: frozenset[str] = frozenset()  # those of ``models`` that are LoRA adapters
    models_pinned: bool = False
    # disaggregated serving: "both" (aggregated), "prefill" or "decode"; an SGLang prefill
    # worker's bootstrap server port
    role: str = BOTH
    bootstrap_port: int | None = None

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def healthy(self) -> bool:
        return self.state.healthy

    def describe(self) -> dict[str, Any]:
        """The ``/workers`` entry."""
        state, acc = self.state, self.state.accuracy
        radix = state.radix
        return {
            "url": self.url,
            "role": self.role,
            "healthy": state.healthy,
            "num_requests": state.num_requests,
            "remote_num_requests": self.remote_load[0],
            "pending_prefill_tokens": state.pending_prefill_tokens,
            "ongoing_decode_tokens": state.ongoing_decode_tokens,
            "held_tokens": state.held_tokens,
            "pinned_blocks": state.blocks.pinned_blocks,
            "shadow_blocks": len(state.blocks),
            "shadow_capacity_blocks": state.blocks.capacity_blocks,
            "radix_tokens": radix.total_tokens if radix is not None else 0,
            "radix_locked_tokens": radix.protected_tokens if radix is not None else 0,
            "radix_capacity_tokens": radix.capacity_tokens if radix is not None else 0,
            "kv_capacity_tokens": self.capacity_tokens,
            "requests_total": sum(self.stats.requests.values()),
            "prompt_tokens": self.stats.prompt_tokens,
            "estimated_hit_tokens": self.stats.estimated_hit_tokens,
            "reported_cached_tokens": self.stats.reported_cached_raw,
            "accuracy": {
                "requests": acc.requests,
                "reported_tokens": acc.reported_tokens,
                "blocks_estimate_tokens": acc.blocks_estimate_tokens,
                "radix_estimate_tokens": acc.radix_estimate_tokens,
                "blocks_abs_error_tokens": acc.blocks_abs_error_tokens,
                "radix_abs_error_tokens": acc.radix_abs_error_tokens,
                "prompt_tokens": acc.prompt_tokens,
                "kv_events_requests": acc.kv_requests,
                "kv_events_prompt_tokens": acc.kv_prompt_tokens,
                "kv_events_reported_tokens": acc.kv_reported_tokens,
                "kv_events_estimate_tokens": acc.kv_estimate_tokens,
                "kv_events_abs_error_tokens": acc.kv_abs_error_tokens,
            },
            "cpu_tier": None
            if state.cpu is None
            else {
                "capacity_tokens": self.cpu_capacity_tokens,
                "capacity_reported": self.cpu_capacity_reported,
                "shadow_blocks": len(state.cpu),
                "shadow_capacity_blocks": state.cpu.capacity_blocks,
                "load_s_per_token": state.kv_load_s_per_token,
                "requests": acc.tier_requests,
                "prompt_tokens": acc.tier_prompt_tokens,
                "reported_tokens": acc.cpu_reported_tokens,
                "estimate_tokens": acc.cpu_estimate_tokens,
                "abs_error_tokens": acc.cpu_abs_error_tokens,
                "gpu_abs_error_tokens": acc.gpu_abs_error_tokens,
            },
            "worker_metrics": self.truth.describe(),
            "kv_events": self.kv_events.describe() if self.kv_events is not None else None,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "models": sorted(self.models) if self.models is not None else None,
            "adapters": sorted(self.adapters),
            "lora": self.state.adapters.describe(),
        }


def same_side(a: Worker, b: Worker) -> bool:
    """Whether ``a`` and ``b`` can take the same leg of a request: both decode workers, or
    neither (aggregated and prefill workers: the picker's side)."""
    return (a.role == DECODE) == (b.role == DECODE)


class _Excluded:
    """A worker already tried for this request: the picker sees it as unhealthy."""

    __slots__ = ("_state",)
    healthy = False

    def __init__(self, state: WorkerState) -> None:
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class ModelNotServed(LookupError):
    """No worker of the pool serves the request's model (the router answers 404)."""


class NoDecodeWorker(NoHealthyWorker):
    """A prefill worker was chosen and no healthy decode worker can take the request."""


class WorkerPool:
    """The workers, in picker order, and the picker that chooses among them.

    Models: each worker serves a set of models (a base model and its LoRA adapters). A
    request naming a model is picked among the workers that serve it: the others are shown to
    the picker as unavailable (like workers already tried), so every picker works unchanged
    and keeps its per-worker indices. The views for each model are built once per change of
    membership or of a worker's models, not per request.

    Roles (disaggregated serving): the picker (``--policy``) chooses among the aggregated and
    the prefill workers, where the prefix caches that matter live; choosing a prefill worker
    makes the request disaggregated, and ``decode_picker`` (``--decode-policy``) then
    chooses among the decode workers. Each picker sees the other role's workers as
    unavailable, the same way as a model they do not serve.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cost_terms = settings.cost_terms()  # the TTFT cost model's, every worker's prior
        self.workers: list[Worker] = []
        self.states: list[WorkerState] = []
        self.stats = PoolStats()
        # choose, book, report, release: the decisions, counted in ``stats.decisions``
        self.placement = Placement(self.stats.decisions)
        self.picker = self._new_picker()
        self.decode_picker = make_picker(settings.decode_policy)
        self._views_by_model: dict[tuple[str | None, bool], Sequence[Any] | None] = {}
        self._decode_workers = False  # some worker of the pool is a decode worker
        self.adapter_names: frozenset[str] = frozenset()  # adapters any worker serves
        self._served: frozenset[str] = frozenset()  # models some worker is known to serve
        # called with every booking (router/fleet/state_sync.py shares them with other replicas)
        self.on_book: Callable[[Worker, RequestFeatures, Booking], None] | None = None
        for url, role in settings.roles():
            self.add(url, role=role)

    def _new_picker(self):
        return make_picker(self.settings.policy, **self.settings.picker_params)

    # ---- membership ----------------------------------------------------------------------

    def get(self, url: str) -> Worker | None:
        url = normalize_url(url)
        for worker in self.workers:
            if worker.url == url:
                return worker
        return None

    def add(
        self,
        url: str,
        kv_capacity_tokens: int | None = None,
        role: str = BOTH,
        bootstrap_port: int | None = None,
    ) -> Worker:
        """Append a worker (ValueError if the URL is already in the pool, or a bad role)."""
        url = normalize_url(url)
        if self.get(url) is not None:
            raise ValueError(f"worker {url} is already in the pool")
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        s = self.settings
        tokens = kv_capacity_tokens or s.capacity_for(url)
        state = new_worker_state(
            url,
            tokens,
            s.block_size,
            shadow=s.shadow,
            prefill_tokens_per_s=s.prefill_tokens_per_s,
            cost_terms=self.cost_terms,
            radix_policy=s.radix_eviction,
            kv_index=KVIndex() if s.kv_events else None,
        )
        blocks = state.blocks.capacity_blocks
        cpu_tokens = s.cpu_capacity_for(url)
        self._size_cpu_tier(state, cpu_tokens)
        worker = Worker(
            url=url,
            state=state,
            upstream=UpstreamPool(url, s.connect_timeout_s),
            capacity_tokens=tokens,
            capacity_blocks=blocks,
            cpu_capacity_tokens=cpu_tokens,
            role=role,
        )
        if role == PREFILL:
            worker.bootstrap_port = bootstrap_port or s.bootstrap_port(url)
        pinned = s.worker_models.get(url)
        if pinned:
            worker.models_pinned = True
            worker.models = frozenset(pinned)
            worker.adapters = frozenset(pinned[1:])
        # what the pickers read, once per worker (they are rebuilt of the same kinds)
        check_views(self.picker, (state,))
        check_views(self.decode_picker, (state,))
        self.workers.append(worker)
        self.states.append(state)
        self._models_changed()
        log.info("%s worker added: %s (KV %d tokens, %d blocks)", role, url, tokens, blocks)
        return worker

    def remove(self, url: str) -> Worker:
        """Take a worker out (KeyError if unknown); its in-flight requests finish there."""
        worker = self.get(url)
        if worker is None:
            raise KeyError(url)
        index = self.workers.index(worker)
        del self.workers[index]
        del self.states[index]
        worker.removed = True
        worker.upstream.close()
        self.picker = self._new_picker()  # session bindings were indices into the old list
        self.decode_picker = make_picker(self.settings.decode_policy)
        self._models_changed()
        log.info("worker removed: %s (%d in flight)", worker.url, worker.state.num_requests)
        return worker

    # ---- models --------------------------------------------------------------------------

    def set_models(self, worker: Worker, models: frozenset[str], adapters: frozenset[str]) -> bool:
        """``worker`` serves ``models`` (``adapters`` among them); True if that changed."""
        if worker.models_pinned or (worker.models == models and worker.adapters == adapters):
            return False
        worker.models, worker.adapters = models, adapters
        self._models_changed()
        log.info("worker %s serves %s", worker.url, ", ".join(sorted(models)) or "no model")
        return True

    def _models_changed(self) -> None:
        self._views_by_model = {}
        self.adapter_names = frozenset().union(*(w.adapters for w in self.workers))
        self._served = frozenset().union(*(w.models or () for w in self.workers))
        self._decode_workers = any(w.role == DECODE for w in self.workers)

    def model_stats(self, model: str | None) -> ModelStats:
        """The counters of requests naming ``model`` (labels bounded: see PoolStats)."""
        table = self.stats.models
        stats = table.get(model or "none")
        if stats is None:
            label = "none" if model is None else model if model in self._served else "other"
            if len(table) >= MODEL_LABELS_MAX:
                label = "other"
            stats = table.get(label)
            if stats is None:
                stats = table[label] = ModelStats()
        return stats

    def views_for(self, model: str | None, decode: bool = False) -> Sequence[Any]:
        """The picker's views for a request naming ``model``: every worker's state, those
        that do not serve it (or are of the other role: decode workers unless ``decode``,
        only decode workers if it) shown as unavailable. Raises :class:`ModelNotServed` when
        no worker serves the model (workers whose models are not known yet may)."""
        if not decode and not self._decode_workers and (model is None or not self.workers):
            return self.states  # (no worker at all: a 503, not a 404)
        key = (model, decode)
        views = self._views_by_model.get(key, False)
        if views is False:
            workers = self.workers
            serving = [model is None or w.serves(model) for w in workers]
            eligible = [
                ok and (w.role == DECODE) == decode for w, ok in zip(workers, serving, strict=True)
            ]
            if model is not None and not any(serving):
                views = None
            elif all(eligible):
                views = self.states
            else:
                views = [
                    w.state if ok else _Excluded(w.state)
                    for w, ok in zip(workers, eligible, strict=True)
                ]
            if len(self._views_by_model) < 4096:  # bounded: clients choose model names
                self._views_by_model[key] = views
        if views is None:
            raise ModelNotServed(model)
        return views

    def resize(self, worker: Worker, tokens: int) -> None:
        """Size ``worker``'s shadows to ``tokens`` of KV capacity (its real one, read from its
        ``/metrics``): both shadows, whatever the feedback correction had made of them, which
        stops for this worker (its capacity is no longer a guess)."""
        sizes = shadow_sizes(tokens, self.settings.block_size)
        worker.capacity_tokens = tokens
        worker.capacity_blocks = sizes.blocks
        worker.capacity_reported = True
        worker.state.blocks.resize(sizes.blocks)
        tree = worker.state.radix
        if tree is not None:
            room = sizes.radix_tokens
            tree.capacity_tokens = room
            if tree.total_tokens > room and tree.evictable_tokens:
                tree.evict(min(tree.evictable_tokens, tree.total_tokens - room))
        log.info("worker %s: shadows sized to its KV capacity, %d tokens", worker.url, tokens)

    def resize_cpu(self, worker: Worker, tokens: int) -> None:
        """Size ``worker``'s CPU-tier shadow to ``tokens``, the tier its ``/metrics`` report:
        made if it had none, its oldest blocks dropped if it shrinks."""
        if worker.cpu_capacity_reported and tokens == worker.cpu_capacity_tokens:
            return
        worker.cpu_capacity_tokens, worker.cpu_capacity_reported = tokens, True
        self._size_cpu_tier(worker.state, tokens)
        log.info("worker %s: CPU tier shadow sized to its report, %d tokens", worker.url, tokens)

    def _size_cpu_tier(self, state: WorkerState, tokens: int) -> None:
        """The CPU-tier shadow of ``tokens`` (kept, resized, made or dropped) and the load
        time the pickers price it at; no shadow with ``--router-tiers off``."""
        s = self.settings
        if tokens <= 0:
            state.cpu, state.kv_load_s_per_token = None, 0.0
            return
        state.kv_load_s_per_token = s.kv_load_s_per_token(state.name)
        if s.router_tiers != "on":
            return
        blocks = cpu_blocks(tokens, s.block_size)
        if state.cpu is None:
            state.cpu = BlockLRU(blocks, s.block_size)
        else:
            state.cpu.resize(blocks)

    def close(self) -> None:
        for worker in self.workers:
            worker.upstream.close()

    # ---- health --------------------------------------------------------------------------

    def record_failure(self, worker: Worker, reason: str, request: bool = False) -> None:
        """One more failure in a row; open the circuit at the threshold.

        ``request``: a real request failed (not a probe); that never takes out the last
        healthy worker of its side (:func:`same_side`).
        """
        worker.consecutive_failures += 1
        worker.last_failure_request = request
        worker.last_error = reason
        if (
            worker.state.healthy
            and worker.consecutive_failures >= self.settings.health_failure_threshold
        ):
            if request and not any(
                w.state.healthy and same_side(w, worker) for w in self.workers if w is not worker
            ):
                return
            self.take_out(worker, reason)

    def take_out(self, worker: Worker, reason: str) -> None:
        """Open ``worker``'s circuit now (a probe success brings it back after its time)."""
        if not worker.state.healthy:
            return
        worker.state.healthy = False
        worker.opened_at = time.monotonic()
        worker.stats.count(worker.stats.circuit, "open")
        log.warning("worker %s is out (circuit open): %s", worker.url, reason)

    def record_success(self, worker: Worker, probe: bool = False) -> None:
        """A success: the failure count restarts; an open circuit closes after its time.

        A ``probe`` answering while requests fail does not restart the count: a worker whose
        /health says 200 while its generations fail (a gray failure) would otherwise never
        reach the threshold between two probes, and would go on taking a share of traffic."""
        if worker.state.healthy:
            if not (probe and worker.last_failure_request):
                worker.consecutive_failures = 0
            return
        if worker.removed:
            return
        opened = worker.opened_at
        if opened is not None and time.monotonic() - opened < self.settings.circuit_open_s:
            return  # still cooling down: a worker answering in bursts stays out a while
        worker.consecutive_failures = 0
        worker.state.healthy = True
        worker.stats.count(worker.stats.circuit, "closed")
        reset_shadow(worker.state, worker.capacity_blocks, worker.capacity_tokens)
        if worker.kv_events is not None:  # it may have restarted: resynchronise its events
            worker.kv_events.feed.reset()
        log.warning("worker %s is back (circuit closed, shadow reset)", worker.url)

    # ---- picking -------------------------------------------------------------------------

    def pick(
        self, request: RequestFeatures, exclude: Sequence[Worker] = (), decode: bool = False
    ) -> tuple[Worker, Pick]:
        """The picker's choice among healthy workers that serve ``request.model`` and are not
        in ``exclude``: aggregated and prefill workers, or with ``decode`` the decode
        picker's among decode workers (:meth:`Placement.choose`: its branch counted).

        Raises :class:`ModelNotServed` when no worker serves the model,
        :class:`~policies.base.NoHealthyWorker` when none of those is healthy
        (:class:`NoDecodeWorker` for a decode pick).
        """
        views = self.views_for(request.model, decode)
        if exclude:
            views = [
                _Excluded(w.state) if w in exclude else v
                for w, v in zip(self.workers, views, strict=True)
            ]
        if not decode:
            choice = self.placement.choose(self.picker, request, views)
        else:
            try:
                choice = self.placement.choose(self.decode_picker, request, views)
            except NoHealthyWorker:
                raise NoDecodeWorker("no healthy decode worker") from None
        return self.workers[choice.worker], choice

    def book(
        self,
        worker: Worker,
        request: RequestFeatures,
        expected_output: int,
        radix_later: bool = False,
    ) -> Booking:
        """Book ``request`` on ``worker`` (:meth:`WorkerState.book`) and tell ``on_book``."""
        booking = self.placement.book(
            worker.state, request, expected_output, radix_later=radix_later
        )
        if self.on_book is not None:
            self.on_book(worker, request, booking)
        return booking

    def healthy_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.state.healthy]

    def can_serve(self) -> bool:
        """Whether a generation request can be served now: a healthy aggregated worker, or
        a healthy prefill worker and a healthy decode worker."""
        roles = {w.role for w in self.workers if w.state.healthy}
        return BOTH in roles or (PREFILL in roles and DECODE in roles)

    def healthy_by_role(self) -> dict[str, int]:
        """The healthy workers of each role the fleet has."""
        counts: dict[str, int] = {}
        for w in self.workers:
            counts[w.role] = counts.get(w.role, 0) + w.state.healthy
        return counts


__all__ = [
    "BOTH",
    "DECODE",
    "PREFILL",
    "ROLES",
    "ModelNotServed",
    "NoDecodeWorker",
    "NoHealthyWorker",
    "Worker",
    "WorkerPool",
]

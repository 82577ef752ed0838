"""The router core every front end shares: one request's routing, from its body to its release.

``serve``'s forwarder (:mod:`router.proxy.forward`, which moves the bytes itself) and the
endpoint picker for inference gateways (:mod:`router.epp`, where Envoy moves them) route
with this one class, so both read a request, pick, book, learn from the answer and release
the same way, on the same pool, pickers, shadows and counters:

0. :meth:`RouterCore.admit`, :meth:`RouterCore.leave`: the requests in flight, router-wide
   (``max_inflight``: 429 past it); with ``--flow-control``, :meth:`RouterCore.flow_wait`
   between 1. and 2.: the request waits its turn while the fleet is saturated
   (:mod:`router.core.flow`);
1. :meth:`RouterCore.understand`: the body parsed (400s), its tokens and block hashes, the
   model (an adapter's own block chain), the stored response it acts on (its owner);
2. :meth:`RouterCore.choose`: the picker's worker among those that serve the model and are
   not excluded (tried already, or outside a gateway's subset), or the response's owner;
3. :meth:`RouterCore.book`: the booking (load, pinned blocks) and the estimate counters;
4. :meth:`RouterCore.owner_reader` and :meth:`RouterCore.learn_owner`,
   :meth:`RouterCore.report`: what the answer says (the response id it stored, read across
   the pieces it comes in; the cached tokens the worker reports, scored and fed back);
5. :meth:`RouterCore.release`: the booking released (exactly once) and the outcome counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.base import NoHealthyWorker, Pick, RequestFeatures
from router.cache.feedback import to_router_tokens
from router.cache.lora import under_adapter
from router.cache.worker_state import Booking
from router.config import Settings
from router.core.dispatch_hold import DispatchHold, Slot
from router.core.engine_priority import engine_priority, orders_engine
from router.core.errors import (
    ModelNotFound,
    NoHealthyWorkerError,
    ResponseNotFound,
    ResponseOwnerGone,
    ResponseOwnerUnavailable,
    RouterError,
    TooManyRequests,
    echo,
)
from router.core.flow import FlowControl
from router.core.flow_queue import body_priority
from router.core.metrics import RouterMetrics
from router.core.parse import (
    CHAT,
    COMPLETION,
    GENERATE,
    GENERATION_PATHS,
    RESPONSE_CALL,
    RESPONSES,
    ParsedRequest,
    parse_other,
    parse_request,
    response_call_id,
)
from router.core.prefix_owners import Claim, PrefixOwners, owner_key
from router.core.tokenize import APPROX_BYTES_PER_TOKEN, Tokenizer, features_of, tokens_now
from router.core.usage import ResponseIdReader, Usage
from router.fleet.pool import DECODE, ModelNotServed, Worker, WorkerPool
from router.fleet.response_owners import ResponseOwners
from router.fleet.stats import ModelStats

PROMPT_KINDS = frozenset(GENERATION_PATHS.values())
PRIORITY_KINDS = frozenset((CHAT, COMPLETION, GENERATE))  # the engines' 'priority' field


@dataclass(slots=True)
class Routed:
    """One request's routing state, whatever front end carries its bytes."""

    endpoint: str
    request: ParsedRequest
    features: RequestFeatures
    model_stats: ModelStats  # the counters of the model it names
    endpoint_stats: dict[str, int]  # its endpoint's outcomes by status
    owner: Worker | None = None  # the worker that stored the response this one acts on
    learn_owner: bool = False  # a Responses API create: learn who stores the answer
    tried: list[Worker] = field(default_factory=list)
    # resets / 5xx before any byte, held until the outcome is known (settle)
    failures: list[tuple[Worker, str]] = field(default_factory=list)
    answered_ok: bool = False  # some worker answered below 500


class RouterCore:
    """Reading, picking, booking, learning and releasing, on one pool."""

    def __init__(
        self,
        settings: Settings,
        pool: WorkerPool,
        tokenizer: Tokenizer,
        metrics: RouterMetrics,
        owners: ResponseOwners | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.owners = owners if owners is not None else ResponseOwners(settings.response_owners_max)
        self.correct = settings.correct_shadow
        self.max_inflight = settings.max_inflight
        self.flow = FlowControl(settings, pool, metrics.registry) if settings.flow_control else None
        hold = settings.hold_tokens()
        self.hold = DispatchHold(hold) if hold else None
        if self.hold is not None:
            metrics.watch_hold(self.hold, pool)
        # --engine-priority: the blocks the requests in the engines' queues will compute
        self.in_engine = PrefixOwners() if settings.engine_priority else None
        # the drain is over (router.service.server): the server cancels what still runs, and
        # a front end answers such a request 503 ``shutdown`` where nothing was sent yet
        self.drain_over = False

    def drain(self) -> None:
        """The router drains (SIGTERM): requests waiting in flow control's queue are
        answered 503 at once, and no more wait there; those placed go on meanwhile."""
        if self.flow is not None:
            self.flow.close()

    # ---- 0. admission --------------------------------------------------------------------

    def admit(self) -> None:
        """One more request in flight, whichever front end carries it (:meth:`leave` once
        when it is over); past ``max_inflight``: 429, before its body is read."""
        stats = self.pool.stats
        if self.max_inflight and stats.in_flight >= self.max_inflight:
            stats.count_rejected("inflight")
            raise TooManyRequests(f"the router is handling {stats.in_flight} requests")
        stats.in_flight += 1

    def leave(self) -> None:
        """A request :meth:`admit` let in is over."""
        self.pool.stats.in_flight -= 1

    # ---- 1. the request ------------------------------------------------------------------

    async def understand(
        self,
        kind: str,
        raw: bytes,
        session_value: str | None,
        http_method: str,
        http_path: str,
        content_type: bytes | None = None,
        into: type[Routed] = Routed,
        **extra,
    ) -> Routed:
        """Parse, tokenize and hash ``raw`` for endpoint ``kind``; find the stored response
        it acts on. A ``into`` (a :class:`Routed` subclass) made with ``extra`` fields."""
        block_size = self.settings.block_size
        owner = None
        if kind in PROMPT_KINDS:
            request = parse_request(kind, raw, session_value)
            tok = tokens_now(request, self.tokenizer, block_size)
            if tok is None:
                tok = await self.tokenizer.tokenize(request)
            features = features_of(request, tok, block_size)
        else:  # no prompt: no blocks, the body's length as its load
            request = parse_other(kind, raw, content_type, session_value)
            if kind == RESPONSE_CALL:
                request.stored_response_id = response_call_id(http_method, http_path)
            length = -(-len(raw) // APPROX_BYTES_PER_TOKEN)
            features = RequestFeatures(
                blocks=(), input_length=length, session_id=request.session_id,
                block_size=block_size, model=request.model,
            )  # fmt: skip
        if request.stored_response_id is not None:
            owner = await self._owner(request.stored_response_id)
        model = request.model
        if model is not None and model in self.pool.adapter_names:
            features = under_adapter(features, model)
        return into(
            endpoint=kind,
            request=request,
            features=features,
            model_stats=self.pool.model_stats(model),
            endpoint_stats=self.pool.stats.endpoint(kind),
            owner=owner,
            learn_owner=kind == RESPONSES,
            **extra,
        )

    async def _owner(self, response_id: str) -> Worker:
        """The worker that stored ``response_id``; 404 if none did or it left the fleet."""
        url = await self.owners.owner(response_id)
        said = echo(response_id)
        if url is None:
            raise ResponseNotFound(
                f"Response with id '{said}' not found: no worker behind this router "
                "stored it (or the router has forgotten it: --response-owners-max)"
            )
        worker = self.pool.get(url)
        if worker is None or worker.removed:
            raise ResponseOwnerGone(
                f"Response with id '{said}' was stored by worker {url}, which has left "
                "the fleet: the engine kept it in that server's memory, so it is gone"
            )
        return worker

    def unrouted(self, endpoint: str, status: str) -> None:
        """A request answered before any worker was tried (worker ``none``)."""
        stats = self.pool.stats
        table = stats.unrouted
        table[status] = table.get(status, 0) + 1
        by_endpoint = stats.endpoint(endpoint)
        by_endpoint[status] = by_endpoint.get(status, 0) + 1

    async def flow_wait(
        self,
        r: Routed,
        header: Callable[[str], str | None],
        size: int,
        api_key: str | None = None,
    ) -> None:
        """With flow control: return when ``r`` may be placed (its turn, the fleet not
        saturated for it); a :class:`TooManyRequests` when it is refused. ``header``: the
        request's header by lower-case name; ``size``: its body's bytes. Calls on a stored
        response (no prompt, one worker) pass. Cancelled while waiting (its client left, or
        the gateway closed the stream): counted as unrouted ``client_disconnect``, as a
        client that leaves mid-body is, so ``requests_total`` counts every request."""
        flow = self.flow
        if flow is None or r.endpoint == RESPONSE_CALL:
            return
        c = flow.classify(header, r.request.body, api_key)
        try:
            await flow.enter(r.features, c, size)
        except asyncio.CancelledError:
            self.unrouted(r.endpoint, "client_disconnect")
            raise

    # ---- 2. and 3. the worker ------------------------------------------------------------

    def choose(
        self,
        r: Routed,
        last_error: RouterError | None = None,
        exclude: list | None = None,
        decode: bool = False,
    ) -> tuple[Worker, Pick]:
        """The worker for ``r``: its response's owner, else the picker's choice among the
        workers that serve its model, not tried yet and not in ``exclude`` (with ``decode``:
        the decode picker's among the decode workers). No such worker: ``last_error`` (why
        the previous try failed) or a 503; no worker serves the model: 404
        ``model_not_found``."""
        t0 = time.perf_counter()
        try:
            if r.owner is not None and not decode:
                worker, pick = self._owner_pick(r.owner, r.request.stored_response_id)
            else:
                tried = r.tried + exclude if exclude else r.tried
                worker, pick = self.pool.pick(r.features, tried, decode)
        except NoHealthyWorker as exc:
            if last_error is not None:
                raise last_error from None
            raise NoHealthyWorkerError(str(exc) if decode else "no healthy worker") from None
        except ModelNotServed:
            model = r.features.model
            message = f"The model `{echo(model or '')}` does not exist (no worker serves it)."
            raise ModelNotFound(message) from None
        self.metrics.pick.observe(time.perf_counter() - t0)
        if last_error is not None:  # this is a retry, and why
            retries = self.pool.stats.retries
            retries[last_error.code] = retries.get(last_error.code, 0) + 1
        return worker, pick

    def _owner_pick(self, owner: Worker, response_id: str | None) -> tuple[Worker, Pick]:
        """The owner of a stored response, the one worker that can take the request."""
        said = echo(response_id or "")
        if owner.removed or owner not in self.pool.workers:
            raise ResponseOwnerGone(
                f"the worker that stored response '{said}' ({owner.url}) left the fleet"
            )
        if not owner.state.healthy:
            raise ResponseOwnerUnavailable(
                f"the worker that stored response '{said}' ({owner.url}) is out of "
                "service now (its circuit is open)"
            )
        pick = Pick(self.pool.workers.index(owner), "response_owner")
        self.pool.placement.count(pick)
        return owner, pick

    def book(
        self,
        r: Routed,
        worker: Worker,
        pick: Pick,
        radix_later: bool = False,
        max_tokens: int | None = None,
    ) -> Booking:
        """Book ``r`` on ``worker`` and count the estimates it was picked on; ``max_tokens``:
        the output this leg produces, if not the request's (a prefill leg's one token)."""
        features = r.features
        output = r.request.max_tokens if max_tokens is None else max_tokens
        booking = self.pool.book(worker, features, output, radix_later=radix_later)
        booking.ttft_valid = r.request.stream  # else the first byte is the whole answer
        stats = worker.stats
        stats.prompt_tokens += features.input_length
        stats.estimated_hit_tokens += pick.hit_tokens
        stats.best_hit_tokens += pick.best_hit_tokens
        if worker.role != DECODE:  # the model's prompt tokens count once, where prefilled
            by_model = r.model_stats
            by_model.prompt_tokens += features.input_length
            by_model.estimated_hit_tokens += pick.hit_tokens
        return booking

    def order_key(self, r: Routed, worker: Worker, booking: Booking) -> int | None:
        """The key ``r`` (booked as ``booking``) goes by into its worker's prefill: the
        ``priority`` the engine orders it by (``--engine-priority``), the order the router
        releases held requests in (``--dispatch-hold-tokens``), or both;
        :mod:`router.core.engine_priority`, with the client's own integer priority as its
        major key. None: neither is on, the picker sets none, the endpoint has no such
        field, or the client's is not an integer (the worker answers that)."""
        if (
            not (self.settings.engine_priority or self.hold is not None)
            or r.request.kind not in PRIORITY_KINDS
            or not orders_engine(self.pool.picker)
        ):
            return None
        body = r.request.body
        client = 0 if body.get("priority") is None else body_priority(body)
        if client is None:
            return None
        registries = (self.hold, self.in_engine)
        after = owner_key(registries, worker.url, booking.blocks, booking.cached_blocks)
        return engine_priority(booking, time.time(), client, after)

    def engine_claim(self, worker: Worker, booking: Booking, key: int) -> Claim | None:
        """The request booked as ``booking`` goes to ``worker``'s engine with priority
        ``key``: its blocks are computed there once the engine schedules it (a request
        relying on them goes after it, :mod:`router.core.prefix_owners`), until
        :meth:`engine_unclaim`."""
        if self.in_engine is None:
            return None
        claim = Claim(key, booking.blocks)
        self.in_engine.add(worker.url, claim)
        return claim

    def engine_unclaim(self, worker: Worker, claim: Claim | None) -> None:
        """``claim``'s prefill is through, or its request ended (idempotent)."""
        if claim is not None:
            self.in_engine.remove(worker.url, claim)

    def hold_enter(
        self, r: Routed, worker: Worker, booking: Booking, key: int | None
    ) -> Slot | None:
        """``r``'s place in ``--dispatch-hold-tokens``'s count for ``worker`` (sent at once
        when there is room, else held): only streamed requests with a key; None otherwise."""
        if self.hold is None or key is None or not r.request.stream:
            return None
        return self.hold.enter(worker.url, booking.new_prefill, key, blocks=booking.blocks)

    async def hold_wait(self, slot: Slot) -> None:
        """Until ``slot`` is released (a first token on its worker made room)."""
        if slot.sent:
            return
        waiter = asyncio.get_running_loop().create_future()
        slot.payload = waiter
        await waiter

    def hold_leave(self, slot: Slot | None) -> None:
        """``slot``'s prefill is through, or its request ended (once): the held requests
        that now fit on its worker go."""
        if slot is None:
            return
        for released in self.hold.leave(slot):
            waiter = released.payload
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # ---- 4. the answer -------------------------------------------------------------------

    def answered(self, r: Routed, worker: Worker, status: int) -> None:
        """The worker's status: a 5xx is a failure held until the outcome is known; below
        that, the request succeeded and the held failures count now."""
        if status >= 500:
            r.failures.append((worker, f"HTTP {status}"))
        else:
            r.answered_ok = True
            self.settle(r)  # the workers that failed before this one count it now
            if worker.consecutive_failures or not worker.state.healthy:
                self.pool.record_success(worker)

    def settle(self, r: Routed) -> None:
        """Count the held failures against the workers' circuits, unless the request failed
        alike on several workers and succeeded nowhere (then it is suspect, not them)."""
        failures = r.failures
        if not failures:
            return
        r.failures = []
        if not r.answered_ok and len({id(w) for w, _ in failures}) > 1:
            self.pool.stats.suspect += 1
            return
        for worker, reason in failures:
            self.pool.record_failure(worker, reason, request=True)

    def owner_reader(self, r: Routed, status: int) -> ResponseIdReader | None:
        """A reader of the stored response's id in ``r``'s answer (a Responses API create
        answered 200), for :meth:`learn_owner`; None: the answer stores nothing."""
        return ResponseIdReader() if r.learn_owner and status == 200 else None

    def learn_owner(
        self, reader: ResponseIdReader, data: bytes, worker: Worker
    ) -> ResponseIdReader | None:
        """The answer's next bytes: learn ``worker`` as the owner once the id in them is
        whole (it may straddle two reads). The reader while it still looks, else None."""
        response_id = reader.feed(data)
        if response_id is not None:
            self.owners.learn(response_id, worker.url)
        return None if reader.done else reader

    def report(self, r: Routed, worker: Worker, booking: Booking, usage: Usage) -> None:
        """Record the worker's cached tokens against the estimates; correct the shadow's
        capacity while it is a guess (not yet read from the worker's /metrics). Not for a
        continuation: the worker's prompt holds the stored conversation too, which the
        router's features do not."""
        if r.owner is not None:
            return
        input_length = r.features.input_length
        worker.stats.reported_cached_raw += usage.cached_tokens
        reported = to_router_tokens(usage.cached_tokens, usage.prompt_tokens, input_length)
        if booking.reported_cached is None:
            by_model = r.model_stats
            by_model.reported_requests += 1
            by_model.reported_prompt_tokens += input_length
            by_model.reported_cached_tokens += reported
        cpu = usage.cpu_cached_tokens
        if cpu is not None:
            cpu = to_router_tokens(cpu, usage.prompt_tokens, input_length)
        placement = self.pool.placement
        placement.report(booking, reported, cpu)
        if self.correct and not worker.capacity_reported:
            change = placement.correct(
                booking, reported, worker.capacity_blocks, worker.capacity_tokens
            )
            stats = worker.stats
            if change.blocks_delta:
                direction = "shrink" if change.blocks_delta < 0 else "grow"
                stats.count(stats.corrections, ("blocks", direction))
            if change.radix_tokens_delta:
                direction = "shrink" if change.radix_tokens_delta < 0 else "grow"
                stats.count(stats.corrections, ("radix", direction))

    # ---- 5. the end ----------------------------------------------------------------------

    def release(self, r: Routed, worker: Worker, booking: Booking, status: str) -> None:
        """Release the booking and count the attempt's outcome, the first time only."""
        if not self.pool.placement.release(booking):
            return
        if self.flow is not None:
            self.flow.wake()
        stats = worker.stats
        stats.count(stats.requests, status)
        stats.count(r.model_stats.requests, status)
        by_endpoint = r.endpoint_stats
        by_endpoint[status] = by_endpoint.get(status, 0) + 1

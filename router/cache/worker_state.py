"""One worker's state as the router sees it, and the booking of a request on it.

The live proxy and the offline simulator share this module, so both follow seed 002's
state machine with the same code:

- at dispatch (:meth:`WorkerState.book`): ``num_requests += 1``, ``pending_prefill_tokens
  += new_prefill``, ``ongoing_decode_tokens += expected output``; the request's blocks are
  pinned in the block-hash LRU and its tokens inserted (locked) in the shadow radix tree;
- at the first token (:meth:`Booking.first_token`): the pending prefill is released;
- at the end, whatever the path (:meth:`Booking.finish`): everything else is released.

Each release happens exactly once however often it is called, so every exit path (done,
error, timeout, client disconnect) may simply call ``finish()``.

Both shadows are always kept; ``shadow`` chooses which answers ``estimate_cache_hit``. The
estimates of both are kept on the booking so the worker's reported cached tokens can score
each of them (:meth:`Booking.report_cached`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from router.cache.block_hash import TextBytes
from router.cache.block_lru import BlockLRU
from router.cache.cost_model import CostEntry, WorkerCost
from router.cache.features import RequestFeatures
from router.cache.kv_index import KVIndex
from router.cache.lora import AdapterSlots
from router.cache.radix_tree import RadixTree, TreeNode
from router.cache.workload import PrefillRate, SessionFootprint

ShadowKind = Literal["blocks", "radix"]
SHADOW_KINDS: tuple[str, ...] = ("blocks", "radix")


@dataclass
class ShadowAccuracy:
    """Estimated vs reported cached tokens, summed over requests with a report."""

    requests: int = 0
    reported_tokens: int = 0
    blocks_estimate_tokens: int = 0
    radix_estimate_tokens: int = 0
    blocks_abs_error_tokens: int = 0
    radix_abs_error_tokens: int = 0
    prompt_tokens: int = 0  # prompt tokens of the requests with a report
    # the KV-event index, over the reported requests it estimated (synced at dispatch)
    kv_requests: int = 0
    kv_prompt_tokens: int = 0
    kv_reported_tokens: int = 0
    kv_estimate_tokens: int = 0
    kv_abs_error_tokens: int = 0
    # per tier, over the reports that split their cached tokens by tier (the sim worker's;
    # vLLM and SGLang report the sum): the CPU tier's estimate against the CPU tier's truth,
    # the active GPU estimate against the GPU's
    tier_requests: int = 0
    tier_prompt_tokens: int = 0
    cpu_reported_tokens: int = 0
    cpu_estimate_tokens: int = 0
    cpu_abs_error_tokens: int = 0
    gpu_abs_error_tokens: int = 0


@dataclass(eq=False)
class WorkerState:
    """A worker's load counters and both shadow caches; a ``policies.base.WorkerView`` with
    every capability of ``policies.base.CAPABILITIES``.

    ``radix`` may be ``None`` when the caller never has token ids for it. When the caller
    caches block keys as pseudo-tokens (trace simulation), ``radix_token_weight`` is the
    real tokens one radix (or KV-index) token stands for.
    """

    name: str
    blocks: BlockLRU
    radix: RadixTree | None = None
    shadow: ShadowKind = "blocks"
    radix_token_weight: int = 1
    healthy: bool = True
    num_requests: int = 0
    pending_prefill_tokens: int = 0
    ongoing_decode_tokens: int = 0
    held_tokens: int = 0  # KV booked: prompt plus expected output of every booked request
    accuracy: ShadowAccuracy = field(default_factory=ShadowAccuracy)
    kv_index: KVIndex | None = None  # precise mode (router/fleet/kv_events.py): answers when synced
    worker_block_size: int | None = None  # the worker's own KV block size, from its /metrics
    # the engine's own queue and KV usage (policies.base.EngineFigures): not scraped onto the
    # state, so None, and the peer pickers derive both from the booking (policies/peer_views.py)
    num_requests_waiting: int | None = None
    kv_usage_fraction: float | None = None
    # learned from bookings and reports (router/cache/workload.py), read by the ttft picker
    rate: PrefillRate = field(default_factory=PrefillRate)
    footprint: SessionFootprint = field(default_factory=SessionFootprint)
    adapters: AdapterSlots = field(default_factory=AdapterSlots)  # its LoRA slots, as booked
    # the TTFT cost model (router/cache/cost_model.py): its queue and decode batch as booked,
    # its correction learned from reports, its prediction error; the ttft picker prices with
    # it when its terms come from a GPU profile
    cost: WorkerCost = field(default_factory=WorkerCost)
    # bookings whose prefill is pending, oldest first (a release drops the released ones at
    # the head, so the head is always pending), and when the last first token came (the next
    # one's prefill began then at the latest)
    prefill_queue: deque[Booking] = field(default_factory=deque, repr=False)
    prefill_since: float = 0.0
    # prefill tokens booked since the queue was last empty (the busy period): a chunked
    # engine fills every step to its chunk while prefill is queued, so steps end at whole
    # chunks of this stream, and the queue's last request ends at this offset
    # (:meth:`prefill_tail`)
    prefill_stream: int = 0
    # the worker's CPU KV tier: its shadow (write-through, as the worker's own: every booked
    # request's blocks), None when the router ignores the tier (``--router-tiers off``) or
    # the worker has none; seconds to load one token's KV from it
    cpu: BlockLRU | None = None
    kv_load_s_per_token: float = 0.0
    # the simulator's exact reading of the worker itself, (GPU hit, CPU-tier hit) of a
    # request's blocks (``--router-tiers exact``: a yardstick, no live router has it)
    exact: Callable[[Sequence[int]], tuple[int, int]] | None = field(default=None, repr=False)

    def prefill_left(self, now: float) -> int:
        """Prefill tokens still to compute at ``now``: the pending ones less what the oldest
        has had since it began, at the learned rate (at most its own).

        Engines prefill in admission order (vLLM and SGLang chunk the oldest first), so the
        head of the queue is the one in progress; it began at its booking or at the previous
        first token, whichever came later. Counted whole until its first token, a long
        prompt half done reads twice its wait: a session there looked dearer than it was,
        and moved, recomputing its prefix elsewhere (issue 31).
        """
        queue = self.prefill_queue
        pending = self.pending_prefill_tokens
        if not queue:
            return pending
        head = queue[0]
        elapsed = now - max(head.booked_at, self.prefill_since)
        if elapsed <= 0.0:
            return pending
        return pending - min(head.new_prefill, int(self.rate.tokens_per_s * elapsed))

    def prefill_tail(self, chunk_tokens: int) -> tuple[int, int]:
        """The last engine step of the queued prefill: ``(free, requests)``, the tokens of
        it still free (a chunk less the queue's tokens in it; 0 when the queue is empty or
        ends at a whole chunk) and the queued requests whose prefill ends in it.

        A chunked-prefill engine (vLLM, SGLang) takes each step's ``chunk_tokens`` from the
        queued requests in admission order, so a step is full while prefill is queued, and
        a request's first token comes at the end of the step that computes its last prompt
        token. A request booked now fills that step's free tokens with its own prefill, so
        the requests ending in it wait for those tokens too.
        """
        queue = self.prefill_queue
        if not queue or not self.pending_prefill_tokens:
            return 0, 0
        end = self.prefill_stream
        used = end % chunk_tokens
        if not used:
            return 0, 0
        start = end - used
        requests = 0
        for booking in reversed(queue):
            if booking.prefill_end <= start:
                break
            if not booking.prefill_released:
                requests += 1
        return chunk_tokens - used, requests

    def __post_init__(self) -> None:
        if self.shadow not in SHADOW_KINDS:
            raise ValueError(f"shadow must be one of {SHADOW_KINDS}, not {self.shadow!r}")

    @property
    def kv_capacity_tokens(self) -> int:
        """The KV capacity the shadow believes in (feedback may have shrunk it)."""
        return self.blocks.capacity_blocks * self.blocks.block_size

    def estimate_cache_hit(self, blocks: Sequence[int], tokens: bytes | None = None) -> int:
        if self.exact is not None:
            return self.exact(blocks)[0]
        index = self.kv_index
        if index is not None and index.synced and tokens is not None:
            hit = index.estimate(tokens, len(tokens) // 4)
            if hit is not None:
                return hit * self.radix_token_weight
        return self._shadow_hit(blocks, tokens)

    def _shadow_hit(self, blocks: Sequence[int], tokens: bytes | None) -> int:
        """The ``shadow`` one's estimate: the radix tree's given tokens, else the LRU's."""
        if self.shadow == "radix" and self.radix is not None and tokens is not None:
            return self.radix.prefix_length(tokens) * self.radix_token_weight
        return self.blocks.estimate_cache_hit(blocks)

    @property
    def tiered(self) -> bool:
        """Whether the router reads this worker's CPU tier (a shadow, or exactly)."""
        return self.kv_load_s_per_token > 0 and (self.cpu is not None or self.exact is not None)

    def estimate_tiers(self, blocks: Sequence[int], tokens: bytes | None = None) -> tuple[int, int]:
        """(GPU hit, CPU-tier hit) in tokens: the CPU-tier hit is what the worker would load
        after its GPU prefix (:meth:`cpu_after`); 0 without a tier shadow. A KV-event index's
        hit is split as the GPU shadow expects it (:func:`split_by_shadow`)."""
        if self.exact is not None:
            return self.exact(blocks)
        gpu = self.estimate_cache_hit(blocks, tokens)
        cpu = self.cpu_after(blocks, gpu, tokens)
        index = self.kv_index
        if self.cpu is None or index is None or not index.synced or tokens is None:
            return gpu, cpu
        return split_by_shadow(gpu, cpu, self._shadow_hit(blocks, tokens))

    def cpu_after(self, blocks: Sequence[int], gpu_hit: int, tokens: bytes | None = None) -> int:
        """Tokens past a GPU hit of ``gpu_hit`` that the CPU tier holds: as its KV events
        tell (the index, when synced and given ``tokens``), else as its shadow has it."""
        cpu = self.cpu
        if cpu is None:
            return 0
        index = self.kv_index
        if index is not None and index.synced and tokens is not None:
            weight = self.radix_token_weight
            more = index.estimate_cpu(tokens, len(tokens) // 4, gpu_hit // weight)
            if more is not None:
                return more * weight
        size = cpu.block_size
        start = gpu_hit // size
        more = cpu.match_blocks(blocks[start:])
        return max(0, (start + more) * size - gpu_hit) if more else 0

    def book(
        self,
        request: RequestFeatures,
        expected_output_tokens: int = 0,
        now: float | None = None,
        radix_later: bool = False,
    ) -> Booking:
        """Claim this worker for ``request``: counters up, blocks pinned, path locked.

        ``now`` (default: the monotonic clock; the simulator's virtual time) dates the booking
        for the learned rate and the session footprint. ``radix_later``: when the radix tree
        does not answer the estimates (``shadow="blocks"``), leave its insert to
        :meth:`Booking.insert_radix`, for the caller to run once the request is on its way
        (the proxy: after the write to the worker, before its next await, so no pick and no
        other booking comes in between and the outcome is the same).
        """
        if now is None:
            now = time.monotonic()
        blocks_hit = self.blocks.estimate_cache_hit(request.blocks)
        radix_hit = None
        node = None
        radix_pending = None
        if radix_later and self.shadow != "radix" and self.radix is not None:
            radix_pending = request.tokens
        elif self.radix is not None and request.tokens is not None:
            result = self.radix.insert(request.tokens, lock=True)
            radix_hit = min(result.cached_tokens * self.radix_token_weight, request.input_length)
            node = result.node
        size = self.worker_block_size
        exact_tokens = request.tokens is not None and not isinstance(request.tokens, TextBytes)
        if size and exact_tokens:
            # exact tokens: what the worker can report is whole blocks of its own size, and
            # never the prompt's last token (vLLM recomputes it)
            blocks_hit = worker_visible(blocks_hit, request.input_length, size)
            if radix_hit is not None:
                radix_hit = worker_visible(radix_hit, request.input_length, size)
        hit = shadow_hit = (
            radix_hit if self.shadow == "radix" and radix_hit is not None else blocks_hit
        )
        kv_hit = None
        kv_keys: list[int] = []
        index = self.kv_index
        if index is not None and request.tokens is not None:
            kv_hit = index.estimate(request.tokens, request.input_length)
            if kv_hit is not None:
                kv_hit = min(kv_hit * self.radix_token_weight, request.input_length)
                hit = kv_hit
            kv_keys = index.pin(request.tokens)
        cpu_hit = 0
        if self.exact is not None:
            hit, cpu_hit = self.exact(request.blocks)
            hit = min(hit, request.input_length)
            cpu_hit = min(cpu_hit, request.input_length - hit)
        elif self.cpu is not None:
            cpu_hit = self.cpu_after(request.blocks, hit, request.tokens)
            if kv_hit is not None:
                hit, cpu_hit = split_by_shadow(hit, cpu_hit, shadow_hit)
            if cpu_hit:
                total = min(hit + cpu_hit, request.input_length)
                if size and exact_tokens:
                    total = worker_visible(total, request.input_length, size)
                cpu_hit = max(0, total - hit)
            self.cpu.insert(request.blocks)  # write-through: the worker stores what it computes
        new_prefill = max(0, request.input_length - hit - cpu_hit)
        queued_ahead = self.pending_prefill_tokens
        if not queued_ahead:  # a new busy period: its first step starts a chunk
            self.prefill_stream = 0
        self.prefill_stream += new_prefill
        if request.session_id is not None:
            self.footprint.touch(
                request.session_id, request.input_length + expected_output_tokens, now
            )
        self.num_requests += 1
        self.pending_prefill_tokens += new_prefill
        self.ongoing_decode_tokens += expected_output_tokens
        self.held_tokens += request.input_length + expected_output_tokens
        self.blocks.acquire(request.blocks)
        adapter = request.adapter
        if adapter is not None:
            self.adapters.acquire(adapter)
        booking = Booking(
            worker=self,
            blocks=request.blocks,
            radix_node=node,
            new_prefill=new_prefill,
            decode_tokens=expected_output_tokens,
            blocks_estimate=min(blocks_hit, request.input_length),
            radix_estimate=radix_hit,
            kv_estimate=kv_hit,
            kv_keys=kv_keys,
            input_length=request.input_length,
            booked_at=now,
            queued_ahead=queued_ahead,
            radix_pending=radix_pending,
            adapter=adapter,
            cpu_estimate=cpu_hit,
            gpu_estimate=min(hit, request.input_length),
            prefill_end=self.prefill_stream,
        )
        booking.cost_entry = self.cost.book(
            new_prefill,
            request.input_length - new_prefill,
            request.input_length,
            expected_output_tokens,
            now,
        )
        if new_prefill:
            self.prefill_queue.append(booking)
        return booking


def split_by_shadow(gpu: int, cpu: int, shadow_gpu: int) -> tuple[int, int]:
    """The KV-event index's (GPU, CPU-tier) hit, split as the GPU shadow expects it.

    The index is exact about what the worker holds in either tier, but learns of a GPU
    eviction only when its event arrives, while the worker may be evicting right now (a turn
    that just ended, pushed out by the requests admitted in the same engine step); the shadow
    evicts as it books. What the shadow no longer holds on the GPU is in the CPU tier (it is
    written through), so the total stays the index's."""
    if shadow_gpu < gpu:
        return shadow_gpu, cpu + gpu - shadow_gpu
    return gpu, cpu


def worker_visible(hit: int, input_length: int, block_size: int) -> int:
    """A hit estimate as a block-hashing worker would count it: whole ``block_size`` blocks,
    at most ``input_length - 1`` tokens (vLLM always computes the last prompt token)."""
    return min(hit, max(0, input_length - 1)) // block_size * block_size


@dataclass(eq=False)
class Booking:
    """One request's claim on one worker; releases each part exactly once."""

    worker: WorkerState
    blocks: Sequence[int]
    radix_node: TreeNode | None
    new_prefill: int
    decode_tokens: int
    blocks_estimate: int
    radix_estimate: int | None
    prefill_released: bool = False
    finished: bool = False
    reported_cached: int | None = None
    kv_estimate: int | None = None  # the KV-event index's estimate (None: it could not tell)
    kv_keys: list[int] = field(default_factory=list)  # pinned in the index until finish
    input_length: int = 0
    booked_at: float = 0.0
    queued_ahead: int = 0  # prefill tokens pending on the worker when this was booked
    first_token_at: float | None = None
    ttft_valid: bool = True  # False: the first byte is not the first token (not streamed)
    radix_pending: bytes | None = None  # tokens whose radix insert book(radix_later) left
    adapter: str | None = None  # the LoRA adapter it runs (released from the worker's slots)
    cpu_estimate: int = 0  # tokens the CPU tier's shadow expected the worker to load
    gpu_estimate: int = 0  # the GPU hit that priced it (the active estimate, split by tier)
    prefill_end: int = 0  # where its prefill ends in the worker's busy period (prefill_stream)
    cost_entry: CostEntry | None = None  # the cost model's count of it (its prediction)

    @property
    def cached_blocks(self) -> int:
        """Whole router blocks of the prompt it was booked expecting cached (either tier)."""
        return (self.input_length - self.new_prefill) // self.worker.blocks.block_size

    def insert_radix(self) -> None:
        """The radix insert :meth:`WorkerState.book` left for later (once; no-op otherwise):
        the path is inserted and locked, and the radix estimate set, as ``book`` would have."""
        tokens = self.radix_pending
        tree = self.worker.radix
        if tokens is None or tree is None:
            return
        self.radix_pending = None
        worker = self.worker
        result = tree.insert(tokens, lock=True)
        self.radix_node = result.node
        hit = min(result.cached_tokens * worker.radix_token_weight, self.input_length)
        size = worker.worker_block_size
        if size and not isinstance(tokens, TextBytes):
            hit = worker_visible(hit, self.input_length, size)
        self.radix_estimate = hit

    def first_token(self, now: float | None = None) -> None:
        """The worker started answering: its prefill of this request is done."""
        if not self.prefill_released:
            self.first_token_at = time.monotonic() if now is None else now
            self.worker.prefill_since = self.first_token_at  # the next one's began
            self._release_prefill()
            if self.cost_entry is not None:
                self.worker.cost.first_token(self.cost_entry, self.first_token_at)

    def _release_prefill(self) -> None:
        if not self.prefill_released:
            self.prefill_released = True
            worker = self.worker
            worker.pending_prefill_tokens -= self.new_prefill
            queue = worker.prefill_queue  # bounded by the bookings in flight, whatever picker
            while queue and queue[0].prefill_released:
                queue.popleft()

    def finish(self) -> bool:
        """Release everything still held; True the first time, False afterwards."""
        if self.finished:
            return False
        self.insert_radix()  # the tree ends as if it had been inserted at booking
        self.finished = True
        self._release_prefill()  # no first token came (an error, a client gone): no time
        worker = self.worker
        worker.num_requests -= 1
        worker.ongoing_decode_tokens -= self.decode_tokens
        worker.held_tokens -= self.input_length + self.decode_tokens
        worker.blocks.release(self.blocks)
        if self.radix_node is not None and worker.radix is not None:
            worker.radix.refresh(self.radix_node)  # used until now, as SGLang counts it
            worker.radix.dec_lock_ref(self.radix_node)
        if self.kv_keys and worker.kv_index is not None:
            worker.kv_index.unpin(self.kv_keys)
        if self.adapter is not None:
            worker.adapters.release(self.adapter)
        if self.cost_entry is not None:
            worker.cost.finish(self.cost_entry)
        return True

    def report_cached(self, cached_tokens: int, cpu_cached_tokens: int | None = None) -> None:
        """Record the worker's own count of prompt tokens it found cached (once), in both
        tiers; ``cpu_cached_tokens``: those it loaded from its CPU tier, where it says.

        Each shadow's estimate is scored with the CPU tier's estimate added: the worker
        counts what it loads as cached (vLLM's ``num_cached_tokens`` includes the
        connector's tokens)."""
        if self.reported_cached is not None or cached_tokens < 0:
            return
        self.reported_cached = cached_tokens
        acc = self.worker.accuracy
        cpu = self.cpu_estimate
        acc.requests += 1
        acc.reported_tokens += cached_tokens
        acc.blocks_estimate_tokens += self.blocks_estimate + cpu
        acc.blocks_abs_error_tokens += abs(self.blocks_estimate + cpu - cached_tokens)
        acc.prompt_tokens += self.input_length
        if self.kv_estimate is not None:
            acc.kv_requests += 1
            acc.kv_prompt_tokens += self.input_length
            acc.kv_reported_tokens += cached_tokens
            total = self.gpu_estimate + cpu  # the index's, split (split_by_shadow)
            acc.kv_estimate_tokens += total
            acc.kv_abs_error_tokens += abs(total - cached_tokens)
        if self.radix_estimate is not None:
            acc.radix_estimate_tokens += self.radix_estimate + cpu
            acc.radix_abs_error_tokens += abs(self.radix_estimate + cpu - cached_tokens)
        if cpu_cached_tokens is not None and 0 <= cpu_cached_tokens <= cached_tokens:
            gpu_estimate = self.gpu_estimate
            acc.tier_requests += 1
            acc.tier_prompt_tokens += self.input_length
            acc.cpu_reported_tokens += cpu_cached_tokens
            acc.cpu_estimate_tokens += cpu
            acc.cpu_abs_error_tokens += abs(cpu - cpu_cached_tokens)
            acc.gpu_abs_error_tokens += abs(gpu_estimate - (cached_tokens - cpu_cached_tokens))
        clean = self.ttft_valid and self.first_token_at is not None
        if clean and not cpu and not cpu_cached_tokens and self.cost_entry is not None:
            # the prediction it was booked on had the queue ahead in it: every streamed
            # answer scores it (a load from the CPU tier is not in it)
            self.worker.cost.observe(self.cost_entry, self.first_token_at - self.booked_at)
        if clean and not self.queued_ahead and not cpu and not cpu_cached_tokens:
            # a clean sample: nothing was queued ahead, so the wait was this request's own
            # uncached prefill (a queue's partly done prefill would read as a faster worker;
            # a load from the CPU tier is not prefill)
            work = max(0, self.input_length - cached_tokens)
            self.worker.rate.observe(work, self.first_token_at - self.booked_at)

"""A model of one inference worker: continuous batching over a real radix KV cache.

Used in virtual time by the offline simulator and in real time by the simulated worker
server. The KV cache is :class:`router.cache.radix_tree.RadixTree` (the same module as the router's
shadow) over whole 512-token blocks: traces describe prompts by block keys, so a block is
the unit of caching and of memory (``page_size=2``, two uint32 pseudo-tokens per 64-bit key).

One engine step (vLLM / SGLang style, all numbers configurable, defaults are assumptions):

- *Admission* at a step boundary, first come first served: a waiting request's cached prefix
  is matched and locked; it needs blocks for its uncached prompt blocks plus its tail and
  output; unlocked cached blocks are evicted (policy order) to make room; if it still does
  not fit, it and everyone behind it wait (locked tokens are not evictable). A request that
  could never fit is admitted alone on an otherwise empty worker.
- *Prefill* is chunked: a step carries at most ``chunk_tokens`` uncached prompt tokens,
  taken from running requests in admission order; cost ``tokens / prefill_tokens_per_s``.
  A block is cached for other requests once the step computing it is scheduled (vLLM
  caches a request's full blocks as it schedules their tokens), not when the request holding
  it is admitted: a request's cached prefix is taken again when its first chunk is
  scheduled, and a block whose chunk is not scheduled yet is computed again by whoever
  starts first (under priority scheduling a later request can).
- *Order*: ``scheduling_policy="fcfs"`` (vLLM's default) admits and prefills in arrival
  order. ``"priority"`` (vLLM's ``--scheduling-policy priority``) orders the waiting queue
  and the admitted requests whose prefill has not started by ``(priority, arrival)``, lower
  first; a prefill under way keeps its place (vLLM V1 schedules its running requests before
  any waiting one), so no request is preempted for another.
- *Decode*: every request past prefill gets one token per step; a step costs
  ``step_overhead_s + decode_s_per_seq * batch``.
- With a GPU profile (``WorkerModelConfig.profile``, :mod:`traces.sim.gpu_profile`, measured on
  real GPUs) the same steps are priced by their work instead: each chunk of ``s`` tokens after
  ``p`` already in the cache (cached or computed by earlier chunks) costs
  ``a*s + c*(s*p + s**2/2)``, a step that carries prefill ``d`` once more; a decode step costs
  ``base + per_sequence*batch + per_context_token*context``, ``context`` every running
  sequence's prompt and output so far; a step that carries both costs
  ``max(d + chunks, base) + the decode's context terms`` (one forward pass: the chunks'
  compute covers the weight reads a decode-only step waits for). CPU-tier loads move at
  the profile's measured copy rate for their pieces.
- A request's first token comes at the end of the step that finishes its prefill; its blocks
  stay cached, unlocked, after it finishes, until evicted. Its finish counts as a use of its
  prompt's blocks (SGLang re-inserts a finished request's tokens, vLLM frees its blocks to
  the free queue's tail), so eviction follows the last use, not the admission.

Defaults describe one plausible deployment: an 8B-class model on one 80 GB GPU, about 15k
prefill tokens/s, decode steps of 12 ms plus 0.15 ms per running sequence (about 14 ms at 16
sequences, 27 ms at 100), 256k tokens of KV cache (about 32 GB at 128 KiB per token).

KV events (``events=True``): the model records what vLLM / SGLang publish with
``--kv-events-config``: ``BlockStored`` for the blocks a request adds to the cache at
admission (``block_hashes`` the block keys, ``parent_block_hash`` the key before them),
``BlockRemoved`` for every evicted node's keys, and ``AllBlocksCleared`` at
:meth:`WorkerModel.reset_cache`, in the order they happen; :meth:`WorkerModel.take_events`
hands them over (one batch per engine step, as the engines publish them). A request with
its prompt's token ids (``SimRequest.tokens``, the live sim worker) stores its blocks as an
engine does: ``token_ids`` the ids, ``block_size`` 512; without them (the offline
simulator) ``token_ids`` are the keys' pseudo-tokens and ``block_size`` 2, which the
simulator's requests use too.

LoRA adapters (vLLM V1's scheduler): a request may name an adapter (``SimRequest.adapter``;
None is the base model). Its blocks are keyed under the adapter
(:func:`router.cache.lora.adapter_blocks`), so the base model's blocks and other adapters'
are never a hit for it. A batch runs at most ``max_loras`` distinct adapters: a waiting
request whose adapter is not running while every slot runs another one is skipped (the
requests behind it may go first) until one drains. The GPU keeps up to ``max_loras``
adapters resident; admitting one that is not resident loads it in place of the least
recently used idle one (a swap, counted in ``WorkerStats.lora_swaps``), and each load adds
``lora_load_s`` to the engine step that follows (vLLM loads adapters before the forward pass).

Disaggregated serving: a prefill worker's request is an ordinary one with one output token;
a decode worker's (``SimRequest.kv_transferred``) arrives with its prompt's KV already
transferred (the caller waits out the transfer first), so it takes memory and enters the
cache but computes no prompt token: its first token comes one step after admission.

Decode-only stretches are simulated in one event: while nothing is waiting and no prefill
is pending, the batch only changes when a request finishes, so the model jumps straight to
that step (or to the step boundary after an arrival). A long trace thus costs a few events
per request, not one per decode step. Under a profile the steps of a stretch grow by
``per_context_token * batch`` each (every sequence one token longer), an arithmetic series
the model sums and inverts in closed form; the batch's context is a running sum (each
sequence's prompt and the step it started decoding at), so no step loops over sequences.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from router.cache.block_hash import KEY_TOKENS, TOKEN_BYTES, keys_as_tokens
from router.cache.block_lru import BlockLRU
from router.cache.cost_profile import FLAT_KV_LOAD_GBPS
from router.cache.lora import adapter_blocks
from router.cache.radix_tree import RadixTree, TreeNode
from router.validation import (
    COUNT,
    MAX_TOKENS,
    MILLISECONDS_OR_OFF,
    POSITIVE,
    TOKENS,
    TOKENS_OR_OFF,
    integer,
)
from traces.sim import gpu_profile, kv_transfer
from traces.sim.gpu_profile import GpuProfile
from traces.trace.record import BLOCK_TOKENS

KV_TOKENS = integer(BLOCK_TOKENS, MAX_TOKENS)
"""A worker's KV capacity: at least one block."""
SCHEDULING_POLICIES = ("fcfs", "priority")
"""The engine's order for waiting requests (vLLM's ``--scheduling-policy``)."""


@dataclass(frozen=True)
class WorkerModelConfig:
    """Engine and GPU assumptions; see the module docstring for where defaults come from."""

    kv_capacity_tokens: int = 262_144
    chunk_tokens: int = 8192
    prefill_tokens_per_s: float = 15_000.0
    step_overhead_s: float = 0.012
    decode_s_per_seq: float = 0.00015
    max_running: int = 256
    eviction_policy: str = "lru"
    scheduling_policy: str = "fcfs"  # or "priority" (SCHEDULING_POLICIES)
    max_loras: int = 1  # distinct LoRA adapters in one batch and resident (vLLM's default)
    lora_load_s: float = 0.05  # loading an adapter into a GPU slot (a swap)
    cpu_kv_capacity_tokens: int = 0  # the host-memory KV tier (0: none)
    kv_load_gbps: float = FLAT_KV_LOAD_GBPS  # host to GPU, GB/s (1e9 bytes)
    kv_bytes_per_token: int = kv_transfer.BYTES_PER_TOKEN  # all layers
    # measured step costs (traces/sim/gpu_profile.py); None: the flat rates above price prefill,
    # decode and CPU-tier loads. Default: gpu_profile.DEFAULT_PROFILE, the measured H100 8B
    profile: GpuProfile | None = field(default_factory=gpu_profile.default_profile)

    def __post_init__(self) -> None:
        if self.cpu_kv_capacity_tokens < 0 or self.kv_bytes_per_token < 0:
            raise ValueError("the CPU tier's capacity and the KV bytes per token must be >= 0")
        if not self.kv_load_gbps > 0:
            raise ValueError("the KV load bandwidth must be > 0")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}")

    @property
    def capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // BLOCK_TOKENS

    @property
    def cpu_capacity_blocks(self) -> int:
        return self.cpu_kv_capacity_tokens // BLOCK_TOKENS

    def load_s(self, tokens: int) -> float:
        """Seconds to load ``tokens`` tokens' KV from the CPU tier into the GPU."""
        if self.profile is not None:
            return self.profile.load_s(tokens)
        return tokens * self.kv_bytes_per_token / (self.kv_load_gbps * 1e9)

    @property
    def prefill_step_s(self) -> float:
        """The fixed cost of an engine step that carries prefill (and no decode)."""
        return self.step_overhead_s if self.profile is None else self.profile.d

    def prefill_work_s(self, tokens: Any, cached: Any = 0) -> Any:
        """The prefill of ``tokens`` new tokens after ``cached`` ones, less the steps' fixed
        costs (scalars or numpy arrays): chunking it adds :attr:`prefill_step_s` per step."""
        if self.profile is None:
            return tokens / self.prefill_tokens_per_s
        return self.profile.prefill_work_s(tokens, cached)

    def step_s(self, prefill_s: float | None, batch: int, context: int = 0) -> float:
        """One engine step: chunks of ``prefill_s`` work (:meth:`prefill_work_s`; None: no
        prefill) beside a decode batch of ``batch`` sequences holding ``context`` tokens."""
        p = self.profile
        if p is None:
            step = self.step_overhead_s + self.decode_s_per_seq * batch
            return step if prefill_s is None else step + prefill_s
        if prefill_s is None:
            return p.decode_step_s(batch, context)
        decode = p.decode_per_sequence * batch + p.decode_per_context_token * context
        return max(p.d + prefill_s, p.decode_base if batch else 0.0) + decode

    def decode_step_s(self, batch: int, context: int = 0) -> float:
        """A decode-only step of ``batch`` sequences holding ``context`` tokens in all."""
        return self.step_s(None, batch, context)

    def decode_growth_s(self, batch: int) -> float:
        """How much longer each decode step of a stretch gets than the one before (each
        sequence one token longer); 0 for the flat model."""
        return 0.0 if self.profile is None else self.profile.decode_per_context_token * batch


def add_model_options(p: argparse.ArgumentParser, kv_help: str) -> None:
    """The worker model's flags, shared by ``simulate`` (and ``demo``) and ``sim-worker``."""
    d = WorkerModelConfig()
    p.add_argument(
        "--kv-capacity-tokens", type=KV_TOKENS, default=d.kv_capacity_tokens, help=kv_help
    )
    p.add_argument(
        "--prefill-tokens-per-s",
        type=POSITIVE,
        default=d.prefill_tokens_per_s,
        help="prefill throughput for uncached prompt tokens",
    )
    p.add_argument(
        "--step-overhead-ms",
        type=MILLISECONDS_OR_OFF,
        default=d.step_overhead_s * 1000,
        help="fixed cost of one engine step",
    )
    p.add_argument(
        "--decode-ms-per-seq",
        type=MILLISECONDS_OR_OFF,
        default=d.decode_s_per_seq * 1000,
        help="added step cost per running sequence",
    )
    p.add_argument(
        "--chunk-tokens",
        type=TOKENS,
        default=d.chunk_tokens,
        help="prefill tokens per step (chunked prefill)",
    )
    p.add_argument(
        "--max-loras",
        type=COUNT,
        default=d.max_loras,
        help="LoRA adapters in one batch and resident on the GPU (vLLM's --max-loras)",
    )
    p.add_argument(
        "--lora-load-ms",
        type=MILLISECONDS_OR_OFF,
        default=d.lora_load_s * 1000,
        help="cost of loading a LoRA adapter that is not resident (one swap)",
    )
    p.add_argument(
        "--cpu-kv-capacity-tokens",
        type=TOKENS_OR_OFF,
        default=d.cpu_kv_capacity_tokens,
        help="a host-memory KV tier of this many tokens beneath the GPU's (vLLM's "
        "OffloadingConnector, LMCache's CPU backend): every computed block is stored there "
        "too, and a prefix found there is loaded instead of recomputed (0: no tier)",
    )
    p.add_argument(
        "--kv-load-gbps",
        type=POSITIVE,
        default=d.kv_load_gbps,
        help="CPU tier to GPU KV load bandwidth, GB/s (1e9 bytes); a token's KV is "
        "--kv-bytes-per-token",
    )
    p.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default=d.scheduling_policy,
        help="the engine's order for waiting requests (vLLM's --scheduling-policy): fcfs, "
        "or priority (lower 'priority' first, then arrival; requests without one are 0; "
        "with it the ttft picker's router sets each request's priority)",
    )
    add_profile_option(p)


def add_profile_option(p: argparse.ArgumentParser, whose: str = "") -> None:
    """``--gpu-profile``: the measured step costs (also ``sweep``'s, for its sim workers:
    ``whose`` says so in the help)."""
    names = ", ".join(gpu_profile.profile_names())
    p.add_argument(
        "--gpu-profile",
        type=parse_profile,
        action=_NamedProfile,
        default=gpu_profile.DEFAULT_PROFILE,
        metavar="NAME|FILE",
        help=f"{whose}price prefill chunks, decode steps and CPU-tier loads as measured on a GPU: "
        f"one of {names}, or a profile JSON file (bench/gpu/README.md); 'flat': the flat "
        "model of --prefill-tokens-per-s, --step-overhead-ms, --decode-ms-per-seq and "
        "--kv-load-gbps, which a profile replaces (one of those flags without --gpu-profile "
        "means flat)",
    )
    p.set_defaults(gpu_profile_named=False)


class _NamedProfile(argparse.Action):
    """``--gpu-profile`` stored, and noted as named (``gpu_profile_named``): a flat-model
    flag without it means the flat model, beside it is refused (:func:`args_profile`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.gpu_profile_named = True


def parse_profile(text: str) -> GpuProfile | None:
    """A profile option's value (``--gpu-profile``, ``--cost-profile``) loaded: a shipped
    name, a file, or ``flat`` (None); argparse reports a bad one in one line."""
    try:
        return gpu_profile.resolve(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


FLAT_FLAGS = {
    "prefill_tokens_per_s": "--prefill-tokens-per-s",
    "step_overhead_s": "--step-overhead-ms",
    "decode_s_per_seq": "--decode-ms-per-seq",
    "kv_load_gbps": "--kv-load-gbps",
}
"""The flat model's flags (``WorkerModelConfig`` field: flag), which a GPU profile replaces."""


def model_config_from_args(args: argparse.Namespace, **more: Any) -> WorkerModelConfig:
    """The :class:`WorkerModelConfig` of :func:`add_model_options`' flags (and ``more``): a
    flat-model flag without ``--gpu-profile`` means the flat model (the flags of the flat
    model keep their meaning); ValueError when one is set beside a named GPU profile, which
    would ignore it."""
    profile = args_profile(args)
    given = _flat_flags_given(args)
    if profile is not None and given:
        raise ValueError(
            f"{', '.join(given)} prices the flat model, which --gpu-profile "
            f"{profile.source} replaces: give --gpu-profile flat with it, or neither"
        )
    return _model_config(args, profile, **more)


def _flat_flags_given(args: argparse.Namespace) -> list[str]:
    """The flat model's flags set to other than their defaults."""
    if not hasattr(args, "prefill_tokens_per_s"):
        return []
    config, defaults = _model_config(args, None), WorkerModelConfig(profile=None)
    return [flag for f, flag in FLAT_FLAGS.items() if getattr(config, f) != getattr(defaults, f)]


def _model_config(
    args: argparse.Namespace, profile: GpuProfile | None, **more: Any
) -> WorkerModelConfig:
    return WorkerModelConfig(
        kv_capacity_tokens=args.kv_capacity_tokens,
        chunk_tokens=args.chunk_tokens,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        step_overhead_s=args.step_overhead_ms / 1000,
        decode_s_per_seq=args.decode_ms_per_seq / 1000,
        max_loras=args.max_loras,
        lora_load_s=args.lora_load_ms / 1000,
        cpu_kv_capacity_tokens=args.cpu_kv_capacity_tokens,
        kv_load_gbps=args.kv_load_gbps,
        scheduling_policy=getattr(args, "scheduling_policy", "fcfs"),
        kv_bytes_per_token=getattr(args, "kv_bytes_per_token", kv_transfer.BYTES_PER_TOKEN),
        profile=profile,
        **more,
    )


def args_profile(args: argparse.Namespace) -> GpuProfile | None:
    """``args.gpu_profile`` as parsed (a name or file when set by hand; the default if none);
    None (flat) when it was not named and a flat-model flag was given."""
    if not getattr(args, "gpu_profile_named", True) and _flat_flags_given(args):
        return None
    return as_profile(getattr(args, "gpu_profile", gpu_profile.DEFAULT_PROFILE))


def as_profile(value: str | GpuProfile | None) -> GpuProfile | None:
    """A profile option's value as parsed (:func:`parse_profile`), or its text when set on a
    namespace by hand."""
    return gpu_profile.resolve(value) if isinstance(value, str) else value


def model_argv(config: WorkerModelConfig) -> list[str]:
    """:func:`add_model_options`' flags for ``config`` (a sim worker started to match it)."""
    return [
        "--kv-capacity-tokens", str(config.kv_capacity_tokens),
        "--prefill-tokens-per-s", repr(config.prefill_tokens_per_s),
        "--step-overhead-ms", repr(config.step_overhead_s * 1000),
        "--decode-ms-per-seq", repr(config.decode_s_per_seq * 1000),
        "--chunk-tokens", str(config.chunk_tokens),
        "--max-loras", str(config.max_loras),
        "--lora-load-ms", repr(config.lora_load_s * 1000),
        "--cpu-kv-capacity-tokens", str(config.cpu_kv_capacity_tokens),
        "--kv-load-gbps", repr(config.kv_load_gbps),
        "--kv-bytes-per-token", str(config.kv_bytes_per_token),
        "--gpu-profile", profile_arg(config.profile),
        "--scheduling-policy", config.scheduling_policy,
    ]  # fmt: skip


def profile_arg(profile: GpuProfile | None) -> str:
    """``--gpu-profile``'s value that loads ``profile`` again (flat for None)."""
    return gpu_profile.FLAT if profile is None else profile.source


@dataclass(eq=False)
class SimRequest:
    """A request inside a worker model; times are the model's clock."""

    blocks: tuple[int, ...]
    input_length: int
    output_length: int
    tag: object = None  # the caller's handle (booking, HTTP waiter...)
    tokens: bytes | None = None  # the prompt's token ids (uint32 LE), for KV events
    adapter: str | None = None  # the LoRA adapter it runs (None: the base model)
    priority: int = 0  # lower first, under the "priority" scheduling policy
    # disaggregated decode: the prompt's KV came from a prefill worker, so no prompt token is
    # computed here (the blocks still take memory and enter this worker's cache)
    kv_transferred: bool = False
    cached_tokens: int = 0  # found cached, in either tier (what the engine reports)
    cpu_cached_tokens: int = 0  # of those, loaded from the CPU tier
    ready_at: float = 0.0  # its CPU-tier blocks are on the GPU (it may prefill) from then
    loading: tuple[int, ...] = ()  # CPU-tier blocks pinned while they load
    prefill_left: int = 0
    started: bool = False  # a prefill chunk of it has been planned (it keeps its place)
    computed_blocks: int = 0  # leading prompt blocks cached or scheduled for computing
    order: tuple[int, int] = (0, 0)  # (priority, arrival number): the priority policy's key
    extra_blocks: int = 0  # tail of the prompt + output, not in the tree
    node: TreeNode | None = None
    finish_at: int = 0  # the worker's decode counter value when this request is done
    first_token_time: float | None = None
    finish_time: float | None = None


@dataclass
class WorkerStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cpu_cached_tokens: int = 0  # of cached_tokens, loaded from the CPU tier
    cpu_loads: int = 0  # requests that loaded blocks from the CPU tier
    cpu_stored_blocks: int = 0  # blocks written to the CPU tier
    finished: int = 0
    lora_swaps: int = 0  # adapters loaded into a slot (not resident when admitted)


OnFirstToken = Callable[[SimRequest, float], None]
OnFinish = Callable[[SimRequest, float], None]


class ModelObserver(Protocol):
    """Sees a worker model's requests arrive, take their cached prefix and end their prefill
    (the hit-gap ledger, :mod:`traces.sim.miss_causes`, reads the fleet's caches then)."""

    def submitted(self, req: SimRequest) -> None: ...

    def admitted(self, req: SimRequest, hit_blocks: int) -> None:
        """``req`` is admitted with its first ``hit_blocks`` blocks cached (either tier)."""

    def prefilled(self, req: SimRequest) -> None: ...


class WorkerModel:
    """One worker: a waiting queue, a running batch and a radix KV cache of blocks.

    The owner drives it with :meth:`submit` and :meth:`advance`, and schedules a wake-up at
    :attr:`next_event` (``None`` when idle). Callbacks fire at the model time they happen.
    """

    def __init__(
        self,
        config: WorkerModelConfig | None = None,
        on_first_token: OnFirstToken | None = None,
        on_finish: OnFinish | None = None,
        events: bool = False,
    ) -> None:
        self.config = config or WorkerModelConfig()
        self.cache = RadixTree(page_size=KEY_TOKENS, policy=self.config.eviction_policy)
        self.events: list[dict[str, Any]] | None = [] if events else None
        if events:
            self.cache.on_evict = self._evicted
        # the CPU tier: block keys, least recently used first, pins for blocks being loaded
        self.cpu: BlockLRU | None = None
        if self.config.cpu_kv_capacity_tokens > 0:
            on_evict = self._cpu_evicted if events else None
            self.cpu = BlockLRU(self.config.cpu_capacity_blocks, BLOCK_TOKENS, on_evict)
        self.loading: list[SimRequest] = []  # admitted, CPU-tier blocks still loading
        self.link_free_at = 0.0  # the host to GPU link is busy with earlier loads until then
        self.on_first_token = on_first_token or (lambda r, t: None)
        self.on_finish = on_finish or (lambda r, t: None)
        self.observer: ModelObserver | None = None
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: deque[SimRequest] = deque()  # admitted, prefill not done
        # blocks in the cache whose prefill chunk is not scheduled yet: the request that
        # computes them (a block is cached for others once its chunk is scheduled)
        self.pending: dict[int, SimRequest] = {}
        self.decoding: list[tuple[int, int, SimRequest]] = []  # heap by finish_at
        # the decoding batch's context tokens at decode counter D are this + D * batch: each
        # sequence adds its prompt and output less the counter it finishes at
        self._context_base = 0
        self._seq = 0
        self._arrivals = 0  # requests submitted (the priority policy's tie-break)
        self._priority = self.config.scheduling_policy == "priority"
        self.decode_counter = 0
        self.extra_blocks = 0
        self.stats = WorkerStats()
        # the step in flight: start time, duration, steps, prefill plan
        self.next_event: float | None = None
        self.version = 0  # bumped whenever next_event changes (stale wake-ups are ignored)
        self._span_start = 0.0
        self._span_step = 0.0  # the first step's length; each next one _span_growth longer
        self._span_growth = 0.0
        self._span_steps = 0
        self._prefill_plan: list[tuple[SimRequest, int]] = []
        # LoRA: adapters resident on the GPU (least recently used first), those running
        # (requests admitted and not finished), loads the next step pays for
        self.loras: OrderedDict[str, None] = OrderedDict()
        self.lora_running: dict[str, int] = {}
        self._lora_loads = 0

    # ---- introspection -----------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def used_blocks(self) -> int:
        return self.cache.total_tokens // KEY_TOKENS + self.extra_blocks

    @property
    def decode_context(self) -> int:
        """The decoding batch's context tokens for its next step (prompts and output so far)."""
        return self._context_base + self.decode_counter * len(self.decoding)

    def decode_step_s(self) -> float:
        """What a decode-only step of the batch costs now (the sim worker paces tokens by it)."""
        return self.config.decode_step_s(max(1, len(self.decoding)), self.decode_context)

    def waiting_adapters(self) -> list[str]:
        """The adapters of waiting requests, in queue order, once each."""
        return list(dict.fromkeys(r.adapter for r in self.waiting if r.adapter is not None))

    def kv_usage(self) -> float:
        return min(1.0, self.used_blocks / max(1, self.config.capacity_blocks))

    def cached_prefix_blocks(self, blocks: Sequence[int]) -> int:
        """Leading ``blocks`` in the KV cache now (a lookup: no split, no lock, no touch)."""
        return self.cache.prefix_length(keys_as_tokens(blocks)) // KEY_TOKENS

    def cpu_prefix_blocks(self, blocks: Sequence[int], gpu_blocks: int) -> int:
        """Blocks after the first ``gpu_blocks`` that the CPU tier holds, consecutively
        (what a request would load; 0 without a tier)."""
        if self.cpu is None:
            return 0
        return self.cpu.match_blocks(blocks[gpu_blocks:])

    def take_events(self) -> list[dict[str, Any]]:
        """The KV events recorded since the last call (empty without ``events=True``)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    def _evicted(self, key: bytes) -> None:
        keys = np.frombuffer(key, dtype="<u8").tolist()
        self.events.append({"type": "BlockRemoved", "block_hashes": keys, "medium": "GPU"})

    def _cpu_evicted(self, block: int) -> None:
        self.events.append({"type": "BlockRemoved", "block_hashes": [block], "medium": "CPU"})

    def reset_cache(self) -> None:
        """Drop every cached block (the caller checks nothing runs), as an engine's reset,
        in both tiers."""
        self.cache.reset()
        if self.cpu is not None:
            self.cpu.clear()
        if self.events is not None:
            self.events.append({"type": "AllBlocksCleared"})

    def _stored(self, req: SimRequest, hit_blocks: int) -> None:
        blocks = req.blocks
        new = blocks[hit_blocks:]
        if not new:
            return
        lora = {"lora_name": req.adapter} if req.adapter is not None else {}
        if req.tokens is not None:  # the engine's view: the blocks' token ids
            step = BLOCK_TOKENS * TOKEN_BYTES
            ids = req.tokens[hit_blocks * step : len(blocks) * step]
            size = BLOCK_TOKENS
        else:  # the simulator's: the keys' pseudo-tokens (as its requests carry)
            ids, size = keys_as_tokens(new), KEY_TOKENS
        self.events.append(
            {
                "type": "BlockStored",
                "block_hashes": list(new),
                "parent_block_hash": blocks[hit_blocks - 1] if hit_blocks else None,
                "token_ids": np.frombuffer(ids, dtype="<u4").tolist(),
                "block_size": size,
                "medium": "GPU",
                **lora,
            }
        )

    # ---- driving -----------------------------------------------------------------------

    def submit(self, request: SimRequest, now: float) -> None:
        """A request arrives at ``now``; it joins at the next step boundary."""
        if request.adapter is not None:  # its blocks live in the adapter's own cache
            request.blocks = tuple(adapter_blocks(request.blocks, request.adapter))
        if self._priority:
            request.order = (request.priority, self._arrivals)
            self._arrivals += 1
            bisect.insort(self.waiting, request, key=_order)
        else:
            self.waiting.append(request)
        if self.observer is not None:
            self.observer.submitted(request)
        if self.next_event is None or (
            self._span_steps == 0 and not self._prefill_plan and self.next_event > now
        ):  # idle, or only waiting for a load to end: start a step right away
            self._span_start, self._span_step, self._span_steps = now, 0.0, 0
            self._span_growth = 0.0
            self._prefill_plan = []
            self._wake_at(now)
        elif self._span_steps > 1:  # in a decode-only stretch: stop at the next boundary
            done = self._steps_until(now - self._span_start)
            if done < self._span_steps:
                self._span_steps = done
                self._wake_at(self._span_start + self._steps_s(done))

    def _steps_s(self, k: int) -> float:
        """The first ``k`` steps of the stretch in flight, in seconds."""
        if self._span_growth == 0.0:
            return k * self._span_step
        return k * self._span_step + self._span_growth * (k * (k - 1) // 2)

    def _steps_until(self, elapsed: float) -> int:
        """The fewest steps (>= 1) of the stretch in flight that take ``elapsed`` or more."""
        step, growth = self._span_step, self._span_growth
        if growth == 0.0:
            return max(1, math.ceil(elapsed / step - 1e-12))
        # k*step + growth*k*(k-1)/2 >= elapsed: the quadratic's root, then exact steps
        half = step - growth / 2
        k = max(1, math.ceil((math.sqrt(half * half + 2 * growth * elapsed) - half) / growth))
        tol = 1e-12 * max(1.0, elapsed)
        while k > 1 and self._steps_s(k - 1) >= elapsed - tol:
            k -= 1
        while self._steps_s(k) < elapsed - tol:
            k += 1
        return k

    def advance(self, now: float) -> None:
        """Handle the step boundary at ``now`` (== :attr:`next_event`): complete the step,
        admit waiting requests, plan the next step."""
        self._complete_span(now)
        self._admit(now)
        self._plan(now)

    # ---- internals ---------------------------------------------------------------------

    def _complete_span(self, now: float) -> None:
        for req, tokens in self._prefill_plan:
            req.prefill_left -= tokens
        finished_prefill = [r for r, _ in self._prefill_plan if r.prefill_left == 0]
        self._prefill_plan = []
        self.decode_counter += self._span_steps
        while self.decoding and self.decoding[0][0] <= self.decode_counter:
            req = heapq.heappop(self.decoding)[2]
            self._context_base -= req.input_length + req.output_length - req.finish_at
            self._finish(req, now)
        for req in finished_prefill:
            self.prefilling.remove(req)
            if self.observer is not None:
                self.observer.prefilled(req)
            self._store_cpu(req)
            req.first_token_time = now
            self.on_first_token(req, now)
            if req.output_length <= 1:
                self._finish(req, now)
            else:
                req.finish_at = self.decode_counter + req.output_length - 1
                # its next step's context: the prompt and one token, one more each step
                self._context_base += req.input_length + req.output_length - req.finish_at
                self._seq += 1
                heapq.heappush(self.decoding, (req.finish_at, self._seq, req))

    def _finish(self, req: SimRequest, now: float) -> None:
        req.finish_time = now
        self.extra_blocks -= req.extra_blocks
        adapter = req.adapter
        if adapter is not None:
            left = self.lora_running[adapter] - 1
            if left:
                self.lora_running[adapter] = left
            else:
                del self.lora_running[adapter]
            self.loras.move_to_end(adapter)  # last used now
        if req.node is not None:
            self.cache.refresh(req.node)  # last used now, as the engines order eviction
            self.cache.dec_lock_ref(req.node)
            req.node = None
        self.stats.finished += 1
        self.on_finish(req, now)

    def _admit(self, now: float) -> None:
        cache, cap = self.cache, self.config.capacity_blocks
        waiting = self.waiting
        skipped: list[SimRequest] = []  # LoRA: no slot for their adapter this step
        admitted = False
        while waiting and self.num_running < self.config.max_running:
            req = waiting[0]
            if req.adapter is not None and not self._lora_slot(req.adapter):
                skipped.append(waiting.popleft())
                continue
            tokens = keys_as_tokens(req.blocks)
            match = cache.match_prefix(tokens)
            cache.inc_lock_ref(match.node)
            hit_blocks = match.length // KEY_TOKENS
            total_blocks = math.ceil((req.input_length + req.output_length) / BLOCK_TOKENS)
            extra = max(0, total_blocks - len(req.blocks))
            need = len(req.blocks) - hit_blocks + extra
            free = cap - self.used_blocks
            if need > free:
                cache.evict((need - free) * KEY_TOKENS)
                free = cap - self.used_blocks
            if need > free and self.num_running > 0:
                cache.dec_lock_ref(match.node)
                break  # head of line waits for memory
            waiting.popleft()
            if req.adapter is not None:
                self._lora_admit(req.adapter)
            req.node = cache.insert(tokens, lock=True).node
            if self.events is not None:
                self._stored(req, hit_blocks)
            cache.dec_lock_ref(match.node)
            req.extra_blocks = extra
            self.extra_blocks += extra
            gpu_cached = min(hit_blocks * BLOCK_TOKENS, req.input_length)
            loaded = 0 if req.kv_transferred else self.cpu_prefix_blocks(req.blocks, hit_blocks)
            req.cached_tokens = min((hit_blocks + loaded) * BLOCK_TOKENS, req.input_length)
            if loaded:
                self._load(req, req.blocks[hit_blocks : hit_blocks + loaded], now)
                req.cpu_cached_tokens = req.cached_tokens - gpu_cached
            req.prefill_left = 0 if req.kv_transferred else req.input_length - req.cached_tokens
            req.computed_blocks = hit_blocks + loaded
            if not req.kv_transferred:
                pending = self.pending
                for block in req.blocks[req.computed_blocks :]:
                    pending.setdefault(block, req)
            stats = self.stats
            stats.prompt_tokens += req.input_length
            stats.cpu_cached_tokens += req.cpu_cached_tokens
            self.prefilling.append(req)
            admitted = True
        if skipped:  # back at the head, in their order (vLLM's skipped_waiting_requests)
            waiting.extendleft(reversed(skipped))
        if admitted and self._priority and len(self.prefilling) > 1:
            # prefills under way first, in their order; then the others by (priority, arrival)
            self.prefilling = deque(sorted(self.prefilling, key=_prefill_order))

    def _start(self, req: SimRequest) -> None:
        """``req``'s first chunk is scheduled: its cached prefix is what is cached *now*. A
        block admitted with another request whose chunk for it is not scheduled yet is not
        there (the engines cache a block once the step that computes it is scheduled), so
        ``req`` computes it: under priority scheduling a later request can start first."""
        req.started = True
        blocks, pending = req.blocks, self.pending
        if not req.kv_transferred and not req.cpu_cached_tokens:
            hit = 0
            for block in blocks:
                if block in pending:
                    break
                hit += 1
            cached = min(hit * BLOCK_TOKENS, req.input_length)
            if cached != req.cached_tokens:
                req.cached_tokens, req.computed_blocks = cached, hit
                req.prefill_left = req.input_length - cached
            for block in blocks[hit:]:
                pending[block] = req  # it computes them now, whoever was admitted with them
        self.stats.cached_tokens += req.cached_tokens
        if self.observer is not None:
            self.observer.admitted(req, req.computed_blocks)

    def _scheduled(self, req: SimRequest, left: int) -> None:
        """``req``'s prefill is scheduled up to ``left`` tokens before its end: its blocks
        so far are cached for requests scheduled after it."""
        blocks, pending = req.blocks, self.pending
        done = len(blocks) if not left else (req.input_length - left) // BLOCK_TOKENS
        for block in blocks[req.computed_blocks : done]:
            if pending.get(block) is req:
                del pending[block]
        req.computed_blocks = max(req.computed_blocks, done)

    def _load(self, req: SimRequest, blocks: tuple[int, ...], now: float) -> None:
        """Start loading ``blocks`` of ``req`` from the CPU tier (they are pinned there until
        loaded; loads share the host to GPU link one after another); the request prefills
        once they are in, and the batch runs on meanwhile (vLLM's asynchronous load: the
        request waits in WAITING_FOR_REMOTE_KVS)."""
        self.cpu.acquire(blocks)
        start = max(now, self.link_free_at)
        self.link_free_at = start + self.config.load_s(len(blocks) * BLOCK_TOKENS)
        req.ready_at, req.loading = self.link_free_at, blocks
        self.loading.append(req)
        self.stats.cpu_loads += 1

    def _loaded(self, now: float) -> float | None:
        """Unpin the loads done by ``now``; when the next one is done (None: none left)."""
        left, nxt = [], None
        for req in self.loading:
            if req.ready_at <= now:
                self.cpu.release(req.loading)
                req.loading = ()
            else:
                left.append(req)
                nxt = req.ready_at if nxt is None else min(nxt, req.ready_at)
        self.loading = left
        return nxt

    def _store_cpu(self, req: SimRequest) -> None:
        """Write-through: a request's computed prompt blocks are copied to the CPU tier (the
        OffloadingConnector stores every full block it computes, LMCache every chunk)."""
        cpu = self.cpu
        if cpu is None or req.kv_transferred:
            return
        new = [b for b in req.blocks if b not in cpu]
        if new:
            self.stats.cpu_stored_blocks += len(new)
            if self.events is not None:
                self.events.append(
                    {"type": "BlockStored", "block_hashes": new, "parent_block_hash": None,
                     "token_ids": [], "block_size": BLOCK_TOKENS, "medium": "CPU"}
                )  # fmt: skip
        cpu.insert(req.blocks)

    def _lora_slot(self, adapter: str) -> bool:
        """Whether a request for ``adapter`` may join the batch: it runs already, or a slot
        is free of running adapters."""
        running = self.lora_running
        return adapter in running or len(running) < self.config.max_loras

    def _lora_admit(self, adapter: str) -> None:
        """``adapter`` runs one more request; load it (evicting the least recently used
        idle adapter) if it is not resident."""
        running, loras = self.lora_running, self.loras
        running[adapter] = running.get(adapter, 0) + 1
        if adapter in loras:
            loras.move_to_end(adapter)
            return
        if len(loras) >= self.config.max_loras:
            idle = next(a for a in loras if a not in running)  # _lora_slot left one
            del loras[idle]
        loras[adapter] = None
        self.stats.lora_swaps += 1
        self._lora_loads += 1

    def _plan(self, now: float) -> None:
        cfg = self.config
        batch = len(self.decoding)
        load_s = 0.0
        if self._lora_loads:  # the adapters admitted at this boundary load before the step
            load_s, self._lora_loads = self._lora_loads * cfg.lora_load_s, 0
        loaded_at = self._loaded(now) if self.loading else None
        plan = []
        if self.prefilling:
            budget = cfg.chunk_tokens
            for req in self.prefilling:
                if budget <= 0:
                    break
                if req.ready_at > now:  # its CPU-tier blocks are still loading
                    continue
                if not req.started:
                    self._start(req)
                take = min(budget, req.prefill_left)
                plan.append((req, take))
                self._scheduled(req, req.prefill_left - take)
                budget -= take
        context = self.decode_context if batch else 0
        self._span_growth = 0.0
        if plan:
            if cfg.profile is None:
                work = (cfg.chunk_tokens - budget) / cfg.prefill_tokens_per_s
            else:  # each chunk after what its request has in the cache already
                work = sum(
                    cfg.profile.prefill_work_s(take, req.input_length - req.prefill_left)
                    for req, take in plan
                )
            step = cfg.step_s(work, batch, context) + load_s
            self._prefill_plan = plan
            self._span_start, self._span_step, self._span_steps = now, step, 1 if batch else 0
            self._wake_at(now + step)
        elif batch:
            self._span_start, self._span_step = now, cfg.decode_step_s(batch, context)
            self._span_growth = cfg.decode_growth_s(batch)
            steps = max(1, self.decoding[0][0] - self.decode_counter)
            if self.waiting:
                steps = 1  # retry admission at every boundary
            elif loaded_at is not None:  # a load ends: its request joins at the next boundary
                steps = min(steps, self._steps_until(loaded_at - now))
            self._span_steps = steps
            self._wake_at(now + self._steps_s(steps))
        elif loaded_at is not None:  # nothing to run until a load ends
            self._prefill_plan = []
            self._span_start, self._span_step, self._span_steps = now, 0.0, 0
            self._wake_at(loaded_at)
        else:
            self._span_steps = 0
            self._wake_at(None)

    def _wake_at(self, when: float | None) -> None:
        self.next_event = when
        self.version += 1


def _order(req: SimRequest) -> tuple[int, int]:
    return req.order


def _prefill_order(req: SimRequest) -> tuple[int, ...]:
    return (0,) if req.started else (1, *req.order)

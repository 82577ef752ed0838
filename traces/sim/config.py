"""The simulator's configuration: the fleet, the router's shadows and rules, the workload's
pacing (:class:`SimConfig`), as ``simulate``, ``capacity`` and ``demo`` set it from their
options (traces/commands/options.py) and traces/sim/simulator.py runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from router.cache.cost_model import CostTerms
from router.cache.cost_profile import GpuProfile
from router.cache.worker_state import ShadowKind
from router.config import DISPATCH_HOLD_TOKENS
from router.core.flow_queue import DECODE_STEP_S, DECODE_TOKEN_S, KV_RESERVE
from traces.sim import gpu_profile, kv_transfer
from traces.sim.worker_model import WorkerModelConfig
from traces.trace.pacing import Pacing

RouterTiers = Literal["on", "off", "exact"]
ROUTER_TIERS: tuple[str, ...] = ("on", "off", "exact")


@dataclass(frozen=True)
class SimConfig:
    """How the simulated fleet and the router's shadows are set up."""

    workers: int = 8
    worker: WorkerModelConfig = field(default_factory=WorkerModelConfig)
    shadow: ShadowKind = "blocks"
    shadow_capacity_tokens: int | None = None  # default: the workers' KV capacity
    speedup: float = 1.0  # divide arrival times by this
    pacing: Pacing = "open"  # or "session": a turn waits for its previous turn's answer
    # the router's own reading of request bodies, bytes per modelled second shared by the
    # bodies in flight (0: none, a request is picked when sent); live, `serve` reads about
    # 100 MB a real second, so a replay at speedup S reads 100 MB / S per modelled second
    ingest_bytes_per_s: float = 0.0
    body_bytes_per_token: float = 4.0  # a replayed prompt's JSON body per token (text mode)
    # what the connection carries at once (socket buffers): a body this small is in when
    # sent; of a bigger one, the rest is read at the shared rate
    ingest_window_bytes: float = 0.0
    samples: int = 400  # points of the per-worker in-flight time series
    kv_events: bool = False  # precise mode: the models' KV events feed the router's index
    kv_event_delay_s: float = 0.05
    kv_event_loss: float = 0.0  # fraction of event batches lost on the way
    seed: int = 0  # which batches are lost
    # the proxy's report-driven capacity correction (router/cache/feedback.py); None: as the
    # proxy runs it, only while the shadows' capacity is a guess (shadow_capacity_tokens set)
    correct_shadow: bool | None = None
    base_model: str | None = None  # requests naming another model run it as a LoRA adapter
    # disaggregated prefill/decode (both > 0; ``workers`` is then ignored, the fleet is P + D)
    prefill_workers: int = 0
    decode_workers: int = 0
    decode_policy: str = "decode_load"  # picks the decode worker (policies.registry name)
    # the KV transfer, prefill worker to decode worker (traces/sim/kv_transfer.py)
    kv_transfer_latency_s: float = kv_transfer.LATENCY_S
    kv_transfer_gbps: float = kv_transfer.GBPS
    kv_bytes_per_token: int = kv_transfer.BYTES_PER_TOKEN
    # the workers' CPU KV tier (``worker.cpu_kv_capacity_tokens``), as the router sees it:
    # "on" a shadow per tier, "off" ignored (GPU shadows only), "exact" read from the models
    router_tiers: RouterTiers = "on"
    # requests held at the router while their worker's sent prefill is above this many tokens
    # (serve --dispatch-hold-tokens: router/core/dispatch_hold.py; 0: off)
    dispatch_hold_tokens: int | None = None  # None: DISPATCH_HOLD_TOKENS on FCFS engines

    def hold_tokens(self) -> int:
        """The dispatch hold in effect (as :meth:`router.config.Settings.hold_tokens`): by
        default on for FCFS engines and off where the engines take priorities."""
        if self.dispatch_hold_tokens is not None:
            return self.dispatch_hold_tokens
        return 0 if self.worker.scheduling_policy == "priority" else DISPATCH_HOLD_TOKENS

    # flow control (router/core/flow_queue.py, the live router's queue and saturation test):
    # requests wait in the router while the best worker's predicted TTFT is past the target
    flow_control: bool = False
    flow_target_ttft_s: float = 2.0
    flow_queue_max: int = 1000
    flow_queue_ttl_s: float = 30.0
    # the KV that requests below the highest priority seen leave free for it (--flow-kv-reserve)
    flow_kv_reserve: float = KV_RESERVE
    # the decode cost each engine step of queued prefill carries, as serve prices it
    # (--flow-decode-step-s, --flow-decode-token-s)
    flow_decode_step_s: float = DECODE_STEP_S
    flow_decode_token_s: float = DECODE_TOKEN_S
    # the TTFT a request must meet to count in goodput (reported when the trace has tenants
    # or priorities, or with flow control)
    slo_ttft_s: float = 2.0
    # record where each missed prompt block was at admission (traces/sim/miss_causes.py), for the
    # hit gap's split (traces/sim/hit_gap.py); not on a disaggregated fleet
    hit_gap: bool = False
    # the router's TTFT cost model (--cost-profile, router/cache/cost_model.py): a GPU
    # profile's terms (the ttft picker prices with them; default: serve's), or None: the flat
    # prior of the workers' configured prefill rate (the picker keeps its own flat formula)
    cost_profile: GpuProfile | None = field(default_factory=gpu_profile.default_profile)
    # the workers' context length (the sim worker's --max-model-len): a request whose prompt
    # plus output exceeds it is refused, the engine's 400; None: the GPU KV capacity, to
    # which vLLM caps it (a CPU tier does not lengthen it)
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.router_tiers not in ROUTER_TIERS:
            raise ValueError(f"router_tiers must be one of {ROUTER_TIERS}")
        if min(self.ingest_bytes_per_s, self.ingest_window_bytes) < 0:
            raise ValueError("ingest_bytes_per_s and ingest_window_bytes must be >= 0")
        if self.body_bytes_per_token <= 0:
            raise ValueError("body_bytes_per_token must be > 0")
        if (self.prefill_workers > 0) != (self.decode_workers > 0):
            raise ValueError("a disaggregated fleet needs both prefill_workers and decode_workers")
        if self.prefill_workers < 0 or self.decode_workers < 0:
            raise ValueError("prefill_workers and decode_workers must be >= 0")
        kv_transfer.check(self)

    @property
    def context_tokens(self) -> int:
        """The longest prompt plus output a worker accepts (``max_model_len``)."""
        return self.max_model_len or self.worker.kv_capacity_tokens

    @property
    def disaggregated(self) -> bool:
        return self.prefill_workers > 0 and self.decode_workers > 0

    @property
    def fleet_size(self) -> int:
        """Workers simulated: ``workers``, or P + D for a disaggregated fleet."""
        return self.prefill_workers + self.decode_workers if self.disaggregated else self.workers

    def transfer_s(self, tokens: int) -> float:
        """Seconds to move ``tokens`` prompt tokens' KV from a prefill to a decode worker."""
        return kv_transfer.seconds(self, tokens)

    def cost_terms(self) -> CostTerms:
        """The router's cost model terms: ``cost_profile``'s, else the flat prior."""
        if self.cost_profile is not None:
            return CostTerms.of_profile(self.cost_profile, chunk_tokens=self.worker.chunk_tokens)
        return CostTerms.flat(self.worker.prefill_tokens_per_s)

"""The proxy's settings: one pydantic-settings model, fed by defaults, a YAML file, the
environment (``CACHE_ROUTER_*``) and the command line, in increasing priority.

Every option is a field here with its default and a description; ``cache-router serve
--help`` is generated from these fields (:mod:`router.service.command`), so the help
cannot drift from what the code reads.
"""

from __future__ import annotations

import math
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from policies.registry import PICKER_NAMES, make_picker
from router.cache.block_hash import BLOCK_SIZE
from router.cache.cost_model import SEQ_S, CostTerms
from router.cache.cost_profile import DEFAULT, FLAT_KV_LOAD_GBPS, profile_names, resolve
from router.cache.radix_tree import EVICTION_POLICIES
from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S, STEP_OVERHEAD_S
from router.validation import (
    BYTES,
    BYTES_OR_OFF,
    COUNT,
    COUNT_OR_OFF,
    FRACTION,
    MAX_BYTES,
    MAX_ITEMS,
    MAX_PORT,
    PORT,
    PORT_GIVEN,
    POSITIVE,
    SECONDS,
    SECONDS_OR_OFF,
    TOKENS,
    TOKENS_OR_OFF,
    Rule,
    integer,
    number,
)

ENV_PREFIX = "CACHE_ROUTER_"
DISPATCH_HOLD_TOKENS = 8192
"""--dispatch-hold-tokens' default: one engine step's prefill budget (vLLM's
max_num_batched_tokens for online serving on an H100), so each worker's own queue holds about
one step of prefill and the router orders the rest (docs/ttft.md)."""


def _ruled(rule: Rule) -> Any:
    """A field type of ``rule``'s numbers: pydantic reads the value, ``rule`` checks it, and
    ``serve``'s flag parses it with the same rule (router/service/command.py)."""
    return Annotated[rule.kind, AfterValidator(rule.check), rule]


Tokens = _ruled(TOKENS)
TokensOrOff = _ruled(TOKENS_OR_OFF)
Bytes = _ruled(BYTES)
BytesOrOff = _ruled(BYTES_OR_OFF)
Count = _ruled(COUNT)
CountOrOff = _ruled(COUNT_OR_OFF)
Seconds = _ruled(SECONDS)
SecondsOrOff = _ruled(SECONDS_OR_OFF)
Positive = _ruled(POSITIVE)
Fraction = _ruled(FRACTION)
Port = _ruled(PORT)
PortGiven = _ruled(PORT_GIVEN)
PortOffset = _ruled(integer(-MAX_PORT, MAX_PORT))
Priority = _ruled(integer(-MAX_ITEMS, MAX_ITEMS))


def _split_list(value: Any) -> Any:
    """Accept a list, a JSON list, or a comma/space separated string (env-friendly)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return yaml.safe_load(text)
        return [part for part in text.replace(",", " ").split() if part]
    return value


class Settings(BaseSettings):
    """Everything `cache-router serve` can be told; see each field's description."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    workers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="worker base URLs (vLLM or SGLang), e.g. http://10.0.0.5:8000",
    )
    prefill_workers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="prefill workers of a disaggregated fleet: URL [BOOTSTRAP_PORT] ... (an "
        "SGLang prefill server's bootstrap port may follow its URL, as in sglang-router)",
    )
    decode_workers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="decode workers of a disaggregated fleet"
    )
    bootstrap_ports: dict[str, PortGiven] = Field(
        default_factory=dict,
        description="SGLang prefill workers' bootstrap ports: URL=PORT (default "
        "--default-bootstrap-port)",
    )
    default_bootstrap_port: PortGiven = Field(
        8998, description="SGLang's default --disaggregation-bootstrap-port"
    )
    pd_protocol: Literal["auto", "vllm", "sglang"] = Field(
        "auto",
        description="protocol of a disaggregated request: vllm (prefill with max_tokens 1, "
        "its kv_transfer_params to the decode), sglang (both at once with bootstrap "
        "host/port/room), auto: sglang if the prefill worker's /metrics are SGLang's",
    )
    decode_policy: str = Field(
        "decode_load", description="picker of decode workers (prefill workers: --policy)"
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: Port = Field(8080, description="port to listen on")
    policy: str = Field("ttft", description=f"picker: one of {', '.join(PICKER_NAMES)}")
    picker_params: dict[str, Any] = Field(
        default_factory=dict,
        description="picker keyword arguments (see policies/<name>.py), e.g. overload_factor=3",
    )
    shadow: Literal["blocks", "radix"] = Field(
        "blocks",
        description="shadow that answers estimate_cache_hit: block-hash LRU or radix tree "
        "(both are kept and scored)",
    )
    kv_capacity_tokens: Tokens = Field(
        1_000_000, description="KV cache capacity of each worker, in tokens (sizes shadows)"
    )
    worker_kv_capacity_tokens: dict[str, Tokens] = Field(
        default_factory=dict, description="per-worker KV capacity override: URL=TOKENS"
    )
    cpu_kv_capacity_tokens: TokensOrOff = Field(
        0,
        description="each worker's CPU (host-memory) KV tier in tokens, beneath its GPU KV "
        "(vLLM's OffloadingConnector, LMCache's CPU backend); the router keeps a shadow of it "
        "and the ttft picker prices a prefix found there at its load time (0: no tier)",
    )
    worker_cpu_kv_capacity_tokens: dict[str, TokensOrOff] = Field(
        default_factory=dict,
        description="per-worker CPU KV tier override: URL=TOKENS (0: that worker has none); "
        "a vLLM worker that reports kv_offloading_size in vllm:cache_config_info is sized "
        "from it (with --shadow-capacity-from-worker)",
    )
    kv_load_gbps: Positive | None = Field(
        None,
        description="the workers' CPU tier to GPU KV load bandwidth, GB/s; none: the cost "
        "profile's measured pinned-copy rate for its pieces (about 49 on h100-llama8b), "
        f"{FLAT_KV_LOAD_GBPS:g} with --cost-profile flat",
    )
    worker_kv_load_gbps: dict[str, Positive] = Field(
        default_factory=dict, description="per-worker load bandwidth override: URL=GBPS"
    )
    kv_bytes_per_token: Bytes = Field(
        131_072, description="KV bytes of one token, all layers (default: an 8B model)"
    )
    router_tiers: Literal["on", "off"] = Field(
        "on",
        description="'off': ignore the workers' CPU tier (GPU shadows only, as a router that "
        "knows one tier), to measure what reading it gains",
    )
    worker_models: dict[str, list[str]] = Field(
        default_factory=dict,
        description="models a worker serves, pinned instead of read from its /v1/models: "
        "URL=BASE[,ADAPTER...] (the first is the base model, the rest its LoRA adapters)",
    )
    models_interval_s: Seconds = Field(
        10.0, description="seconds between reads of each worker's /v1/models"
    )
    response_owners_max: Count = Field(
        200_000,
        description="Responses API: how many response ids the router remembers the storing "
        "worker of (newest kept; a continuation of an older one gets 404 response_not_found)",
    )
    discover: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="find workers: dns://NAME:PORT (A/AAAA), dns+srv://_SERVICE._tcp.NAME "
        "(SRV), k8s://NAMESPACE?labelSelector=...&port=N (EndpointSlices); workers that "
        "appear join, workers that go drain",
    )
    discover_interval_s: Seconds = Field(
        5.0, description="seconds between DNS look-ups of --discover dns:// names"
    )
    discover_nameserver: str | None = Field(
        None, description="DNS server for --discover, IP or IP:PORT (default: the system's)"
    )
    block_size: Tokens = Field(BLOCK_SIZE, description="tokens per shadow block")
    prefill_tokens_per_s: Positive = Field(
        DEFAULT_PREFILL_TOKENS_PER_S,
        description="each worker's expected prefill rate: the prior of the rate the ttft "
        "picker learns from observed time to first token (router/cache/workload.py); the "
        "ttft picker's prefill and flow control's saturation read it with --cost-profile "
        "flat (a profile prices them itself)",
    )
    cost_profile: str = Field(
        DEFAULT,
        description="the GPU cost profile the router predicts time to first token with "
        "(router/cache/cost_model.py; the ttft picker and /metrics' prediction error): "
        "'flat' (--prefill-tokens-per-s and fixed step costs), one of "
        f"{', '.join(profile_names())}, or a profile JSON file (bench/gpu/README.md); "
        "corrected per worker from observed TTFT",
    )
    cost_time_scale: Positive = Field(
        1.0,
        description="the workers run this many times faster than real time (sim workers' "
        "--time-scale): the cost profile's seconds (and the flat one's step costs, and KV "
        "loads from the CPU tier) divided by it",
    )
    radix_eviction: str = Field("lru", description="eviction policy of the shadow radix tree")
    tokenizer: str = Field(
        "approx",
        description="'approx' (text bytes, no files needed), 'worker' (ask the worker's "
        "/tokenize), or a path to a model folder / tokenizer.json (exact)",
    )
    tokenize_path: str = Field("/tokenize", description="worker endpoint for --tokenizer worker")
    tokenize_cache_bytes: BytesOrOff = Field(
        64 << 20, description="bytes of token ids cached from worker /tokenize answers"
    )
    tokenize_timeout_s: Seconds = Field(
        5.0, description="timeout of a worker /tokenize call (then: approx)"
    )
    session_header: str = Field(
        "X-Session-ID", description="request header naming the session (else body user/session_id)"
    )
    connect_timeout_s: Seconds = Field(5.0, description="timeout to connect to a worker")
    read_timeout_s: Seconds = Field(
        600.0, description="longest wait for the next bytes from a worker (504 before any)"
    )
    max_attempts: Count = Field(
        3, description="workers tried per request (connect error / 5xx before any byte)"
    )
    health_interval_s: Seconds = Field(2.0, description="seconds between health probes")
    health_timeout_s: Seconds = Field(2.0, description="timeout of one health probe")
    health_failure_threshold: Count = Field(
        3,
        description="consecutive failures (probes or connect errors) that take a worker out",
    )
    health_path: str = Field("/health", description="worker path probed for health")
    max_body_bytes: Bytes = Field(32 << 20, description="largest accepted request body (413)")
    # Keys are SecretStr: repr(), str() and model_dump() show "**********", so a logged
    # Settings never leaks one (router/core/access.py compares them in constant time).
    admin_key: SecretStr | None = Field(
        None,
        description="key required (Bearer or X-Admin-Key) to POST/DELETE /workers; with "
        "--api-key set and no admin key, those changes are refused",
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="client API keys accepted (Authorization: Bearer KEY) on the generation "
        "endpoints and /v1/models; empty: no check",
    )
    worker_api_key: SecretStr | None = Field(
        None, description="Bearer key sent to workers instead of the client's Authorization"
    )
    stream_usage: bool = Field(
        True,
        description="ask workers for usage in streams (stream_options.include_usage) to read "
        "cached tokens; the extra chunk is dropped when the client did not ask for it",
    )
    correct_shadow: bool = Field(
        True,
        description="adapt shadow capacity to the cached tokens workers report, while it is a "
        "guess (until --shadow-capacity-from-worker sizes it from the worker's /metrics)",
    )
    # Worker truth and precise mode (router/fleet/worker_metrics.py, router/fleet/kv_events.py):
    # what the workers themselves say they hold, next to the router's estimate of it.
    worker_metrics_interval_s: SecondsOrOff = Field(
        5.0,
        description="seconds between scrapes of each worker's /metrics (prefix cache hits, "
        "queue, KV usage and capacity); 0: off",
    )
    worker_metrics_path: str = Field("/metrics", description="worker path of its metrics")
    shadow_capacity_from_worker: bool = Field(
        True,
        description="size each worker's shadows to the KV capacity its /metrics report "
        "(vllm:cache_config_info block_size x num_gpu_blocks, sglang:max_total_num_tokens) "
        "instead of --kv-capacity-tokens; the feedback correction then leaves them alone",
    )
    kv_events: bool = Field(
        False,
        description="precise mode: subscribe to each worker's ZMQ KV cache events (the router "
        "binds, vLLM connects) and answer cache-hit estimates from them while in sync",
    )
    kv_events_bind_host: str = Field(
        "127.0.0.1", description="address the KV event sockets bind (0.0.0.0: any interface)"
    )
    kv_events_port_offset: PortOffset = Field(
        400,
        description="KV events of the worker on port P arrive at port P + offset here "
        "(vLLM: --kv-events-config endpoint tcp://ROUTER:P+offset)",
    )
    kv_events_replay_offset: PortOffset = Field(
        500,
        description="the worker on port P serves missed KV event batches at its port P + "
        "offset (vLLM: replay_endpoint); 0: no replay, gaps fall back to the estimate",
    )
    kv_events_connect: bool = Field(
        False,
        description="precise mode, vLLM's default direction: the worker binds its publisher "
        "(endpoint tcp://*:P+offset) and the router connects to the worker's host at P + "
        "kv_events_port_offset, so several router replicas can subscribe to one worker",
    )
    # Scale-out (router/fleet/state_sync.py, router/service/supervisor.py): router processes and
    # replicas that share bookings, load, sessions and membership through Redis.
    processes: str = Field(
        "1",
        pattern=r"^(auto|[1-9][0-9]{0,2})$",
        description="router processes on this port (SO_REUSEPORT), supervised by this one; "
        "'auto': the cores this process may use. Without --state-url they share a private "
        "redis-server on a unix socket",
    )
    state_url: str | None = Field(
        None,
        description="Redis (or Valkey) shared by router replicas: redis://HOST:PORT/DB, "
        "rediss://..., unix:///path/redis.sock; none: this router's state is its own",
    )
    state_prefix: str = Field(
        "cache-router",
        min_length=1,
        description="prefix of this fleet's Redis keys (several fleets can share one Redis)",
    )
    state_flush_interval_s: _ruled(number(0, 1, above=True)) = Field(
        0.005, description="how often bookings are batched out to the other replicas"
    )
    state_load_interval_s: _ruled(number(0, 5, above=True)) = Field(
        0.02, description="how often each replica publishes and reads the load"
    )
    state_load_ttl_s: Seconds = Field(
        2.0,
        description="a replica's published load expires this long after its last update, so a "
        "dead replica's load leaves the others' view",
    )
    reuse_port: bool = Field(
        False,
        description="bind the listening socket with SO_REUSEPORT so several router processes "
        "share the port (--processes sets it for its children)",
    )
    process_socket: str | None = Field(
        None,
        description="also listen on this unix socket, one per process; /metrics then answers "
        "for every process whose socket is in the same folder (--processes sets it for its "
        "children)",
    )
    worker_header: bool = Field(True, description="add x-cache-router-worker: <url> to responses")
    log_level: str = Field("info", description="log level (debug, info, warning, error)")
    access_log: bool = Field(False, description="log every request (costs throughput)")
    shutdown_timeout_s: Seconds = Field(
        30.0, description="on SIGTERM, how long in-flight requests may finish"
    )
    # Admission control and client limits (router/service/server.py, router/proxy/forward.py): a
    # router in front of a GPU fleet must shed load with a clear answer, never fall over.
    max_inflight: CountOrOff = Field(
        2048,
        description="generation requests in flight router-wide; more get 429 + Retry-After "
        "(0: no limit)",
    )
    max_connections: CountOrOff = Field(
        4096,
        description="open client connections; a request on one beyond this gets 503 + "
        "Retry-After and the connection closes (0: no limit)",
    )
    max_header_bytes: _ruled(integer(1024, MAX_BYTES)) = Field(
        65536,
        description="largest request line + headers, in bytes (431, connection closed)",
    )
    request_read_timeout_s: Seconds = Field(
        30.0,
        description="longest time a client may take to send a request's headers and body "
        "(408, connection closed)",
    )
    circuit_open_s: SecondsOrOff = Field(
        5.0,
        description="once a worker is taken out, the least time before a successful probe "
        "brings it back",
    )
    engine_priority: bool = Field(
        False,
        description="the workers run priority scheduling (vLLM --scheduling-policy priority; "
        "SGLang --enable-priority-scheduling --schedule-low-priority-values-first): with the "
        "ttft policy the router sets each generation request's 'priority' so that a worker "
        "takes its short prefills before its long ones (router/core/engine_priority.py); a "
        "worker without it answers such a request 400",
    )
    dispatch_hold_tokens: TokensOrOff = Field(
        DISPATCH_HOLD_TOKENS,
        description="with the ttft policy, hold each streamed generation request at the "
        "router while the prefill already sent to its worker and not through (no first token "
        "yet) is above this many tokens, releasing the held ones in ttft's priority order "
        "(shortest predicted prefill first, aged by send time): the router orders what FCFS "
        "engines take (router/core/dispatch_hold.py; 0: off; off by default with "
        "--engine-priority, where the engines order themselves; epp never holds)",
    )
    # Flow control (router/core/flow.py): priorities, fairness and SLO-aware admission
    # between admission and placement, in serve and epp; off by default.
    flow_control: bool = Field(
        False,
        description="hold requests in a priority / fair-share queue while the fleet is "
        "saturated (the best worker's predicted TTFT past --flow-target-ttft-s) instead of "
        "placing them at once; sheddable (negative priority) requests get 429 then",
    )
    flow_target_ttft_s: Seconds = Field(
        2.0,
        description="flow control: the predicted time to first token past which the fleet "
        "is saturated for a request",
    )
    flow_queue_max: CountOrOff = Field(
        1000, description="flow control: queued requests per priority band (429 past it)"
    )
    flow_queue_max_bytes: BytesOrOff = Field(
        256 << 20,
        description="flow control: queued request bytes per priority band (429 past it)",
    )
    flow_queue_ttl_s: Seconds = Field(
        30.0, description="flow control: longest wait in the queue (then 429)"
    )
    flow_objectives: dict[str, Priority] = Field(
        default_factory=dict,
        description="flow control: priority of each x-llm-d-inference-objective name",
    )
    flow_weights: dict[str, Positive] = Field(
        default_factory=dict,
        description="flow control: fair-share weight of a flow (default 1)",
    )
    flow_fairness_header: str = Field(
        "x-llm-d-inference-fairness-id",
        description="flow control: the header naming a request's flow (tenant); without "
        "it, the API key's tenant, else the flow 'default'",
    )
    flow_kv_limit: Fraction = Field(
        0.0,
        description="flow control: also saturated when every worker's booked KV plus the "
        "prompt passes this fraction of its capacity (0: off)",
    )
    flow_kv_reserve: Fraction = Field(
        0.4,
        description="flow control: the share of each worker's KV that requests below the "
        "highest priority seen within the queue TTL leave free for it (such a request is "
        "saturated once every worker's booked KV plus its prompt passes 1 - this share); 0: off",
    )
    flow_decode_step_s: SecondsOrOff = Field(
        0.008,
        description="flow control: an engine step's decode cost, fixed part, which each step "
        "of a worker's queued prefill carries (router/core/flow_queue.py StepCost; default: "
        "measured on an H100, 8B model; with a --cost-profile other than flat, the "
        "profile's cost model prices it instead)",
    )
    flow_decode_token_s: SecondsOrOff = Field(
        4.3e-8,
        description="flow control: an engine step's decode cost per context token the "
        "worker holds (booked prompts and expected output; default: measured on an H100, "
        "8B model; unused with a --cost-profile other than flat)",
    )
    metrics_require_key: bool = Field(
        False,
        description="require a client or admin key for GET /metrics, /workers and "
        "/dashboard/data too (/health stays open)",
    )

    @field_validator("processes", mode="before")
    @classmethod
    def _processes_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator(
        "workers", "prefill_workers", "decode_workers", "api_keys", "discover", mode="before"
    )
    @classmethod
    def _lists(cls, value: Any) -> Any:
        value = _split_list(value)
        if isinstance(value, list):  # YAML may give a bootstrap port as a number
            value = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @model_validator(mode="before")
    @classmethod
    def _bootstrap_ports(cls, data: Any) -> Any:
        """``--prefill URL PORT``: a number after a prefill URL is its bootstrap port."""
        if not isinstance(data, dict) or not data.get("prefill_workers"):
            return data
        items = _split_list(data["prefill_workers"])
        if not isinstance(items, list):
            return data
        urls: list[str] = []
        ports = dict(data.get("bootstrap_ports") or {})
        for item in items:
            text = str(item).strip()
            if text.isdigit():
                if not urls:
                    raise ValueError(f"prefill_workers: port {text} follows no URL")
                ports.setdefault(urls[-1], int(text))
            else:
                urls.append(text)
        return {**data, "prefill_workers": urls, "bootstrap_ports": ports}

    @field_validator("worker_models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out: dict[str, list[str]] = {}
        for url, names in value.items():
            names = _split_list(names) if isinstance(names, str) else names
            if not isinstance(names, list) or not names:
                raise ValueError(f"worker_models: {url} needs BASE[,ADAPTER...]")
            out[normalize_url(url)] = [str(name) for name in names]
        return out

    @field_validator("workers", "prefill_workers", "decode_workers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for url in value:
            url = normalize_url(url)
            if url not in out:
                out.append(url)
        return out

    @field_validator("api_keys", "admin_key", "worker_api_key", mode="before")
    @classmethod
    def _keys_as_text(cls, value: Any) -> Any:
        # a YAML `admin_key: 12345` is an int: take it as text rather than fail with an
        # error message that would print the key
        if isinstance(value, list):
            return [str(v) if isinstance(v, int | float) else v for v in value]
        return str(value) if isinstance(value, int | float) else value

    @field_validator("api_keys", "admin_key", "worker_api_key")
    @classmethod
    def _non_empty_keys(cls, value: Any) -> Any:
        keys = value if isinstance(value, list) else [value]
        for key in keys:
            if key is not None and not key.get_secret_value().strip():
                raise ValueError("a key must not be empty")
        return value

    @field_validator(
        "worker_kv_capacity_tokens",
        "worker_cpu_kv_capacity_tokens",
        "worker_kv_load_gbps",
        "bootstrap_ports",
    )
    @classmethod
    def _keyed_by_url(cls, value: dict[str, Any]) -> dict[str, Any]:
        return {normalize_url(url): number for url, number in value.items()}

    @model_validator(mode="after")
    def _check_names(self) -> Settings:
        make_picker(self.policy, **self.picker_params)  # ValueError lists what is valid
        make_picker(self.decode_policy)
        roles = [*self.workers, *self.prefill_workers, *self.decode_workers]
        twice = sorted({url for url in roles if roles.count(url) > 1})
        if twice:
            raise ValueError(f"a worker has one role: {', '.join(twice)} given twice")
        if self.tokenizer not in ("approx", "worker") and not Path(self.tokenizer).exists():
            raise ValueError(
                f"tokenizer must be 'approx', 'worker' or an existing path, not {self.tokenizer!r}"
            )
        self.cost_terms()  # ValueError, one line, for an unknown name or a bad file
        if self.radix_eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"radix_eviction must be one of {', '.join(EVICTION_POLICIES)}, "
                f"not {self.radix_eviction!r}"
            )
        for uri in self.discover:
            if not uri.startswith(("dns://", "dns+srv://", "k8s://")):
                raise ValueError(f"discover: {uri!r} is not dns://, dns+srv:// or k8s://")
        if self.state_url is not None and not self.state_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(
                f"state_url must be redis://, rediss:// or unix://, not {self.state_url!r}"
            )
        return self

    def cost_terms(self) -> CostTerms:
        """The cost model's terms (router/cache/cost_model.py): ``cost_profile``'s, or the
        flat prior of ``prefill_tokens_per_s``, in the workers' time."""
        profile = resolve(self.cost_profile)
        scale = self.cost_time_scale
        if profile is None:
            return CostTerms.flat(self.prefill_tokens_per_s, STEP_OVERHEAD_S / scale, SEQ_S / scale)
        return CostTerms.of_profile(profile, scale)

    def hold_tokens(self) -> int:
        """``--dispatch-hold-tokens`` in effect: its default is for FCFS engines; with
        ``--engine-priority`` the engines order their own queues, and it holds only if given."""
        if self.engine_priority and "dispatch_hold_tokens" not in self.model_fields_set:
            return 0
        return self.dispatch_hold_tokens

    def process_count(self) -> int:
        """``processes`` as a number: 'auto' is the cores this process may use (its CPU
        affinity, and a container's CPU quota, cgroup v2 ``cpu.max``, when lower)."""
        if self.processes != "auto":
            return int(self.processes)
        cores = len(os.sched_getaffinity(0))
        try:
            quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
            if quota != "max":
                cores = min(cores, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError):
            pass
        return max(1, cores)

    def roles(self) -> list[tuple[str, str]]:
        """Every configured worker and its role (``both``, ``prefill`` or ``decode``)."""
        return [
            *((url, "both") for url in self.workers),
            *((url, "prefill") for url in self.prefill_workers),
            *((url, "decode") for url in self.decode_workers),
        ]

    def bootstrap_port(self, url: str) -> int:
        """The SGLang bootstrap port of the prefill worker at ``url``."""
        return self.bootstrap_ports.get(url, self.default_bootstrap_port)

    def capacity_for(self, url: str) -> int:
        """KV capacity (tokens) of the worker at ``url``."""
        return self.worker_kv_capacity_tokens.get(url, self.kv_capacity_tokens)

    def cpu_capacity_for(self, url: str) -> int:
        """CPU KV tier (tokens) of the worker at ``url`` (0: none)."""
        return self.worker_cpu_kv_capacity_tokens.get(url, self.cpu_kv_capacity_tokens)

    def kv_load_s_per_token(self, url: str) -> float:
        """Seconds to load one token's KV from the CPU tier of the worker at ``url``, in the
        workers' time (divided by ``cost_time_scale``, as the cost model's terms)."""
        gbps = self.worker_kv_load_gbps.get(url, self.kv_load_gbps)
        profile = resolve(self.cost_profile) if gbps is None else None
        if profile is not None:
            seconds = profile.load_s_per_token()
        else:
            seconds = self.kv_bytes_per_token / ((gbps or FLAT_KV_LOAD_GBPS) * 1e9)
        return seconds / self.cost_time_scale

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # command line (init) > environment > YAML file > defaults
        return init_settings, env_settings, _YamlSource(settings_cls)


class _YamlSource(PydanticBaseSettingsSource):
    """The values of the YAML file being loaded (set by :func:`load_settings`)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_YAML_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_YAML_VALUES.get() or {})


_YAML_VALUES: ContextVar[dict[str, Any] | None] = ContextVar("_YAML_VALUES", default=None)


def field_rule(name: str) -> Rule | None:
    """The :class:`Rule` of the Settings field ``name`` (of its values, for a mapping such
    as ``flow_weights``); None for a field that is not a number. ``serve``'s flags parse
    with it, and ``simulate``'s flags of the same meaning share it."""
    info = Settings.model_fields[name]
    found = [m for m in info.metadata if isinstance(m, Rule)]
    if not found and get_origin(info.annotation) is dict:
        value = get_args(info.annotation)[1]
        found = [m for m in getattr(value, "__metadata__", ()) if isinstance(m, Rule)]
    return found[0] if found else None


def normalize_url(url: str) -> str:
    """``host:port`` → ``http://host:port``; no trailing slash (so one worker, one key)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"worker URL must be http(s): {url!r}")
    return url


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from a YAML file, the environment and ``overrides`` (highest priority).

    ``overrides`` whose value is None are ignored, so an argparse namespace with unset options
    can be passed as is. Environment variables beat the YAML file; the file beats defaults.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    file_values: dict[str, Any] = {}
    if config_file is not None:
        text = Path(config_file).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_file}: expected a mapping of option: value")
        file_values = {str(k).replace("-", "_"): v for k, v in loaded.items()}
        if "worker" in file_values and "workers" not in file_values:
            file_values["workers"] = file_values.pop("worker")
    token = _YAML_VALUES.set(file_values)
    try:
        return Settings(**given)
    finally:
        _YAML_VALUES.reset(token)

"""``cache-router sim-worker``: the simulator's worker model as a real OpenAI-compatible server.

The same :class:`traces.sim.worker_model.WorkerModel` the offline simulator runs in virtual time
runs here against the event loop's clock, so a router in front of it sees real latencies,
real queueing and a real prefix cache, without a GPU. It speaks vLLM's API
(``/v1/chat/completions``, ``/v1/completions``, ``/tokenize``, ``/v1/models``, ``/health``,
``/metrics`` with vLLM's metric names, ``/reset_prefix_cache``) and SGLang's ``/generate``,
and reports the prompt tokens it found cached in ``usage.prompt_tokens_details.cached_tokens``
(``meta_info.cached_tokens`` for ``/generate``).

LoRA (``--lora NAME ...``): the worker serves those adapters of its model as vLLM does with
``--enable-lora --lora-modules``: ``/v1/models`` lists each with ``parent`` set to the base
model, a request whose ``model`` names one runs it (its own prefix cache, at most
``--max-loras`` adapters in a batch, ``--lora-load-ms`` per load: see
:mod:`traces.sim.worker_model`), and ``/metrics`` has vLLM's ``vllm:lora_requests_info`` plus
``sim:lora_swaps_total`` (adapters loaded). A model the worker does not serve is a 404, as
vLLM answers.

``--flavor sglang`` exports SGLang's metric names instead and encodes KV events as SGLang
does; ``--kv-events-config`` publishes the model's KV events over ZMQ as both engines do
(:mod:`traces.sim_worker.kv_event_publisher`, :mod:`traces.sim_worker.kv_event_wire`), so
precise mode runs live without a GPU.

Disaggregated serving (``--role prefill|decode``; ``both``, the default, is aggregated and
ignores the fields below): the worker plays one side of prefill/decode disaggregation in
its flavor's protocol. vLLM (NixlConnector): a prefill needs ``kv_transfer_params`` with
``do_remote_decode: true``, runs the request and adds the ``kv_transfer_params`` a decode
needs to its (non-streamed) response, holding the KV ``--kv-hold-s`` for one
``POST /sim/kv_pull``; a decode needs those params (``do_remote_prefill: true``), pulls from
the prefill, then runs. SGLang (mini_lb): both get the same body with ``bootstrap_host``,
``bootstrap_port``, ``bootstrap_room``; the prefill runs the prompt as a one-token request
and publishes the room on its bootstrap listener (``--disaggregation-bootstrap-port``, a
second socket: ``GET /sim/room/{room}``); the decode polls that until ready. A decode
waits the transfer time (``--kv-transfer-latency-ms`` + tokens x ``--kv-bytes-per-token`` /
``--kv-transfer-gbps``, model time like every cost, for the prompt tokens it has not
cached itself), then runs with no prompt compute (``SimRequest.kv_transferred``). A request
without its role's fields is a 400, a failed transfer a 503; ``/metrics`` adds
``sim:kv_transfers_total{direction}``, ``sim:kv_transfer_tokens_total{direction}`` and
``sim:kv_transfer_failures_total``; ``/server_info`` gives ``disaggregation_mode``. See
:mod:`traces.sim_worker.pd`.

The engine that runs the model in real time, and the metrics, are in
:mod:`traces.sim_worker.engine`; request parsing and bodies in :mod:`traces.sim_worker.api`.

Not simulated: request abort (a client that disconnects leaves its request running to the
end, holding its blocks), sampling, logprobs, n > 1, batched prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from router import __version__
from router.cache.radix_tree import EVICTION_POLICIES
from router.validation import (
    COUNT,
    MAX_TOKENS,
    PORT,
    POSITIVE,
    SECONDS,
    SEED,
    integer,
    refuse,
)
from traces.sim import kv_transfer
from traces.sim.worker_model import WorkerModelConfig, add_model_options, model_config_from_args
from traces.sim_worker.api import (
    ApiError,
    GenRequest,
    Reply,
    output_tokens,
    parse_chat,
    parse_completion,
    parse_generate,
    parse_tokenize,
)
from traces.sim_worker.engine import (
    Handle,
    LoraCollector,
    RealTimeWorker,
    SglangCollector,
    VllmCollector,
    WorkerUnavailable,
)
from traces.sim_worker.kv_event_publisher import KVEventPublisher, PublisherConfig, config_from_json
from traces.sim_worker.kv_event_wire import FLAVORS, Flavor
from traces.sim_worker.pd import (
    DEFAULT_BOOTSTRAP_PORT,
    ROLES,
    Disaggregation,
    Leg,
    PdCollector,
    PdConfig,
)
from traces.sim_worker.responses import ResponsesApi, transcriptions
from traces.trace.record import BLOCK_TOKENS

MODEL_LEN = integer(2, MAX_TOKENS)
"""The longest prompt + output: one token of each at least."""


@dataclass(frozen=True)
class SimWorkerConfig:
    """The worker model plus what only the server needs."""

    model: WorkerModelConfig = field(default_factory=WorkerModelConfig)
    model_name: str = "sim-model"
    time_scale: float = 1.0  # model seconds per real second; > 1 runs faster (tests)
    seed: int | None = None  # response ids only: the model itself is deterministic
    max_model_len: int | None = None  # None: the KV capacity, as vLLM caps it
    flavor: Flavor = "vllm"  # the engine it imitates: /metrics names, KV event encoding
    kv_events: PublisherConfig | None = None  # publish KV events (kv_event_publisher.py)
    loras: tuple[str, ...] = ()  # LoRA adapters served (vLLM's --lora-modules names)
    pd: PdConfig = field(default_factory=PdConfig)  # disaggregated prefill/decode role

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}, not {self.flavor!r}")
        m = self.model
        if not self.time_scale > 0:
            raise ValueError("time scale must be positive")
        if m.kv_capacity_tokens < BLOCK_TOKENS:
            raise ValueError(f"KV capacity must hold at least one {BLOCK_TOKENS}-token block")
        if m.chunk_tokens < 1 or m.max_running < 1 or not m.prefill_tokens_per_s > 0:
            raise ValueError("chunk tokens, max running and prefill rate must be positive")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max model len must be at least 2 (one prompt and one output token)")
        if min(m.step_overhead_s, m.decode_s_per_seq) < 0 or m.decode_step_s(1) <= 0:
            raise ValueError("decode step costs must be >= 0 and not both 0")
        if m.max_loras < 1 or m.lora_load_s < 0:
            raise ValueError("max loras must be at least 1 and the LoRA load cost >= 0")
        if len(set(self.loras)) != len(self.loras) or self.model_name in self.loras:
            raise ValueError("LoRA names must be distinct and differ from the model name")

    @property
    def context_len(self) -> int:
        return self.max_model_len or self.model.kv_capacity_tokens


# ---- the HTTP app ----------------------------------------------------------------------


class _Service:
    """Request handlers over one worker; parsing and bodies live in sim_worker_api."""

    def __init__(self, config: SimWorkerConfig, worker: RealTimeWorker) -> None:
        self.config = config
        self.worker = worker
        self.created = int(time.time())
        self._rng = random.Random(config.seed)
        self.registry = CollectorRegistry(auto_describe=False)
        collector = SglangCollector if config.flavor == "sglang" else VllmCollector
        self.registry.register(collector(worker, config.model_name))
        if config.loras:
            self.registry.register(LoraCollector(worker, config.flavor))
        self.pd = Disaggregation(config.pd, config.flavor, worker)
        if config.pd.role != "both":
            self.registry.register(PdCollector(self.pd))

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError("request body must be a JSON object")
        return body

    def _check_model(self, name: str | None) -> str | None:
        """The LoRA adapter ``name`` runs (None: the base model); a model this worker does
        not serve is vLLM's 404."""
        if name is None or name == self.config.model_name:
            return None
        if name in self.config.loras:
            return name
        raise ApiError(f"The model `{name}` does not exist.", 404, "NotFoundError")

    def _endpoint(
        self, parse: Callable[[dict[str, Any], int], GenRequest]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            body = await self._body(request)
            gen = parse(body, self.config.context_len)
            if gen.priority and self.config.model.scheduling_policy != "priority":
                raise ApiError(  # vLLM's answer, word for word
                    f"Got priority {gen.priority} but Priority scheduling is not enabled."
                )
            adapter = self._check_model(gen.model)
            # vLLM's request id: the X-Request-Id header (a PD router sends the same to both)
            base = request.headers.get("x-request-id") or f"{self._rng.getrandbits(64):016x}"
            leg = await self.pd.leg(body, gen, adapter, base, request.scope.get("server"))
            return await self._serve(leg, adapter, base)

        return handle

    async def _serve(self, leg: Leg, adapter: str | None, base_id: str) -> Response:
        """Submit to the model; answer at the finish, or stream from the first token."""
        gen, prompt = leg.gen, leg.gen.prompt
        try:
            handle = self.worker.submit(
                prompt.blocks,
                prompt.input_length,
                gen.max_tokens,
                prompt.tokens,
                adapter,
                kv_transferred=leg.kv_transferred,
                on_end=leg.on_end,
                priority=gen.priority,
            )
        except WorkerUnavailable as exc:
            if leg.on_end is not None:
                leg.on_end(False)
            raise _unavailable(exc) from None
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-", "generate": ""}[gen.kind]
        rid = prefix + base_id
        if gen.stream:
            events = self._events(gen, handle, rid)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            await handle.done
        except WorkerUnavailable as exc:
            raise _unavailable(exc) from None
        latency = self.worker.clock() - handle.submitted
        text = "".join(output_tokens(gen.max_tokens))
        return JSONResponse({**self._reply(gen, handle, rid).full(text, latency), **leg.extra})

    def _reply(self, gen: GenRequest, handle: Handle, rid: str) -> Reply:
        req = handle.request
        return Reply(
            gen.kind,
            rid,
            int(time.time()),
            req.adapter or self.config.model_name,
            req.input_length,
            req.output_length,
            req.cached_tokens,
            req.cpu_cached_tokens if self.worker.model.cpu is not None else None,
        )

    async def _events(self, gen: GenRequest, handle: Handle, rid: str) -> AsyncIterator[bytes]:
        """SSE: OpenAI chunks one token each (SGLang: cumulative text), then [DONE]."""
        tokens = output_tokens(gen.max_tokens)
        reply: Reply | None = None
        sent = 0
        async for ready in self.worker.progress(handle):
            if reply is None:  # cached_tokens is known once the model has admitted it
                reply = self._reply(gen, handle, rid)
                if gen.kind == "chat":
                    yield _sse(reply.role_chunk())
            if gen.kind == "generate":
                latency = self.worker.clock() - handle.submitted
                meta = reply.meta_info(ready, ready == len(tokens), latency)
                yield _sse({"text": "".join(tokens[:ready]), "meta_info": meta})
            else:
                for i in range(sent, ready):
                    yield _sse(reply.chunk(tokens[i], i == len(tokens) - 1))
            sent = ready
        if reply is not None and gen.include_usage:
            yield _sse(reply.usage_chunk())
        yield b"data: [DONE]\n\n"

    async def tokenize(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body.get("model"), str):
            self._check_model(body["model"])
        ids = parse_tokenize(body)
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": self.config.context_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def models(self, request: Request) -> Response:
        name = self.config.model_name
        card = {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "cache-router",
            "root": name,
            "parent": None,
            "max_model_len": self.config.context_len,
        }
        # vLLM's cards of LoRA adapters: root their path, parent the base model
        loras = [
            {**card, "id": lora, "root": f"/loras/{lora}", "parent": name, "max_model_len": None}
            for lora in self.config.loras
        ]
        return JSONResponse({"object": "list", "data": [card, *loras]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.worker.failed is not None else 200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": f"cache-router-sim {__version__}"})

    async def server_info(self, request: Request) -> Response:
        """SGLang's ``/server_info`` (a few fields): the PD role as ``disaggregation_mode``."""
        pd = self.pd
        port = pd.bootstrap.port if pd.bootstrap is not None else None
        return JSONResponse(
            {
                "model_path": self.config.model_name,
                "served_model_name": self.config.model_name,
                "flavor": self.config.flavor,
                "disaggregation_mode": pd.mode,
                "disaggregation_bootstrap_port": port,
                "engine_id": pd.engine_id,
                "version": f"cache-router-sim {__version__}",
            }
        )

    async def kv_pull(self, request: Request) -> Response:
        return JSONResponse(self.pd.kv_pull(await self._body(request)))

    async def metrics(self, request: Request) -> Response:
        self.worker.sync()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def reset_prefix_cache(self, request: Request) -> Response:
        if not self.worker.reset_cache():
            raise ApiError(
                "requests are in flight; the prefix cache was not reset", 409, "ConflictError"
            )
        return Response(status_code=200)


def _unavailable(exc: WorkerUnavailable) -> ApiError:
    return ApiError(f"worker unavailable: {exc}", 503, "ServiceUnavailableError")


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods get OpenAI-style bodies too."""
    assert isinstance(exc, HTTPException)
    names = {404: "NotFoundError", 405: "MethodNotAllowedError"}
    err = ApiError(str(exc.detail), exc.status_code, names.get(exc.status_code, "HTTPError"))
    return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)


async def warm_streaming() -> None:
    """Stream one empty answer through starlette in-process, to nobody.

    Starlette runs a streamed answer (every generation the router forwards) in an anyio task
    group, and anyio imports its asyncio backend and task modules at their first use: done
    by the first request instead, the imports block the worker's event loop for 0.1-0.4 s
    on a loaded host, 2-8 modelled seconds at ``--time-scale 20``, which the opening burst
    of the first policy a sweep runs paid in TTFT (docs/bench-history.md, issue 52 item 5).
    The lifespan's startup runs this before the worker takes requests."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b""

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # no disconnect: the task group cancels this wait
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}
    await StreamingResponse(chunks())(scope, receive, send)


class _StartFirst:
    """ASGI middleware: ``start()`` before the first request (the SGLang bootstrap listener
    of an app run without lifespan; idempotent)."""

    def __init__(self, app: ASGIApp, start: Callable[[], Awaitable[None]]) -> None:
        self.app = app
        self.start = start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.start()
        await self.app(scope, receive, send)


def create_app(config: SimWorkerConfig | None = None) -> Starlette:
    """The ASGI app of one simulated worker (``app.state.worker`` is its RealTimeWorker;
    ``app.state.kv_events`` its KV event publisher or None, closed at shutdown, or by the
    caller when it runs the app without lifespan; ``app.state.pd`` its
    :class:`traces.sim_worker.pd.Disaggregation`: a SGLang prefill binds its bootstrap
    socket here, serves it from the first request or the lifespan's startup, and closes it
    at shutdown, or ``app.state.pd.close()`` by the caller)."""
    config = config or SimWorkerConfig()
    publisher = KVEventPublisher(config.kv_events) if config.kv_events is not None else None
    on_events = publisher.publish if publisher is not None else None
    worker = RealTimeWorker(config.model, config.time_scale, on_events)
    svc = _Service(config, worker)
    post, get = ["POST"], ["GET"]
    responses = ResponsesApi(
        worker, config.model_name, svc._check_model, config.context_len, svc._rng
    )
    one = "/v1/responses/{response_id}"

    async def audio(request: Request) -> Response:
        return await transcriptions(request, config.model_name)

    routes = [
        Route("/v1/responses", responses.create, methods=post),
        Route(one, responses.retrieve, methods=get),
        Route(one, responses.delete, methods=["DELETE"]),
        Route(one + "/cancel", responses.cancel, methods=post),
        Route(one + "/input_items", responses.input_items, methods=get),
        Route("/v1/embeddings", responses.embeddings, methods=post),
        Route("/v1/audio/transcriptions", audio, methods=post),
        Route("/v1/chat/completions", svc._endpoint(parse_chat), methods=post),
        Route("/v1/completions", svc._endpoint(parse_completion), methods=post),
        Route("/generate", svc._endpoint(parse_generate), methods=post),
        Route("/tokenize", svc.tokenize, methods=post),
        Route("/v1/models", svc.models, methods=get),
        Route("/health", svc.health, methods=get),
        Route("/version", svc.version, methods=get),
        Route("/metrics", svc.metrics, methods=get),
        Route("/reset_prefix_cache", svc.reset_prefix_cache, methods=post),
        Route("/flush_cache", svc.reset_prefix_cache, methods=[*post, *get]),  # SGLang's
        Route("/server_info", svc.server_info, methods=get),
        Route("/get_server_info", svc.server_info, methods=get),  # SGLang's older name
    ]
    pd = svc.pd
    if config.pd.role == "prefill" and config.flavor == "vllm":
        routes.append(Route("/sim/kv_pull", svc.kv_pull, methods=post))
    handlers = {ApiError: _api_error, HTTPException: _http_error}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await warm_streaming()
            await pd.start()
            yield
        finally:
            pd.close()
            if publisher is not None:
                publisher.close()

    middleware = [Middleware(_StartFirst, start=pd.start)] if pd.bootstrap is not None else []
    app = Starlette(
        routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware
    )
    app.state.worker = worker
    app.state.pd = pd
    app.state.config = config
    app.state.kv_events = publisher
    return app


# ---- the command -----------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``sim-worker`` on the top-level parser."""
    d = WorkerModelConfig()
    p = subparsers.add_parser(
        "sim-worker",
        help="run a simulated OpenAI-compatible worker (real radix KV cache, batching model)",
        description="The simulator's worker model as an HTTP server with vLLM's API and "
        "metrics and SGLang's /generate. See traces/sim_worker/ and traces/sim/worker_model.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=PORT, default=8000, help="port to bind")
    add_model_options(p, "KV cache size in tokens (whole 512-token blocks)")
    p.add_argument(
        "--max-running", type=COUNT, default=d.max_running, help="running batch size limit"
    )
    p.add_argument(
        "--eviction-policy",
        choices=list(EVICTION_POLICIES),
        default=d.eviction_policy,
        help="KV cache eviction order",
    )
    p.add_argument(
        "--max-model-len",
        type=MODEL_LEN,
        default=None,
        help="longest prompt + output accepted (default: the KV capacity)",
    )
    p.add_argument("--model-name", default="sim-model", help="served model name")
    p.add_argument(
        "--lora",
        nargs="+",
        default=[],
        metavar="NAME",
        help="LoRA adapters of the model served (see --max-loras, --lora-load-ms)",
    )
    p.add_argument(
        "--time-scale",
        type=POSITIVE,
        default=1.0,
        help="model seconds per real second (>1 runs faster than real time)",
    )
    p.add_argument("--seed", type=SEED, default=None, help="seed for response ids")
    p.add_argument(
        "--flavor",
        choices=FLAVORS,
        default="vllm",
        help="the engine imitated: /metrics names and the KV event encoding",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish KV events, as vLLM's / SGLang's flag of this name: "
        '\'{"publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558", "topic": ""}\'',
    )
    p.add_argument(
        "--kv-events-bind",
        action="store_true",
        help="bind the events endpoint even when it names a host (engines connect then)",
    )
    p.add_argument(
        "--kv-events-drop",
        default="",
        metavar="SEQ,...",
        help="tests: batches with these sequence numbers are kept for replay, never sent",
    )
    pd = PdConfig()
    g = p.add_argument_group(
        "disaggregated prefill/decode",
        "serve one side of PD serving, in the protocol of --flavor: vllm is the "
        "NixlConnector's (kv_transfer_params; a decode pulls from the prefill's "
        "POST /sim/kv_pull), sglang is mini_lb's (bootstrap_host/port/room; a decode polls "
        "GET /sim/room/{room} on the prefill's bootstrap port). See traces/sim_worker/pd.py.",
    )
    g.add_argument(
        "--role",
        choices=ROLES,
        default=pd.role,
        help="both: aggregated (PD fields ignored); prefill / decode: one side of PD",
    )
    kv_transfer.add_options(g, pd, " (model time, scaled by --time-scale)")
    g.add_argument(
        "--disaggregation-bootstrap-port",
        type=PORT,
        default=DEFAULT_BOOTSTRAP_PORT,
        help="SGLang prefill: the bootstrap listener's port, a second socket on --host "
        "(0: a free one, printed at start)",
    )
    g.add_argument(
        "--kv-hold-s",
        type=SECONDS,
        default=pd.kv_hold_s,
        help="prefill: real seconds a finished prefill's KV waits for its decode to pull it",
    )
    g.add_argument(
        "--kv-wait-timeout-s",
        type=SECONDS,
        default=pd.kv_wait_timeout_s,
        help="SGLang decode: real seconds it polls for its bootstrap room before a 503",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn log level (access logs are off)",
    )
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> SimWorkerConfig:
    model = model_config_from_args(
        args, max_running=args.max_running, eviction_policy=args.eviction_policy
    )
    events = None
    if args.kv_events_config:
        try:
            raw = json.loads(args.kv_events_config)
        except ValueError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        drop = [int(x) for x in args.kv_events_drop.split(",") if x.strip()]
        bind = True if args.kv_events_bind else None
        events = config_from_json(raw, args.flavor, bind, drop)
    return SimWorkerConfig(
        model,
        args.model_name,
        args.time_scale,
        args.seed,
        args.max_model_len,
        flavor=args.flavor,
        kv_events=events,
        loras=tuple(args.lora),
        pd=PdConfig(
            role=args.role,
            **kv_transfer.from_args(args, PdConfig()),
            bootstrap_port=args.disaggregation_bootstrap_port,
            kv_hold_s=args.kv_hold_s,
            kv_wait_timeout_s=args.kv_wait_timeout_s,
            host=args.host,
        ),
    )


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        config = config_from_args(args)
        app = create_app(config)
    except (ValueError, OSError) as exc:
        return refuse("sim-worker", exc)
    bootstrap = app.state.pd.bootstrap
    if bootstrap is not None:
        print(
            f"cache-router sim-worker: SGLang bootstrap server on {args.host}:{bootstrap.port}",
            file=sys.stderr,
            flush=True,
        )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
    )
    return 0

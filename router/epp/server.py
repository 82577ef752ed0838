"""``cache-router epp``: the router's picker as an endpoint picker for inference gateways.

    cache-router epp --worker http://10.0.0.5:8000 http://10.0.0.6:8000 [--plaintext]

A gateway conformant with the Gateway API Inference Extension (Envoy Gateway, kgateway,
Istio, GKE, agentgateway; or a plain Envoy with an ext_proc filter) asks this server, over
Envoy's external processing gRPC service, which model server each request goes to
(:mod:`router.epp.processor`), and moves the bytes itself. One process runs two servers on
one event loop and one router core:

- ``--port`` (9002): gRPC, ``envoy.service.ext_proc.v3.ExternalProcessor`` and the standard
  health service; TLS with a certificate made at start (or ``--cert-path``/``--key-path``),
  or ``--plaintext``;
- ``--http-port`` (9090): the router's HTTP side, as ``serve`` has it: ``/metrics`` (the same
  ``cache_router_*`` families), ``/health``, ``/workers`` and the admin API, ``/dashboard``.

Every other option is ``serve``'s (workers, discovery, picker, shadows, worker metrics, KV
events, ``--state-url``, ``--processes``: N processes on both ports, sharing state as
``serve``'s do; a gateway spreads its HTTP/2 connections over them, so give it several: see
``max_concurrent_streams`` in router/epp/envoy_config.py). ``serve``'s admission limits hold
for the gateway's requests where the gateway does not hold them itself: in flight (429), body
size (413), open streams (503); each flag's help says how. SIGTERM: the health service says
NOT_SERVING, new streams are refused, streams in flight get ``shutdown_timeout_s`` to finish;
with ``--flow-control`` those held in its queue are answered an ImmediateResponse 503
``shutdown`` (Retry-After) at once (the HTTP server's drain closes the queue).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from router.config import Settings

log = logging.getLogger("cache_router.epp")

GRPC_PORT = 9002
HTTP_PORT = 9090
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# How serve's admission limits and client checks apply to the gateway's requests (ext_proc);
# the HTTP port (--http-port: admin, metrics) keeps the connection and header limits, as serve.
LIMIT_NOTES = {
    "max_inflight": "epp: the gateway's requests too, from their headers to their response's "
    "end, in the same count",
    "max_body_bytes": "epp: the gateway's request bodies too (413)",
    "max_connections": "epp: also the ext_proc streams open at once, one per request in the "
    "gateway (503)",
    "max_header_bytes": "epp: its HTTP port only; the gateway reads its clients' headers under "
    "its own limit (Envoy: max_request_headers_kb) and sends them parsed",
    "request_read_timeout_s": "epp: its HTTP port only; the gateway times its clients (Envoy: "
    "request_timeout, stream_idle_timeout) and its EPP streams (message_timeout)",
    "api_keys": "epp: its HTTP port only; the gateway's requests are not checked: the gateway "
    "authenticates its clients",
    "worker_api_key": "epp: not used for the gateway's requests: the gateway sends them to the "
    "workers with the headers it has",
}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from router.service.command import add_settings_arguments
    from router.validation import PORT, PORT_GIVEN

    p = sub.add_parser(
        "epp",
        help="run the router's picker as an endpoint picker (ext_proc) for inference gateways",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_arguments(p, skip=("port",))
    for action in p._actions:  # serve's flags: say which limits hold here, and how
        note = LIMIT_NOTES.get(action.dest)
        if note is not None:
            action.help = f"{action.help} [{note}]"
    p.add_argument(
        "--port", dest="grpc_port", type=PORT, default=GRPC_PORT, help="gRPC (ext_proc) port"
    )
    p.add_argument(
        "--http-port", dest="port", type=PORT, default=HTTP_PORT,
        help="HTTP port: /metrics, /health, /workers, admin, dashboard",
    )  # fmt: skip
    p.add_argument("--plaintext", action="store_true", help="gRPC without TLS")
    p.add_argument("--cert-path", help="PEM certificate for gRPC TLS (default: made at start)")
    p.add_argument("--key-path", help="PEM key of --cert-path")
    p.add_argument(
        "--print-envoy-config", metavar="LISTEN_PORT", type=PORT_GIVEN,
        help="print a standalone Envoy gateway's configuration (listening on LISTEN_PORT, "
        "asking this EPP at --host:--port) and exit",
    )  # fmt: skip
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from router.epp.tls import key_and_certificate
    from router.service.command import settings_from_args
    from router.service.uvicorn_support import problem
    from router.validation import refuse

    if args.print_envoy_config is not None:
        from router.epp.envoy_config import gateway_config, render

        host = args.host or "127.0.0.1"
        config = gateway_config(
            args.print_envoy_config, 9901, args.grpc_port, tls=not args.plaintext,
            epp_host="127.0.0.1" if host in ("0.0.0.0", "::") else host, listen="0.0.0.0",
        )  # fmt: skip
        print(render(config), end="")
        return 0
    unsupported = problem()
    if unsupported is not None:
        return refuse("epp", unsupported)
    try:
        settings = settings_from_args(args)
        tls = None if args.plaintext else key_and_certificate(args.cert_path, args.key_path)
    except (ValueError, OSError) as exc:
        return refuse("epp", exc)
    if settings.prefill_workers or settings.decode_workers:
        return refuse(
            "epp",
            "--prefill/--decode: a disaggregated fleet needs its two legs sent by the router "
            "itself (cache-router serve); the endpoint picker names one endpoint per request",
        )
    if settings.engine_priority:
        return refuse(
            "epp",
            "--engine-priority: the router writes each request's priority into the body it "
            "sends (cache-router serve); the endpoint picker does not rewrite request bodies",
        )
    if settings.dispatch_hold_tokens and "dispatch_hold_tokens" in settings.model_fields_set:
        return refuse(
            "epp",
            "--dispatch-hold-tokens: the router holds each request until its worker has room "
            "and sends it itself (cache-router serve); the endpoint picker only names one",
        )
    settings = settings.model_copy(update={"dispatch_hold_tokens": 0})  # serve's default
    if settings.process_count() > 1:
        from router.service.supervisor import SetupError, _probe_port, main_processes

        try:  # the gRPC port is shared too (SO_REUSEPORT): refuse one held by another program
            _probe_port(settings.host, args.grpc_port)
        except SetupError as exc:
            return refuse("epp", exc)
        return main_processes(settings, getattr(args, "argv", None) or sys.argv[1:])
    run(settings, args.grpc_port, tls)
    return 0


def run(settings: Settings, grpc_port: int, tls: tuple[bytes, bytes] | None) -> None:
    """Serve gRPC and HTTP until SIGTERM / SIGINT, then drain and return."""
    import uvloop

    from router.service.command import raise_fd_limit, setup_logging, tune_gc

    setup_logging(settings)
    raise_fd_limit(settings)
    tune_gc()
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvloop.run(serve(settings, grpc_port, tls))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def serve(settings: Settings, grpc_port: int, tls: tuple[bytes, bytes] | None) -> None:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from router.epp.endpoints import Endpoints
    from router.epp.service import ExternalProcessor
    from router.fleet import periodic
    from router.service.app import create_app
    from router.service.command import process_sockets
    from router.service.server import Server, build_config

    app = create_app(settings)
    config = build_config(app, settings)
    sockets = process_sockets(settings, config)  # one of several processes: shared ports
    http = Server(config, app)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if settings.reuse_port else 0)])
    endpoints = Endpoints(settings.discover_interval_s)
    processor = ExternalProcessor(app.core, settings.session_header.lower(), endpoints)
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    address = f"{settings.host}:{grpc_port}"
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    await endpoints.refresh(app.pool.workers)  # the configured workers' names, before serving
    resolving = asyncio.get_running_loop().create_task(endpoints.run(app.pool))
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", SERVICE):
        await checks.set(name, serving)
    log.info(
        "cache-router epp: gRPC on %s (%s), HTTP on %s:%d",
        address, "plaintext" if tls is None else "TLS", settings.host, settings.port,
    )  # fmt: skip
    try:
        await http.serve(sockets=sockets)  # until SIGTERM / SIGINT (uvicorn's), drained
    finally:
        await checks.enter_graceful_shutdown()
        await server.stop(grace=settings.shutdown_timeout_s)
        await periodic.cancel(resolving)

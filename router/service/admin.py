"""The JSON endpoints around the hot path (FastAPI): models, health, metrics, workers.

- ``GET /v1/models``: every healthy worker's model list, merged by id;
- ``GET /health``: 200 while a generation request can be served (a healthy aggregated
  worker, or a healthy prefill and a healthy decode worker), else 503; the healthy workers
  in all and by role;
- ``GET /metrics``: the Prometheus exposition of this app's registry (under ``--processes``,
  of every process's, labelled: :mod:`router.service.process_metrics`);
- ``GET /workers``: one object per worker (load, shadow, estimate vs report, models);
- ``GET /workers/discovery``: each ``--discover`` source, the workers it lists, its errors;
- ``GET /workers/flow``: with ``--flow-control``, the queue (queued requests and bytes per
  priority band and flow, dispatched and refused counts, the latest predicted TTFT);
  ``{"enabled": false}`` without;
- ``POST /workers`` ``{"url": ..., "kv_capacity_tokens": ...}`` (or ``?url=``) adds a worker,
  ``DELETE /workers`` ``{"url": ...}`` (or ``?url=``) removes one; both need the admin key
  (``Authorization: Bearer KEY`` or ``X-Admin-Key: KEY``) when one is configured.

Errors use the OpenAI envelope, like the proxy's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from router.core.access import Need, Verdict
from router.core.errors import (
    BadRequest,
    NoHealthyWorkerError,
    NotFound,
    RouterError,
    Unauthorized,
    echo,
    error_body,
)
from router.fleet.pool import BOTH, ROLES, WorkerPool
from router.fleet.upstream import UpstreamError
from router.service import process_metrics
from router.service.context import RouterContext

MODELS_TIMEOUT_S = 5.0
log = logging.getLogger("cache_router.admin")


def _json(data: Any, status: int = 200) -> Response:
    try:
        body = orjson.dumps(data)
    except orjson.JSONEncodeError:  # orjson stops at 64-bit ints (a capacity flag past 2**63)
        body = json.dumps(data, default=str).encode()
    return Response(body, status_code=status, media_type="application/json")


def _error(error: RouterError) -> Response:
    return Response(error.body(), status_code=error.status, media_type="application/json")


def build_admin(app: RouterContext) -> FastAPI:
    """The FastAPI application serving every path but the generation endpoints."""
    api = FastAPI(title="cache-router", docs_url=None, redoc_url=None, openapi_url=None)
    pool = app.pool

    @api.exception_handler(RouterError)
    async def _router_error(_: Request, exc: RouterError) -> Response:
        return _error(exc)

    @api.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else "invalid_request"
        body = error_body(str(exc.detail), "invalid_request_error", code)
        return Response(body, status_code=exc.status_code, media_type="application/json")

    @api.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return _error(BadRequest(str(exc.errors())))

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # a bug: still the JSON envelope (Starlette's default is a text/plain 500)
        log.error("unexpected error on %r", request.scope.get("path"), exc_info=exc)
        return _error(RouterError("internal error in the router"))

    def check_admin(request: Request) -> None:
        """The admin key (router.core.access; RouterApp checks it first, this guards the app
        when it is mounted some other way)."""
        if app.access.check(Need.ADMIN, request.scope["headers"]) is not Verdict.OK:
            raise Unauthorized("admin key required", code="invalid_admin_key")

    async def target(request: Request) -> dict[str, Any]:
        """The worker named by ``?url=`` or a JSON body ``{"url": ...}``."""
        data: dict[str, Any] = {}
        raw = await request.body()
        if raw:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise BadRequest("request body is not valid JSON", code="invalid_json") from None
            if not isinstance(data, dict):
                raise BadRequest("request body must be a JSON object", code="invalid_json")
        url = request.query_params.get("url") or data.get("url")
        if not isinstance(url, str) or not url:
            raise BadRequest("missing 'url'", code="missing_field")
        data["url"] = url
        return data

    @api.get("/health")
    async def health() -> Response:
        healthy = sum(1 for w in pool.workers if w.healthy)
        status = "draining" if app.draining else "ok" if pool.can_serve() else "unavailable"
        body = {
            "status": status,
            "healthy_workers": healthy,
            "workers": len(pool.workers),
            "healthy_by_role": pool.healthy_by_role(),
        }
        if app.state_sync is not None:
            body["state_sync"] = app.state_sync.describe()
        return _json(body, 200 if status == "ok" else 503)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        own = generate_latest(app.metrics.registry)
        process_socket = app.settings.process_socket
        if process_socket is not None and request.query_params.get("scope") != "process":
            own = await process_metrics.gather(Path(process_socket), own)
        return Response(own, media_type=CONTENT_TYPE_LATEST)

    @api.get("/workers")
    async def list_workers() -> Response:
        return _json([w.describe() for w in pool.workers])

    @api.get("/workers/discovery")
    async def discovery() -> Response:
        sources = app.discovery.describe() if app.discovery is not None else []
        return _json({"sources": sources})

    @api.get("/workers/flow")
    async def flow() -> Response:
        control = app.core.flow
        return _json({"enabled": False} if control is None else control.describe())

    @api.post("/workers")
    async def add_worker(request: Request) -> Response:
        check_admin(request)
        data = await target(request)
        capacity = data.get("kv_capacity_tokens")
        if capacity is not None and (not isinstance(capacity, int) or capacity <= 0):
            raise BadRequest("'kv_capacity_tokens' must be a positive integer")
        role = data.get("role", BOTH)
        if role not in ROLES:
            raise BadRequest(f"'role' must be one of {', '.join(ROLES)}")
        port = data.get("bootstrap_port")
        if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
            raise BadRequest("'bootstrap_port' must be a port number")
        try:
            worker = app.membership.add(data["url"], capacity, role, port)
        except ValueError as exc:
            status = 409 if "already" in str(exc) else 400
            err = BadRequest(str(exc), code="worker_exists" if status == 409 else "invalid_url")
            err.status = status
            raise err from None
        return _json(worker.describe(), 201)

    @api.delete("/workers")
    async def remove_worker(request: Request) -> Response:
        check_admin(request)
        data = await target(request)
        try:
            worker = app.membership.remove(data["url"])
        except KeyError:
            raise NotFound(f"no worker {echo(str(data['url']))}", code="worker_not_found") from None
        except ValueError as exc:
            raise BadRequest(str(exc), code="invalid_url") from None
        return _json(worker.describe())

    @api.get("/v1/models")
    async def models() -> Response:
        return _json(await fleet_models(pool))

    return api


async def fleet_models(pool: WorkerPool) -> dict[str, Any]:
    """``GET /v1/models``: every healthy worker's model list, merged by id; 503 when none
    answered. ``serve``'s answer, and the endpoint picker's for its gateway."""

    async def one(worker) -> list[dict[str, Any]]:
        try:
            status, body = await asyncio.wait_for(
                worker.upstream.fetch("GET", "/v1/models", timeout=MODELS_TIMEOUT_S),
                MODELS_TIMEOUT_S,
            )
            data = orjson.loads(body) if status == 200 else {}
        except (UpstreamError, TimeoutError, orjson.JSONDecodeError):
            return []
        items = data.get("data") if isinstance(data, dict) else None
        return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else []

    merged: dict[str, dict[str, Any]] = {}
    answered = 0
    for items in await asyncio.gather(*(one(w) for w in pool.healthy_workers())):
        answered += bool(items)
        for model in items:
            merged.setdefault(str(model.get("id")), model)
    if not answered:
        raise NoHealthyWorkerError("no worker answered /v1/models")
    return {"object": "list", "data": list(merged.values())}

"""Errors the router answers itself, as OpenAI-style JSON bodies.

Each failure the proxy can report is one exception type with its HTTP status, so request
handling raises and a single place turns the exception into ``{"error": {"message", "type",
"code"}}``. A worker's own error responses are never rewritten: they pass through as they are.
What a message repeats of the client's input (a model name, a response id) goes
through :func:`echo`, bounded: a client's megabyte-long name is not sent back whole.
"""

from __future__ import annotations

import orjson


class RouterError(Exception):
    """A request the router answers itself with ``status`` and an OpenAI-style body."""

    status = 500
    type = "internal_error"
    code = "internal_error"

    def __init_subclass__(cls, *, status: int, error_type: str, code: str, **kw) -> None:
        """Each subclass states its answer in its header: status, OpenAI ``type`` and code."""
        super().__init_subclass__(**kw)
        cls.status, cls.type, cls.code = status, error_type, code

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code)


class BadRequest(
    RouterError, status=400, error_type="invalid_request_error", code="invalid_request"
):
    """Malformed JSON, a missing or mistyped field."""


class Unauthorized(
    RouterError, status=401, error_type="authentication_error", code="invalid_api_key"
):
    """Missing or wrong API / admin key."""


class Forbidden(RouterError, status=403, error_type="permission_error", code="forbidden"):
    """The action is switched off (admin changes without an admin key configured)."""


class NotFound(RouterError, status=404, error_type="invalid_request_error", code="not_found"):
    """An unknown path, or a worker that is not in the pool."""


class ModelNotFound(
    RouterError, status=404, error_type="invalid_request_error", code="model_not_found"
):
    """No worker serves the model the request names (OpenAI's and vLLM's 404)."""


class ResponseNotFound(
    RouterError, status=404, error_type="invalid_request_error", code="response_not_found"
):
    """A Responses API id the router has not seen a worker store (the engines keep stored
    responses in each server's memory: only the worker that made one can continue it)."""


class ResponseOwnerGone(
    RouterError, status=404, error_type="invalid_request_error", code="response_owner_gone"
):
    """The worker that stored a response has left the fleet, and the response with it."""


class PayloadTooLarge(
    RouterError, status=413, error_type="invalid_request_error", code="request_too_large"
):
    """The request body exceeds ``max_body_bytes``."""


class TooManyRequests(
    RouterError, status=429, error_type="rate_limit_error", code="router_overloaded"
):
    """Admission control: ``max_inflight`` requests are being handled (Retry-After)."""


class ServiceUnavailable(
    RouterError, status=503, error_type="service_unavailable", code="unavailable"
):
    """The router cannot take this request now: draining, or over its connection limit."""


def shutting_down(message: str) -> ServiceUnavailable:
    """A request the router held when it stopped (code ``shutdown``, Retry-After): another
    replica, or this one restarted, can take it."""
    return ServiceUnavailable(message, code="shutdown")


class BadGateway(RouterError, status=502, error_type="upstream_error", code="upstream_unavailable"):
    """Every attempted worker failed before answering (connect error, reset)."""


class NoHealthyWorkerError(
    RouterError, status=503, error_type="service_unavailable", code="no_healthy_worker"
):
    """No worker is healthy (or none is configured)."""


class ResponseOwnerUnavailable(
    RouterError, status=503, error_type="service_unavailable", code="response_owner_unavailable"
):
    """The worker that stored a response is in the fleet but not healthy now (Retry-After)."""


class GatewayTimeout(RouterError, status=504, error_type="upstream_error", code="upstream_timeout"):
    """The worker sent nothing within ``read_timeout_s``."""


ECHO_MAX = 256  # characters of a client's string an error message repeats


def echo(text: str, limit: int = ECHO_MAX) -> str:
    """``text`` from the client as an error message repeats it: whole up to ``limit``
    characters, else its start, an ellipsis and its length (the client knows the rest)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def error_body(message: str, type_: str, code: str) -> bytes:
    """The OpenAI error envelope as JSON bytes."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code}})


JSON_HEADERS = [(b"content-type", b"application/json")]
RETRY_AFTER = (b"retry-after", b"1")  # 429 / 503: the client may try again in a second
RETRY_STATUSES = frozenset({429, 503})  # the answers that say Retry-After


async def send_error(send, error: RouterError, extra_headers: list | None = None) -> None:
    """Answer an ASGI request with ``error`` (status, JSON body, content-length; a 429 or
    503 also says ``Retry-After``)."""
    body = error.body()
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if error.status in RETRY_STATUSES:
        headers.append(RETRY_AFTER)
    if extra_headers:
        headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

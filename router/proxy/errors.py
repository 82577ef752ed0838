"""Errors the router answers itself, as OpenAI-style JSON bodies.

Each failure the proxy can report is one exception type with its HTTP status, so request
handling raises and a single place turns the exception into ``{"error": {"message", "type",
"code"}}``. A worker's own error responses are never rewritten: they pass through as they are.
"""

from __future__ import annotations

import orjson


class RouterError(Exception):
    """A request the router answers itself with ``status`` and an OpenAI-style body."""

    status = 500
    type = "internal_error"
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code)


class BadRequest(RouterError):
    """Malformed JSON, a missing or mistyped field."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(RouterError):
    """Missing or wrong API / admin key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(RouterError):
    """The action is switched off (admin changes without an admin key configured)."""

    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(RouterError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(RouterError):
    """The request body exceeds ``max_body_bytes``."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class TooManyRequests(RouterError):
    """Admission control: ``max_inflight`` requests are being handled (Retry-After)."""

    status = 429
    type = "rate_limit_error"
    code = "router_overloaded"


class ServiceUnavailable(RouterError):
    """The router cannot take this request now: draining, or over its connection limit."""

    status = 503
    type = "service_unavailable"
    code = "unavailable"


class BadGateway(RouterError):
    """Every attempted worker failed before answering (connect error, reset)."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class NoHealthyWorkerError(RouterError):
    """No worker is healthy (or none is configured)."""

    status = 503
    type = "service_unavailable"
    code = "no_healthy_worker"


class GatewayTimeout(RouterError):
    """The worker sent nothing within ``read_timeout_s``."""

    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def error_body(message: str, type_: str, code: str) -> bytes:
    """The OpenAI error envelope as JSON bytes."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code}})


JSON_HEADERS = [(b"content-type", b"application/json")]
RETRY_AFTER = (b"retry-after", b"1")  # 429 / 503: the client may try again in a second


async def send_error(send, error: RouterError, extra_headers: list | None = None) -> None:
    """Answer an ASGI request with ``error`` (status, JSON body, content-length; a 429 or
    503 also says ``Retry-After``)."""
    body = error.body()
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if error.status in (429, 503):
        headers.append(RETRY_AFTER)
    if extra_headers:
        headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

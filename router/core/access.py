"""Who may do what: client API keys, the admin key, and which paths each guards.

The rules (``--api-key`` repeatable or ``CACHE_ROUTER_API_KEYS``, ``--admin-key`` or
``CACHE_ROUTER_ADMIN_KEY``):

- generation endpoints and ``GET /v1/models``: a client key (``Authorization: Bearer KEY``)
  when any is configured; the admin key works there too (an operator can test the fleet);
- ``POST`` / ``DELETE /workers``: the admin key (``Authorization: Bearer KEY`` or
  ``X-Admin-Key: KEY``). With client keys configured but no admin key these changes are
  refused (403): turning authentication on must not leave the fleet's membership open to
  anyone (a new worker URL receives client traffic);
- ``GET /metrics``, ``GET /workers``, ``/dashboard/data``: open, like Prometheus targets
  usually are, unless ``--metrics-require-key`` (then a client or the admin key);
- ``GET /health`` and the ``/dashboard`` page itself: always open (load balancers and
  orchestrators probe without credentials; the page holds no data).

Comparisons are constant-time (:func:`hmac.compare_digest`) over every configured key, so
the time to refuse does not depend on how much of a key was right. Keys are kept as bytes
here only; everywhere else they are :class:`pydantic.SecretStr` and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from enum import Enum

from router.config import Settings

BEARER = b"bearer "
ADMIN_HEADER = b"x-admin-key"
OBSERVABILITY_PATHS = frozenset({"/metrics", "/workers", "/workers/discovery", "/dashboard/data"})


class Need(Enum):
    """What a request needs."""

    NOTHING = "nothing"
    CLIENT = "client"  # a client key (or the admin key), when client keys are configured
    OBSERVER = "observer"  # a client or the admin key, when any key is configured
    ADMIN = "admin"  # the admin key


class Verdict(Enum):
    OK = "ok"
    UNAUTHORIZED = "unauthorized"  # 401: no or a wrong key
    FORBIDDEN = "forbidden"  # 403: the action is switched off (no admin key configured)


def _bearer(value: bytes | None) -> bytes | None:
    if value is None or len(value) <= len(BEARER) or value[:7].lower() != BEARER:
        return None
    return value[7:].strip()


def _matches(given: bytes | None, keys: Iterable[bytes]) -> bool:
    """Constant-time membership: every key is compared, whatever matched before."""
    if given is None:
        return False
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


class Access:
    """The configured keys and the per-path rules above."""

    def __init__(self, settings: Settings) -> None:
        client = [k.get_secret_value().encode() for k in settings.api_keys]
        admin = settings.admin_key
        self.admin_key = admin.get_secret_value().encode() if admin is not None else None
        self.client_keys = client
        # the admin key is accepted wherever a client key is
        self.any_keys = client + ([self.admin_key] if self.admin_key is not None else [])
        self.metrics_require_key = settings.metrics_require_key

    def need(self, method: str, path: str) -> Need:
        """What ``method path`` needs (generation endpoints: :meth:`client_ok`)."""
        if path == "/workers" and method in ("POST", "DELETE"):
            return Need.ADMIN
        if path == "/v1/models":
            return Need.CLIENT
        if path in OBSERVABILITY_PATHS and self.metrics_require_key:
            return Need.OBSERVER
        return Need.NOTHING

    def check(self, need: Need, headers: Iterable[tuple[bytes, bytes]]) -> Verdict:
        """The verdict for a request needing ``need`` with these (lower-case) headers."""
        if need is Need.NOTHING or not self.any_keys:
            return Verdict.OK  # no key configured at all: everything is open
        if need is Need.CLIENT and not self.client_keys:
            return Verdict.OK  # only an admin key: clients are not checked
        auth = admin_header = None
        for name, value in headers:
            if name == b"authorization":
                auth = value
            elif name == ADMIN_HEADER:
                admin_header = value.strip()
        bearer = _bearer(auth)
        if need is Need.ADMIN:
            if self.admin_key is None:
                return Verdict.FORBIDDEN  # client keys only: membership changes are off
            given = admin_header if admin_header is not None else bearer
            return Verdict.OK if _matches(given, (self.admin_key,)) else Verdict.UNAUTHORIZED
        given = bearer if bearer is not None else admin_header
        return Verdict.OK if _matches(given, self.any_keys) else Verdict.UNAUTHORIZED

    def client_ok(self, auth: bytes | None) -> bool:
        """The hot path's check: ``auth`` is the raw Authorization header value (or None)."""
        return not self.client_keys or _matches(_bearer(auth), self.any_keys)

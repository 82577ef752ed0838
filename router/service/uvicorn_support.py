"""The uvicorn releases the proxy's server runs on, checked before it serves.

:mod:`router.service.server` subclasses uvicorn's httptools protocol and request cycle and
inlines parts of their methods: private internals that move between releases (0.50.0 gave
the protocol the ``asgi_version`` attribute the inlined request start reads; under 0.49 the
router started and then answered every request 400). ``pyproject.toml`` therefore allows
only the range the test suite has passed on, and the server checks the installed release
against it at import, so a wrong uvicorn fails at start with the range, never at the first
request. Widening the range is one reviewed change: the bound here and in pyproject.toml
(a test holds them equal), then the suite on both ends
(tests/router/service/test_uvicorn_support.py).
"""

from __future__ import annotations

import re

import uvicorn

SUPPORTED = ("0.50.0", "0.55")
"""Lowest supported release, first unsupported one (pyproject.toml's ``uvicorn>=A,<B``)."""
SPEC = f">={SUPPORTED[0]},<{SUPPORTED[1]}"


class UnsupportedUvicorn(RuntimeError):
    """The installed uvicorn is outside :data:`SUPPORTED`."""


def release(version: str) -> tuple[int, ...]:
    """The numeric release of ``version`` ("0.50.2" -> (0, 50, 2); "0.55.0rc1" -> (0, 55, 0))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group().split("."))


def problem(version: str | None = None) -> str | None:
    """Why ``version`` (default: the installed uvicorn) cannot run the proxy, or None."""
    version = version or uvicorn.__version__
    low, high = (release(v) for v in SUPPORTED)
    if low <= release(version) < high:
        return None
    return (
        f"uvicorn {version} is installed, but cache-router's HTTP server runs on uvicorn{SPEC} "
        "only (it builds on uvicorn internals that change between releases). Install the "
        f"tested set (pip install -c requirements/runtime.lock cache-router) or "
        f"pip install 'uvicorn{SPEC}'."
    )


def require_supported() -> None:
    """Raise :class:`UnsupportedUvicorn`, naming the range, unless uvicorn is in it."""
    message = problem()
    if message is not None:
        raise UnsupportedUvicorn(message)

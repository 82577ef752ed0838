"""``GET /dashboard``: a live page of the workers, served by the router itself.

Why in the router and not only in Grafana (``deploy/grafana``): a router answering on a
port is all an operator needs to see what it is doing right now, also where no
Prometheus / Grafana runs and without internet. So the page is one self-contained HTML
document: inline CSS and vanilla JavaScript, no CDN, no fonts, no images, no build step.

What it shows. It polls ``GET /workers`` (the same per-worker objects the admin API
returns) and ``GET /dashboard/data`` (the few pool-wide counters ``/workers`` lacks:
policy, shadow, picker branch counts, retries, counters by model) about once a second with
``fetch()``, and updates in place:

- a table, one row per worker: the models it serves (its LoRA adapters on hover), health,
  in flight, pending prefill tokens, requests,
  requests/s, prompt tokens, estimated hit rate (the picker's booked estimate / prompt
  tokens), reported hit rate (the worker's own cached tokens, in router units, / prompt
  tokens; shown once the worker reported on at least one request, with that count beside
  it), shadow blocks (pinned / held / capacity);
- a table, one row per model requests named (a model some worker serves, ``none`` or
  ``other``: bounded): requests, prompt tokens, estimated and reported hit rates;
- three small canvas charts over a rolling window (30 s on a fresh page, growing to two
  minutes): in flight per worker, requests/s per worker, and the fleet's estimated vs
  reported hit rate over the last 10 s of traffic (a gap where no prompt tokens arrived).
  Where workers report, both lines are over the same requests (the picker's shadow's
  estimate and the report, counted when the report arrives), so the gap between them is
  the shadow's error; where none does, the estimate line is the booked estimates.

Safety. Every value from the server goes into the DOM as ``textContent`` (never
``innerHTML``), worker URLs included. The page is static, so a Content-Security-Policy
allows exactly its own inline script and style (by SHA-256 hash), ``fetch`` to its own
origin only, and nothing else.

Access (the rules live in :mod:`router.core.access`). The HTML carries no data, so
``GET /dashboard`` needs no key: the page always loads. Its data, ``GET /workers`` and
``GET /dashboard/data``, has the access of ``/metrics``: open, unless
``--metrics-require-key`` (then a client or the admin key). ``/dashboard/data`` holds only
counters ``/metrics`` already exports. When a data request answers 401/403 the page asks
for a key and sends it as ``Authorization: Bearer KEY`` (kept in ``sessionStorage``;
``/dashboard#key=KEY`` works too, and a fragment never reaches the server or its logs).

The page is package data (``router/service/dashboard_page/``: ``index.html``, ``dashboard.css``,
``dashboard.js``), read once at import; the style and script are inlined into the document.

Paths are resolved relative to the page (``…/dashboard`` → ``…/workers``), so the page
also works behind a reverse proxy that serves the router under a path prefix.
"""

from __future__ import annotations

import base64
import hashlib
import time
from importlib import resources
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from router.service.context import RouterContext

_FILES = resources.files("router.service") / "dashboard_page"  # package data


def _read(name: str) -> str:
    return (_FILES / name).read_text(encoding="utf-8")


_STYLE = _read("dashboard.css")
_SCRIPT = _read("dashboard.js")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _page() -> bytes:
    """index.html with dashboard.css and dashboard.js inlined (one document, one request)."""
    html = _read("index.html")
    for empty, full in (
        ("<style></style>", f"<style>{_STYLE}</style>"),
        ("<script></script>", f"<script>{_SCRIPT}</script>"),
    ):
        assert html.count(empty) == 1, empty
        html = html.replace(empty, full)
    return html.encode()


PAGE = _page()
"""The whole page, built once at import (it holds no data)."""

HEADERS = {
    # Exactly the page's own inline script and style; data from this origin only.
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load, so an upgraded router serves its own page at once.
    "Cache-Control": "no-cache",
}


def summary(app: RouterContext, started: float) -> dict[str, Any]:
    """``GET /dashboard/data``: what the page needs that ``/workers`` does not carry."""
    settings, pool = app.settings, app.pool
    stats = pool.stats
    return {
        "policy": settings.policy,
        "shadow": settings.shadow,
        "tokenizer": settings.tokenizer,
        "workers": len(pool.workers),
        "healthy_workers": sum(1 for w in pool.workers if w.healthy),
        "decisions": {str(k): v for k, v in stats.decisions.items()},
        "retries": {str(k): v for k, v in stats.retries.items()},
        "unrouted": {str(k): v for k, v in stats.unrouted.items()},
        "models": {
            label: {
                "requests": sum(m.requests.values()),
                "prompt_tokens": m.prompt_tokens,
                "estimated_hit_tokens": m.estimated_hit_tokens,
                "reported_requests": m.reported_requests,
                "reported_prompt_tokens": m.reported_prompt_tokens,
                "reported_cached_tokens": m.reported_cached_tokens,
            }
            for label, m in stats.models.items()
        },
        "uptime_s": round(time.monotonic() - started, 1),
        "flow": app.core.flow.describe() if app.core.flow is not None else None,
    }


def mount_dashboard(api: FastAPI, app: RouterContext) -> None:
    """Add ``GET /dashboard`` and ``GET /dashboard/data`` to the admin app of ``app``.

    On the admin app (not the raw ASGI dispatch), behind the access rules every admin
    request passes, so the page's data is guarded exactly as ``/workers`` is.
    """
    started = time.monotonic()

    @api.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)

    @api.get("/dashboard/data", include_in_schema=False)
    async def dashboard_data() -> Response:
        return Response(
            orjson.dumps(summary(app, started)),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

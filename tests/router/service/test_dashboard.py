"""``GET /dashboard``: the page itself (fast, in process), then the page in a real browser.

The browser test runs headless Chromium (Debian's ``chromium`` package) against a real
``cache-router serve`` in front of two simulated workers (the processes of
:mod:`traces.live.fleet`): the page must list both workers, and after ten completions through
the router its numbers and charts must move, without a reload. It writes a screenshot to
``out/dashboard.png`` and to the test's tmp dir.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
commands on fd 3, replies on fd 4, NUL-separated JSON), which needs nothing beyond the
standard library and the browser: no Playwright (and its browser download), no
chromedriver, no debugging port. Where Chromium is missing the test skips, unless
``CACHE_ROUTER_BROWSER=1`` (set by ``.ci/run``, which installs it), where it fails: CI must
not pass by skipping.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.config import load_settings
from router.proxy.app import create_app
from router.service.dashboard import _SCRIPT, _STYLE, HEADERS, PAGE, _csp_hash
from traces.live.fleet import Service, sim_workers
from traces.live.fleet import router as start_router

ROOT = Path(__file__).parents[3]
SCREENSHOT = ROOT / "out" / "dashboard.png"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root in CI containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--window-size=1280,1000",
)
PAGE_IDS = (
    "status",
    "meta",
    "auth",
    "tile-healthy",
    "tile-inflight",
    "tile-rps",
    "tile-requests",
    "tile-est",
    "tile-rep",
    "chart-inflight",
    "chart-rps",
    "chart-hit",
    "workers",
    "workers-body",
    "decisions",
)


# ---- the page, in process -----------------------------------------------------------


async def _get(path: str, headers: dict[str, str] | None = None, **settings: Any) -> httpx.Response:
    app = create_app(load_settings(**settings))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        return await client.get(path, headers=headers)


async def test_dashboard_serves_the_page() -> None:
    r = await _get("/dashboard", workers=["http://127.0.0.1:9"])
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    for element in PAGE_IDS:
        assert f'id="{element}"' in r.text, element
    # Self-contained: nothing loaded from anywhere (no src=, no external href, no CDN).
    assert not re.search(r"\bsrc=|https?://(?!127\.0\.0\.1)", r.text)
    # Data goes into the DOM as text only.
    assert "innerHTML" not in r.text and "insertAdjacentHTML" not in r.text


async def test_dashboard_csp_allows_exactly_its_inline_code() -> None:
    r = await _get("/dashboard")
    csp = r.headers["content-security-policy"]
    assert f"script-src {_csp_hash(_SCRIPT)};" in csp
    assert f"style-src {_csp_hash(_STYLE)};" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert r.content == PAGE and csp == HEADERS["Content-Security-Policy"]


async def test_dashboard_loads_when_api_keys_are_configured() -> None:
    """The page holds no data, so it needs no key; its data follows /workers' access."""
    r = await _get("/dashboard", api_keys=["secret"])
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")


async def test_dashboard_data_follows_workers_access() -> None:
    """With --metrics-require-key the page still loads; its data needs a key, as /workers."""
    keyed = {"api_keys": ["secret"], "metrics_require_key": True}
    assert (await _get("/dashboard", **keyed)).status_code == 200
    for path in ("/workers", "/dashboard/data"):
        assert (await _get(path, **keyed)).status_code == 401, path
        ok = await _get(path, headers={"Authorization": "Bearer secret"}, **keyed)
        assert ok.status_code == 200, path


async def test_dashboard_data_summary() -> None:
    r = await _get("/dashboard/data", workers=["http://127.0.0.1:9"], policy="load_only")
    assert r.status_code == 200
    data = r.json()
    assert data["policy"] == "load_only" and data["workers"] == 1
    assert data["decisions"] == {} and data["retries"] == {} and data["unrouted"] == {}
    assert {"shadow", "tokenizer", "healthy_workers", "uptime_s"} <= set(data)


# ---- Chromium over the DevTools protocol -----------------------------------------------


class Chromium:
    """A headless Chromium driven over ``--remote-debugging-pipe``.

    Started with ``os.posix_spawn`` (the pipe ends become fds 3 and 4 in the child by
    file actions, no Python runs between fork and exec) in its own process group, so
    ``close`` can stop the browser and every helper process it started, by our PID.
    """

    def __init__(self, binary: str, profile: Path, log: Path) -> None:
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads fd 3
        out_r, out_w = os.pipe()  # Chromium writes fd 4, we read
        # Move the child's ends above 9 first, so dup2 onto 3 / 4 cannot clobber each other.
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (cmd_r, out_w):
            os.close(fd)
        args = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
        args += ["--remote-debugging-pipe", "about:blank"]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
            (os.POSIX_SPAWN_DUP2, hi_r, 3),
            (os.POSIX_SPAWN_DUP2, hi_w, 4),
        ]
        try:
            self.pid = os.posix_spawn(binary, args, dict(os.environ), file_actions=actions,
                                      setpgroup=0)  # fmt: skip
        finally:
            os.close(hi_r)
            os.close(hi_w)
        self.log = log
        self._wfd, self._rfd = cmd_w, out_r
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._closed = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True, name="chromium-cdp")
        self._reader.start()

    def _read(self) -> None:
        buf = bytearray()
        while True:
            try:
                chunk = os.read(self._rfd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while (end := buf.find(b"\0")) >= 0:
                message = json.loads(bytes(buf[:end]))
                del buf[: end + 1]
                with self._cond:
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:  # fmt: skip
        """One DevTools command; its result (RuntimeError on a protocol error)."""
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._wfd, data) :]
        with self._cond:
            self._cond.wait_for(lambda: ident in self._replies or self._closed, timeout)
            reply = self._replies.pop(ident, None)
        if reply is None:
            state = "exited" if self._closed else f"gave no answer in {timeout:.0f} s"
            raise RuntimeError(f"chromium {state} to {method}:\n{self.log_tail()}")
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        """Ask the browser to quit; then stop its process group, by our PID, if needed."""
        with contextlib.suppress(RuntimeError, OSError):
            self.send("Browser.close", timeout=5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG) != (0, 0):
                break
            time.sleep(0.05)
        else:
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        with contextlib.suppress(ProcessLookupError):  # its helpers (renderer, zygote) too
            os.killpg(self.pid, signal.SIGKILL)
        for fd in (self._wfd, self._rfd):
            os.close(fd)


class Tab:
    """One page of a :class:`Chromium`, attached in flat mode."""

    def __init__(self, browser: Chromium, width: int = 1280, height: int = 1000) -> None:
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str) -> None:
        result = self.send("Page.navigate", {"url": url})
        assert not result.get("errorText"), result
        self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            what=f"{url} to load",
        )

    def eval(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0, what: str = "") -> Any:
        """Poll ``expression`` until truthy (bounded); its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = self.eval("document.getElementById('status')?.textContent")
                raise AssertionError(f"timed out waiting for {what or expression}: {state!r}")
            time.sleep(0.2)

    def screenshot(self) -> bytes:
        """A PNG of the page's content (the viewport's width, the content's height)."""
        width, height = self.eval(
            "[window.innerWidth, Math.ceil(document.documentElement.getBoundingClientRect().height"
            " + 16)]"
        )
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.send("Page.captureScreenshot", {"format": "png", "clip": clip})["data"]
        return base64.b64decode(data)

    def errors(self) -> list[str]:
        """Uncaught exceptions and console / CSP errors this page logged."""
        out = []
        with self.browser._cond:
            events = list(self.browser.events)
        for event in events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"].get("text", ""))
            elif event["method"] == "Runtime.consoleAPICalled" and params["type"] == "error":
                out.append(json.dumps(params.get("args", []))[:500])
        return out


def chromium_binary() -> str:
    """The Chromium to drive; skip without one, fail if CACHE_ROUTER_BROWSER=1 wants it.

    ``CACHE_ROUTER_CHROMIUM`` names another binary (and only that one is tried).
    """
    override = os.environ.get("CACHE_ROUTER_CHROMIUM")
    candidates = [override] if override else [shutil.which("chromium"), "/usr/bin/chromium"]
    for binary in candidates:
        if binary and os.path.isfile(binary) and os.access(binary, os.X_OK):
            return binary
    if os.environ.get("CACHE_ROUTER_BROWSER") == "1":
        pytest.fail(
            f"CACHE_ROUTER_BROWSER=1 but no chromium ({candidates}): apt-get install chromium"
        )
    pytest.skip("no chromium (apt-get install chromium; CACHE_ROUTER_BROWSER=1 makes this fail)")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    chrome = Chromium(chromium_binary(), tmp_path / "profile", tmp_path / "chromium.log")
    try:
        chrome.send("Browser.getVersion", timeout=60)  # ready (first start can be slow)
        yield chrome
    finally:
        chrome.close()


# ---- the page, in the browser ------------------------------------------------------------

ROWS_JS = "[...document.querySelectorAll('#workers-body tr[data-url]')].map(r => r.dataset.url)"
REQUESTS_JS = (
    "[...document.querySelectorAll('#workers-body td[data-col=requests]')]"
    ".reduce((s, td) => s + Number(td.textContent.replace(/,/g, '')), 0)"
)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    """Two simulated workers, 50 times faster than real time, for the browser tests."""
    with sim_workers(2, ["--time-scale", "50"]) as started:
        yield started


def test_dashboard_in_chromium(browser: Chromium, workers: list[Service], tmp_path: Path) -> None:
    started = time.monotonic()
    with start_router([w.url for w in workers], "lmetric", ["--log-level", "warning"]) as router:
        tab = Tab(browser)
        tab.goto(router.url + "/dashboard")
        tab.wait_for("Number(document.body?.dataset.polls || 0) >= 1", what="a first update")

        urls = tab.eval(ROWS_JS)
        assert sorted(urls) == sorted(w.url for w in workers)
        health = tab.eval(
            "[...document.querySelectorAll('#workers-body td[data-col=health]')]"
            ".map(td => td.textContent)"
        )
        assert health == ["up", "up"]
        assert tab.eval("document.getElementById('tile-healthy').textContent") == "2 / 2"
        assert tab.eval(REQUESTS_JS) == 0
        assert "policy lmetric" in tab.eval("document.getElementById('meta').textContent")

        # Ten completions, two conversations of five, each turn's prompt extending a ~6 KB
        # prefix (three 512-token blocks at 4 bytes a token): the later turns hit, so both
        # hit rates become > 0. Paced over ~3 s and 2,000 output tokens long (~0.5 s at time
        # scale 50), so that polls see requests in flight and the charts get a history.
        prefixes = [f"Conversation {c}: you are a helpful assistant. " * 150 for c in "AB"]

        def complete(i: int) -> int:
            body = {
                "model": "sim-model",
                "prompt": f"{prefixes[i % 2]}question {i}",
                "max_tokens": 2000,
            }
            with httpx.Client(base_url=router.url, timeout=30) as client:
                r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.status_code

        with ThreadPoolExecutor(4) as pool:
            futures = []
            for i in range(10):
                futures.append(pool.submit(complete, i))
                time.sleep(0.3)
            assert [f.result(timeout=60) for f in futures] == [200] * 10
        polls = tab.eval("Number(document.body.dataset.polls)")

        tab.wait_for(f"({REQUESTS_JS}) >= 10", what="the requests column to count 10")
        tab.wait_for(
            "Number(document.getElementById('chart-hit').dataset.points || 0) >= 2",
            what="hit-rate chart points",
        )
        tab.wait_for(
            "document.getElementById('tile-rep').textContent.endsWith('%')",
            what="a reported hit rate",
        )
        assert tab.eval(REQUESTS_JS) == 10
        # by model: the workers' column and the models table (the sim workers serve sim-model)
        served = tab.eval(
            "[...document.querySelectorAll('#workers-body td[data-col=models]')]"
            ".map(td => td.textContent)"
        )
        assert served == ["sim-model", "sim-model"]
        roles = tab.eval(
            "[...document.querySelectorAll('#workers-body td[data-col=role]')]"
            ".map(td => td.textContent)"
        )
        assert roles == ["both", "both"]
        tiers = tab.eval(
            "[...document.querySelectorAll('#workers-body td[data-col=cpu_tier]')]"
            ".map(td => td.textContent)"
        )
        assert tiers == ["\u2013", "\u2013"]  # no CPU KV tier configured
        model_requests = tab.eval(
            'document.querySelector(\'#models-body tr[data-model="sim-model"] '
            "td[data-col=requests]')?.textContent"
        )
        assert model_requests == "10"
        assert tab.eval("document.getElementById('status').dataset.state") == "ok"
        est = tab.eval("parseFloat(document.getElementById('tile-est').textContent)")
        rep = tab.eval("parseFloat(document.getElementById('tile-rep').textContent)")
        assert 0 < est <= 100 and 0 < rep <= 100, (est, rep)
        assert "picker branches:" in tab.eval("document.getElementById('decisions').textContent")
        # The charts drew: every per-worker chart has points, and pixels that are not blank.
        for chart in ("chart-inflight", "chart-rps", "chart-hit"):
            points = tab.eval(f"Number(document.getElementById('{chart}').dataset.points)")
            assert points > 0, chart
            inked = tab.eval(
                f"(() => {{ const c = document.getElementById('{chart}');"
                " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n; })()"
            )
            assert inked > 500, (chart, inked)
        # Two more updates after the traffic, so the screenshot shows the rates falling back.
        tab.wait_for(f"Number(document.body.dataset.polls) >= {polls + 2}", what="more updates")

        png = tab.screenshot()
        errors = tab.errors()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes(png)
    (tmp_path / "dashboard.png").write_bytes(png)
    assert not errors, errors
    assert time.monotonic() - started < 120


def test_dashboard_asks_for_a_key(browser: Chromium, workers: list[Service]) -> None:
    """A router whose /workers needs a key: the page loads, asks for one, then shows data."""
    args = ["--log-level", "warning", "--api-key", "secret", "--metrics-require-key"]
    with start_router([w.url for w in workers], "lmetric", args) as router:
        tab = Tab(browser)
        tab.goto(router.url + "/dashboard")
        tab.wait_for("!document.getElementById('auth').hidden", what="the key form")
        assert tab.eval("document.getElementById('status').dataset.state") == "auth"
        assert tab.eval(ROWS_JS) == []
        tab.eval(
            "document.getElementById('auth-key').value = 'wrong';"
            "document.getElementById('auth').requestSubmit()"
        )
        tab.wait_for(
            "document.getElementById('status').textContent.startsWith('key refused')",
            what="the wrong key refused",
        )
        tab.eval(
            "document.getElementById('auth-key').value = 'secret';"
            "document.getElementById('auth').requestSubmit()"
        )
        tab.wait_for(f"({ROWS_JS}).length === 2", what="the workers, with the key")
        assert tab.eval("document.getElementById('auth').hidden") is True
        assert tab.eval("document.getElementById('status').dataset.state") == "ok"
        assert "secret" not in tab.eval("location.href")
        # The 401s the page met before it had the key are logged as failed loads; nothing else.
        errors = [e for e in tab.errors() if "401" not in e]

        # A key in the fragment (never sent to the server) works too, and leaves the URL.
        fresh = Tab(browser)  # a new tab: its own, empty sessionStorage
        fresh.send("Page.navigate", {"url": router.url + "/dashboard#key=secret"})
        fresh.wait_for(f"({ROWS_JS}).length === 2", what="the workers, with the fragment's key")
        assert fresh.eval("location.href") == router.url + "/dashboard"
        assert fresh.eval("document.getElementById('auth').hidden") is True
        errors += fresh.errors()
    assert not errors, errors

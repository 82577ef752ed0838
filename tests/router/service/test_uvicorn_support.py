"""The uvicorn range: pyproject.toml's bound and the server's start-up check agree, a release
outside it fails `serve` at start with the range, and the proxy runs on both ends of it.

The ends (slow suite, CACHE_ROUTER_SLOW=1: they fetch uvicorn releases from the package
registry) are installed with ``pip install --target`` and put first on ``PYTHONPATH`` of a real
``cache-router serve`` in front of a sim worker, which then answers plain and streamed
completions; the server's own tests (scope equal to uvicorn's, framing, limits) run on each too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from router.service import uvicorn_support
from traces.live.fleet import free_port, start_service

ROOT = Path(__file__).resolve().parents[3]
SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"


def test_pyproject_allows_exactly_the_checked_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (uvicorn,) = [d for d in deps if d.split(">")[0].split("=")[0].strip() == "uvicorn"]
    assert uvicorn == f"uvicorn{uvicorn_support.SPEC}"


def test_the_installed_release_is_supported() -> None:
    assert uvicorn_support.problem() is None


@pytest.mark.parametrize("version", ["0.29.0", "0.49.0", "0.55.0", "0.55.0rc1", "1.0.0"])
def test_releases_outside_the_range_are_refused_with_the_range(version: str) -> None:
    message = uvicorn_support.problem(version)
    assert message is not None
    assert f"uvicorn {version} is installed" in message
    assert "uvicorn>=0.50.0,<0.55" in message


@pytest.mark.parametrize("version", ["0.50.0", "0.50.2", "0.54.0", "0.54.9"])
def test_releases_inside_the_range_pass(version: str) -> None:
    assert uvicorn_support.problem(version) is None


def _install(version_spec: str, target: Path) -> str:
    """``pip install --target`` uvicorn matching ``version_spec`` alone; its version."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), f"uvicorn{version_spec}"],
        check=True, timeout=180,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", "import uvicorn; print(uvicorn.__version__)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.strip()


slow = pytest.mark.skipif(not SLOW, reason="slow suite (fetches uvicorn): set CACHE_ROUTER_SLOW=1")


@slow
def test_serve_refuses_a_release_below_the_range_at_start(tmp_path: Path) -> None:
    assert _install("==0.49.0", tmp_path) == "0.49.0"
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", "--port", str(free_port()),
         "--worker", "http://127.0.0.1:9"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "uvicorn 0.49.0 is installed" in done.stderr
    assert "uvicorn>=0.50.0,<0.55" in done.stderr


@slow
@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_the_proxy_runs_on_both_ends_of_the_range(
    end: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = uvicorn_support.SUPPORTED
    spec = f"=={low}" if end == "lowest" else f"<{high},>={low}"  # pip takes the highest
    version = _install(spec, tmp_path)
    if end == "lowest":
        assert version == low
    assert uvicorn_support.problem(version) is None
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    wport, rport = free_port(), free_port()
    worker = start_service(
        "sim-worker",
        ["sim-worker", "--port", str(wport), "--time-scale", "50", "--log-level", "warning"],
        wport,
    )
    try:
        router = start_service(
            "router",
            ["serve", "--port", str(rport), "--worker", worker.url, "--log-level", "warning"],
            rport,
        )
        try:
            with httpx.Client(base_url=router.url, timeout=30) as client:
                for i in range(20):
                    body = {"model": "sim-model", "prompt": f"hello {i} " * 50, "max_tokens": 4}
                    r = client.post("/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    assert r.json()["usage"]["completion_tokens"] == 4
                chat = {"model": "sim-model", "stream": True, "max_tokens": 3,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                with client.stream("POST", "/v1/chat/completions", json=chat) as r:
                    assert r.status_code == 200
                    text = "".join(r.iter_text())
                assert text.rstrip().endswith("data: [DONE]")
                bad = client.post(
                    "/v1/completions",
                    content=b"{not json",
                    headers={"content-type": "application/json"},
                )
                assert bad.status_code == 400
        finally:
            router.stop()
    finally:
        worker.stop()
    # the server's own tests (scope as uvicorn builds it, framing, limits) on this release
    here = ROOT / "tests/router/service"
    tests = [str(here / "test_server.py"), str(here / "test_server_cycle.py")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

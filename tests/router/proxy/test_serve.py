"""``cache-router serve`` as users run it: a real process, configured by flags, env and YAML."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_process_routes_and_stops(fake_workers, tmp_path):
    (worker,) = fake_workers(1)
    port = free_port()
    config = tmp_path / "router.yaml"
    config.write_text(f"policy: unified\nworkers: ['{worker.url}']\n")
    env = {**os.environ, "CACHE_ROUTER_HEALTH_INTERVAL_S": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--config", str(config),
         "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.1)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi"}, timeout=5)
        assert r.status_code == 200 and r.headers["x-cache-router-worker"] == worker.url
        text = httpx.get(url + "/metrics", timeout=5).text
        assert 'policy="unified"' in text
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0  # a drained shutdown exits 0 (router.service.server.serve)


def test_serve_rejects_bad_options():
    out = subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", "--policy", "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "choose one of" in out.stderr

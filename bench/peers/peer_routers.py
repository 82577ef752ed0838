"""The real peer routers as processes: SMG (``smg launch``) and vllm-router, each on a free
loopback port (its Prometheus listener too), logging to a file, stopped by its PID.

Shared by bench/peers/peer_live.py and bench/flow/flow_control.py (``--smg``). Their wheels
are bench-only (requirements/bench-peers.txt), installed into a venv of their own:

    python -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install -r requirements/bench-peers.txt
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from traces.live.fleet import HOST, Service, free_port, start_program

PEER_KINDS = ("smg", "vllm-router")


def peer_argv(
    kind: str,
    binary: str,
    workers: Sequence[str],
    policy: str,
    port: int,
    metrics_port: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of peer ``kind`` in front of ``workers``: loopback only (both bind
    their Prometheus listener apart from the serving port, by default 29000 on every
    interface for SMG), warnings only."""
    common = ["--host", HOST, "--port", str(port), "--worker-urls", *workers, "--policy", policy,
              "--prometheus-host", HOST, "--prometheus-port", str(metrics_port)]  # fmt: skip
    if kind == "smg":
        return [binary, "launch", *common, "--log-level", "warn", *extra]
    if kind == "vllm-router":
        return [binary, *common, "--log-level", "warning", *extra]
    raise ValueError(f"unknown peer {kind!r}: one of {', '.join(PEER_KINDS)}")


def wait_workers(url: str, count: int, timeout_s: float = 30.0) -> None:
    """Until the router at ``url`` lists ``count`` workers on GET /workers (SMG registers
    ``--worker-urls`` in the background after /health answers); a router without that
    route (or another answer shape) is taken as ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url + "/workers", timeout=2.0)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if answer.status_code != 200:
            return
        body = answer.json()
        listed = body.get("workers", body) if isinstance(body, dict) else body
        if not isinstance(listed, list) or len(listed) >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} listed fewer than {count} workers after {timeout_s:.0f} s")


@contextlib.contextmanager
def peer_router(
    kind: str,
    binary: str,
    workers: Sequence[str],
    policy: str,
    log_dir: str | Path,
    extra: Sequence[str] = (),
) -> Iterator[Service]:
    """Peer ``kind`` (``binary``) with ``policy`` in front of ``workers``, ready to route;
    stopped by its PID on exit. Its log: ``log_dir/<kind>-<policy>.log``."""
    port, metrics_port = free_port(), free_port()
    argv = peer_argv(kind, binary, workers, policy, port, metrics_port, extra)
    log = str(Path(log_dir) / f"{kind}-{policy}.log")
    service = start_program(f"{kind}-{policy}", argv, port, timeout_s=60.0, log_file=log)
    try:
        wait_workers(service.url, len(workers))
        yield service
    finally:
        service.stop()


DISTRIBUTIONS = {"smg": "smg", "vllm-router": "vllm-router"}


def peer_version(kind: str, binary: str) -> str | None:
    """The installed version of peer ``kind``: its distribution's version as the Python
    beside ``binary`` reports it (the wheels' console scripts live in their venv's bin/)."""
    python = Path(binary).parent / "python"
    if not python.exists():
        return None
    code = f"import importlib.metadata as m; print(m.version({DISTRIBUTIONS[kind]!r}))"
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None

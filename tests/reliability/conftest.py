"""Fixtures for the reliability suites: the proxy test fixtures, and the opt-in switch.

The fault, fuzz and shutdown suites reuse tests/router's fixtures (fake workers, a router
under uvicorn in a thread). Tests marked ``slow`` (the long fuzz volumes, the soak) run only
with ``CACHE_ROUTER_SLOW=1`` (tests/conftest.py), which .ci/run sets.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROUTER_TESTS = Path(__file__).resolve().parent.parent / "router"


def _router_conftest() -> ModuleType:
    """tests/router/conftest.py, loaded by path: the bare name ``conftest`` may already be
    another folder's (tests/integration puts its own first on sys.path)."""
    name = "cache_router_tests_router_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROUTER_TESTS / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)  # puts tests/router on sys.path (fake_worker, streams)
    return sys.modules[name]


fake_workers = _router_conftest().fake_workers  # fixtures, re-exported
router_server = _router_conftest().router_server

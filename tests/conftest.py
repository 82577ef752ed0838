"""The suite's opt-in switch: tests marked ``slow`` (long live replays, fuzz volumes, the
soak) run only with ``CACHE_ROUTER_SLOW=1``, which .ci/run sets, so ``make test`` stays
within its 10-minute budget on a 2-core host (the marker is declared in pyproject)."""

from __future__ import annotations

import os

import pytest

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``slow`` tests unless CACHE_ROUTER_SLOW=1."""
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow suite: set CACHE_ROUTER_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

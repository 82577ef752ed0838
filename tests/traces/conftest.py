"""Fixtures for the real traces (../shared/traces) and the small copies in tests/data.

Fixtures rather than importable constants: test modules never import this conftest, so they
work under any pytest import mode and beside other test directories' conftest files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from traces.formats import load_trace
from traces.record import TraceRequest

SHARED = Path(__file__).parents[2].parent / "shared" / "traces"
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
def conversation(shared: Callable[[str], Path]) -> list[TraceRequest]:
    """Mooncake conversation_trace.jsonl, loaded once (tests must not mutate it)."""
    return load_trace(shared("conversation_trace.jsonl"))

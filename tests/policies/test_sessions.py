"""The bounded LRU session table."""

from __future__ import annotations

import pytest

from policies.sessions import SessionTable


def test_lru_eviction_and_touch():
    table = SessionTable(max_sessions=2)
    table.bind("a", 0)
    table.bind("b", 1)
    assert table.get("a") == 0  # a becomes most recent
    table.bind("c", 2)
    assert "b" not in table
    assert (table.get("a"), table.get("c"), len(table)) == (0, 2, 2)


def test_rebind_and_forget():
    table = SessionTable()
    table.bind("a", 0)
    table.bind("a", 3)
    assert (table.get("a"), len(table)) == (3, 1)
    table.forget("a")
    table.forget("missing")
    assert table.get("a") is None


def test_many_sessions_stay_bounded():
    table = SessionTable(max_sessions=100)
    for i in range(10_000):
        table.bind(f"s{i}", i % 4)
    assert len(table) == 100
    assert table.get("s9999") == 9999 % 4 and table.get("s9899") is None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        SessionTable(0)

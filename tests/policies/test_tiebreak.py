"""Tie-break names and the seed's round-robin counter."""

from __future__ import annotations

import pytest

from policies.tiebreak import TIE_BREAKS, RoundRobinCounter, check_tie_break


def test_names():
    assert TIE_BREAKS == ("first", "multikey")
    assert check_tie_break("first") == "first"
    with pytest.raises(ValueError, match="first, multikey"):
        check_tie_break("rr")


def test_counter_indexes_ties_modulo_their_count():
    rr = RoundRobinCounter()
    assert [rr.choose([3, 5]) for _ in range(3)] == [3, 5, 3]
    assert rr.choose([1, 2, 4]) == 1  # count is 3 now: 3 % 3 == 0
    assert rr.count == 4

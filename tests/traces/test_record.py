import math

import pytest

from traces.trace.record import (
    MAX_COUNT,
    MAX_TIME,
    TraceFormatError,
    TraceRequest,
    count_value,
    finalize,
    first_too_long,
    time_value,
)


def req(arrival: float, session: str = "s") -> TraceRequest:
    return TraceRequest(arrival, session, 1, 10, 1, ())


def test_finalize_sorts_stably_rebases_and_numbers() -> None:
    a, b, c, d = req(105.0, "a"), req(100.0, "b"), req(105.0, "c"), req(101.5, "d")
    out = finalize([a, b, c, d])
    assert [r.session_id for r in out] == ["b", "d", "a", "c"]  # a before c: input order
    assert [r.arrival for r in out] == [0.0, 1.5, 5.0, 5.0]
    assert [r.request_id for r in out] == [0, 1, 2, 3]


def test_finalize_empty() -> None:
    assert finalize([]) == []


def test_record_is_slotted() -> None:
    r = req(0.0)
    assert not hasattr(r, "__dict__")
    assert r.prompt is None and r.messages is None and r.request_id == 0


@pytest.mark.parametrize(
    "value", [-1, -0.5, 2.5, math.nan, math.inf, -math.inf, MAX_COUNT + 1, 10**400, 1e30,
              "7", True, None, [1], {}],
)  # fmt: skip
def test_a_count_is_an_integer_in_range(value: object) -> None:
    with pytest.raises(TraceFormatError) as caught:
        count_value(value, "x.jsonl:3: field 'in'")
    assert str(caught.value).startswith("x.jsonl:3: field 'in' must be")
    assert "\n" not in str(caught.value)


def test_counts_and_times_accepted() -> None:
    assert count_value(0, "f") == 0 and count_value(1e3, "f") == 1000
    assert count_value(MAX_COUNT, "f") == MAX_COUNT
    assert time_value(0, "t") == 0.0 and time_value(2.5, "t") == 2.5
    assert time_value(MAX_TIME, "t") == MAX_TIME


@pytest.mark.parametrize(
    "value",
    [-1, -1e-9, math.nan, math.inf, -math.inf, MAX_TIME * 2, 10**400, "0", False, None],
)
def test_a_time_is_finite_and_not_negative(value: object) -> None:
    with pytest.raises(TraceFormatError, match=r"^x\.jsonl:3: field 't' must be"):
        time_value(value, "x.jsonl:3: field 't'")


def test_context_tokens_and_the_first_request_too_long() -> None:
    fits = TraceRequest(0.0, "a", 1, 1000, 24, (), source="t.jsonl:1")
    empty = TraceRequest(0.0, "b", 1, 1024, 0, (), source="t.jsonl:2")  # still 1 output token
    long = TraceRequest(1.0, "c", 1, 1020, 5, (), source="t.jsonl:3")
    assert (fits.context_tokens, empty.context_tokens, long.context_tokens) == (1024, 1025, 1025)
    assert first_too_long([fits, empty, long], 1024) is empty
    assert first_too_long([fits], 1024) is None
    assert long.where() == "t.jsonl:3" and TraceRequest(0, "d", 1, 1, 1, ()).where() == "request 0"

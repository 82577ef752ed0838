from traces.record import TraceRequest, finalize


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

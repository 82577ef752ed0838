"""traces/trace/assign.py: the weights in `--tenants 4:1` and `trace models --model NAME:WEIGHT`
are held to the rule of every other weight (router/validation.py)."""

from __future__ import annotations

import pytest

from traces.trace.assign import parse_model_weights, parse_tenant_weights


def test_weights_parse() -> None:
    assert parse_tenant_weights("4:1") == [4.0, 1.0]
    assert parse_model_weights(["a:2", "b"]) == [("a", 2.0), ("b", 1.0)]


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf", "1e308", "x"])
def test_a_weight_must_be_positive_finite_and_bounded(weight: str) -> None:
    with pytest.raises(ValueError, match=r"must be (a number|a finite number|> 0|<= )"):
        parse_tenant_weights(f"4:{weight}")
    with pytest.raises(ValueError, match=r"must be (a number|a finite number|> 0|<= )"):
        parse_model_weights([f"a:{weight}"])

"""router/validation.py: one rule, the same verdict and words from argparse and pydantic."""

from __future__ import annotations

import argparse
import math

import pytest
from pydantic import ValidationError

from router.config import Settings, field_rule
from router.service.command import settings_problem
from router.validation import (
    COUNT,
    MAX_TOKENS,
    POSITIVE,
    SECONDS,
    TOKENS,
    TOKENS_OR_OFF,
    Parser,
    integer,
    refuse,
)


@pytest.mark.parametrize(
    ("rule", "text", "why"),
    [
        (COUNT, "-3", "must be >= 1, not -3"),
        (COUNT, "0", "must be >= 1, not 0"),
        (COUNT, "1.5", "must be an integer, not '1.5'"),
        (COUNT, "nan", "must be an integer, not 'nan'"),
        (TOKENS, "99999999999999999999999", f"must be <= {MAX_TOKENS} (2**53), not 9999"),
        (TOKENS, "9" * 5000, "must be an integer, not '9999"),  # past int()'s digit limit
        (SECONDS, "0", "must be > 0, not 0"),
        (SECONDS, "-1", "must be > 0, not -1"),
        (SECONDS, "nan", "must be a finite number, not nan"),
        (SECONDS, "inf", "must be a finite number, not inf"),
        (SECONDS, "1e30", "must be <= 1e+09, not 1e+30"),
        (POSITIVE, "abc", "must be a number, not 'abc'"),
    ],
)
def test_a_bad_value_says_why_on_one_short_line(rule, text: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        rule(text)
    message = str(exc.value)
    assert message.startswith(why) and "\n" not in message and len(message) < 120


def test_good_values_pass_as_their_kind() -> None:
    assert COUNT("7") == 7 and isinstance(COUNT("7"), int)
    assert SECONDS("2.5") == 2.5 and SECONDS(" 1e3 ") == 1000.0
    assert TOKENS_OR_OFF("0") == 0 and TOKENS(str(MAX_TOKENS)) == MAX_TOKENS
    assert COUNT.check(3.0) == 3 and isinstance(COUNT.check(3.0), int)  # YAML's 3.0
    for bad in (True, math.nan, 2.5):
        with pytest.raises(ValueError):
            COUNT.check(bad)


def test_a_settings_field_and_its_flag_share_the_rule_and_the_words() -> None:
    """``--flow-queue-ttl-s -1`` (argparse) and ``flow_queue_ttl_s: -1`` (env, YAML:
    pydantic) fail alike, with one message."""
    rule = field_rule("flow_queue_ttl_s")
    assert rule is SECONDS and field_rule("worker_kv_capacity_tokens") is TOKENS
    assert field_rule("policy") is None and field_rule("flow_weights") is POSITIVE
    with pytest.raises(argparse.ArgumentTypeError) as flag:
        rule("-1")
    with pytest.raises(ValidationError) as setting:
        Settings(flow_queue_ttl_s=-1)
    assert settings_problem(setting.value) == f"argument --flow-queue-ttl-s: {flag.value}"


def test_settings_problems_are_one_line_and_name_the_flag() -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(flow_weights={"gold": 0, "silver": math.inf}, kv_capacity_tokens=10**23)
    text = settings_problem(exc.value)
    assert "\n" not in text and "pydantic" not in text
    assert "argument --kv-capacity-tokens: must be <= 9007199254740992 (2**53)" in text
    assert "argument --flow-weight: gold: must be > 0, not 0" in text
    assert "argument --flow-weight: silver: must be a finite number, not inf" in text


def test_parser_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = Parser(prog="cache-router x")
    parser.add_argument("--n", type=integer(1, 10))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--n", "11"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "cache-router x: error: argument --n: must be <= 10, not 11\n"
    assert refuse("x", ValueError("two\n  lines")) == 2
    assert capsys.readouterr().err == "cache-router x: error: two lines\n"

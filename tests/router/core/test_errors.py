"""The router's own error bodies: OpenAI's envelope, and client text repeated bounded."""

from __future__ import annotations

import orjson

from router.core.errors import ECHO_MAX, ModelNotFound, echo


def test_echo_keeps_short_text_and_cuts_long_text_saying_its_length() -> None:
    assert echo("") == ""
    assert echo("sim-model") == "sim-model"
    assert echo("x" * ECHO_MAX) == "x" * ECHO_MAX
    long = "m" * (1 << 20)
    assert echo(long) == "m" * ECHO_MAX + f"… ({1 << 20} characters)"
    assert echo("abcdef", limit=3) == "abc… (6 characters)"


def test_the_envelope() -> None:
    body = orjson.loads(ModelNotFound("The model `x` does not exist.").body())
    assert body == {
        "error": {
            "message": "The model `x` does not exist.",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }
    }

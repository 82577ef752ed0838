"""Request parsing: the three APIs, their prompt shapes, sessions, and 400s."""

from __future__ import annotations

import orjson
import pytest

from router.proxy.errors import BadRequest
from router.proxy.parse import CHAT, COMPLETION, GENERATE, parse_request


def parse(kind, body, header=None):
    return parse_request(kind, orjson.dumps(body), header)


def test_prompt_shapes():
    assert parse(COMPLETION, {"prompt": "hi"}).prompts == ["hi"]
    assert parse(COMPLETION, {"prompt": [1, 2, 3]}).prompts == [[1, 2, 3]]
    assert parse(COMPLETION, {"prompt": ["a", "b"]}).prompts == ["a", "b"]
    assert parse(COMPLETION, {"prompt": [[1], [2, 3]]}).prompts == [[1], [2, 3]]
    assert parse(GENERATE, {"text": "hi"}).prompts == ["hi"]
    assert parse(GENERATE, {"input_ids": [5, 6]}).prompts == [[5, 6]]
    chat = parse(CHAT, {"messages": [{"role": "user", "content": "x"}], "stream": True})
    assert chat.messages and chat.stream and not chat.wants_usage


def test_stream_usage_and_max_tokens():
    r = parse(
        COMPLETION,
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 7},
    )
    assert r.wants_usage and r.max_tokens == 7
    assert parse(GENERATE, {"text": "x", "sampling_params": {"max_new_tokens": 9}}).max_tokens == 9
    assert parse(CHAT, {"messages": [{"role": "u"}], "max_completion_tokens": 3}).max_tokens == 3


def test_session_from_header_then_session_id_then_user():
    body = {"prompt": "x", "user": "u1", "session_id": "s1"}
    assert parse(COMPLETION, body, "h1").session_id == "h1"
    assert parse(COMPLETION, body).session_id == "s1"
    assert parse(COMPLETION, {"prompt": "x", "user": "u1"}).session_id == "u1"
    assert parse(COMPLETION, {"prompt": "x", "session_id": 42}).session_id == "42"
    assert parse(COMPLETION, {"prompt": "x"}).session_id is None


@pytest.mark.parametrize(
    "kind, raw, code",
    [
        (CHAT, b"{", "invalid_json"),
        (CHAT, b'"text"', "invalid_json"),
        (CHAT, b"{}", "missing_field"),
        (CHAT, b'{"messages": {}}', "invalid_type"),
        (CHAT, b'{"messages": [{"content": "x"}]}', "invalid_type"),
        (COMPLETION, b"{}", "missing_field"),
        (COMPLETION, b'{"prompt": []}', "invalid_type"),
        (COMPLETION, b'{"prompt": [1.5]}', "invalid_type"),
        (COMPLETION, b'{"prompt": ["a", 1]}', "invalid_type"),
        (GENERATE, b'{"text": [1, 2]}', "invalid_type"),
        (GENERATE, b'{"input_ids": "abc"}', "invalid_type"),
        (COMPLETION, b'{"prompt": "x", "stream": 1}', "invalid_type"),
    ],
)
def test_bad_requests(kind, raw, code):
    with pytest.raises(BadRequest) as info:
        parse_request(kind, raw, None)
    assert info.value.code == code and info.value.status == 400

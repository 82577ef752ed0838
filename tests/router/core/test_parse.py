"""Request parsing: the generation APIs, their prompt shapes, sessions, and 400s; the
Responses API read as chat; the other endpoints' model; calls on a stored response."""

from __future__ import annotations

import orjson
import pytest

from router.core.errors import BadRequest
from router.core.parse import (
    CHAT,
    COMPLETION,
    EMBEDDINGS,
    GENERATE,
    RESPONSES,
    parse_other,
    parse_request,
    response_call_id,
)
from router.core.tokenize import serialize_chat


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
        (RESPONSES, b"{}", "missing_field"),
        (RESPONSES, b'{"input": []}', "invalid_type"),
        (RESPONSES, b'{"input": ["x"]}', "invalid_type"),
        (RESPONSES, b'{"input": [{"type": "message", "content": "x"}]}', "invalid_type"),
        (RESPONSES, b'{"input": "x", "instructions": 3}', "invalid_type"),
        (RESPONSES, b'{"input": "x", "previous_response_id": 7}', "invalid_type"),
        (RESPONSES, b'{"input": "x", "previous_response_id": ""}', "invalid_type"),
    ],
)
def test_bad_requests(kind, raw, code):
    with pytest.raises(BadRequest) as info:
        parse_request(kind, raw, None)
    assert info.value.code == code and info.value.status == 400


def test_responses_read_as_the_chat_an_engine_makes_of_them():
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "message", "role": "user", "content": "and?"},
        ],
        "previous_response_id": "resp_1",
        "max_output_tokens": 9,
    }
    req = parse(RESPONSES, body)
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[1]["content"] == [{"type": "text", "text": "hi"}]
    assert req.messages[2]["tool_calls"][0]["function"]["name"] == "f"
    assert req.messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert req.chat == {"messages": req.messages} and req.stored_response_id == "resp_1"
    assert req.model == "m" and req.max_tokens == 0  # max_output_tokens: not a chat field
    # text input: one user message; the same conversation as chat gives the same bytes
    short = parse(RESPONSES, {"input": "hello", "instructions": "sys"})
    chat = parse(CHAT, {"messages": [{"role": "system", "content": "sys"},
                                     {"role": "user", "content": "hello"}]})  # fmt: skip
    assert serialize_chat(short.chat) == serialize_chat(chat.chat)


def test_other_endpoints_name_a_model_or_none():
    req = parse_other(EMBEDDINGS, b'{"model": "e5", "input": "x"}', b"application/json", None)
    assert req.model == "e5" and req.prompts == [] and not req.stream
    audio = parse_other("audio", b"--b\r\n...", b"multipart/form-data; boundary=b", None)
    assert audio.model is None and audio.body == {}
    assert parse_other(EMBEDDINGS, b"", None, "s").session_id == "s"
    # the empty model is a model name (nobody serves it: a 404), not "no model"
    assert parse_other(EMBEDDINGS, b'{"model": ""}', None, None).model == ""
    assert parse_request(COMPLETION, b'{"model": "", "prompt": "x"}', None).model == ""
    for raw in (b"{", b"[1]", b'{"model": 1}'):
        with pytest.raises(BadRequest):
            parse_other(EMBEDDINGS, raw, None, None)


@pytest.mark.parametrize(
    "method, path, expected",
    [
        ("GET", "/v1/responses/resp_1", "resp_1"),
        ("DELETE", "/v1/responses/resp_1", "resp_1"),
        ("POST", "/v1/responses/resp_1/cancel", "resp_1"),
        ("GET", "/v1/responses/resp_1/input_items", "resp_1"),
        ("POST", "/v1/responses/resp_1", None),
        ("GET", "/v1/responses/resp_1/cancel", None),
        ("GET", "/v1/responses/", None),
        ("GET", "/v1/responses/resp_1/other", None),
        ("GET", "/v1/responsesx/resp_1", None),
    ],
)
def test_calls_on_a_stored_response(method, path, expected):
    assert response_call_id(method, path) == expected

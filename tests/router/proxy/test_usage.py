"""Reading cached tokens from bodies and streams; dropping the injected usage chunk."""

from __future__ import annotations

import json

from router.proxy.usage import (
    MAX_SCANNED_BODY,
    StreamScanner,
    Usage,
    UsageReader,
    response_id_in,
    scan_body,
)


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 2,
    "prompt_tokens_details": {"cached_tokens": 64},
}


def test_scan_body_vllm_sglang_batch_and_absent():
    vllm = json.dumps({"choices": [{"text": '"cached_tokens": 999'}], "usage": USAGE}).encode()
    assert scan_body(vllm) == Usage(64, 100)  # a quoted key inside a string is escaped
    sglang = json.dumps(
        [
            {"meta_info": {"prompt_tokens": 10, "cached_tokens": 4}},
            {"meta_info": {"prompt_tokens": 10, "cached_tokens": 6}},
        ]
    ).encode()
    assert scan_body(sglang) == Usage(10, 20)
    no_details = {"usage": {"prompt_tokens": 5, "prompt_tokens_details": None}}
    assert scan_body(json.dumps(no_details).encode()) is None


def test_stream_drops_only_the_usage_chunk_when_injected():
    chunks = [
        event({"choices": [{"delta": {"content": "a"}}], "usage": None}),
        event({"choices": [{"delta": {"content": "b"}}]}),
        event({"choices": [], "usage": USAGE}),
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(chunks)
    for cut in (1, 7, 40, len(chunks[0]), len(stream) - 20):  # arbitrary network splits
        scanner = StreamScanner(drop_usage_chunk=True)
        out = scanner.feed(stream[:cut]) + scanner.feed(stream[cut:]) + scanner.flush()
        assert out == chunks[0] + chunks[1] + chunks[3]
        assert scanner.usage == Usage(64, 100)


def test_stream_keeps_usage_the_client_asked_for_and_crlf_events():
    chunks = [
        event({"choices": [{"delta": {}}]}).replace(b"\n\n", b"\r\n\r\n"),
        event({"choices": [], "usage": USAGE}),
        b"data: [DONE]\n\n",
    ]
    scanner = StreamScanner(drop_usage_chunk=False)
    out = b"".join(scanner.feed(c) for c in chunks) + scanner.flush()
    assert out == b"".join(chunks) and scanner.usage == Usage(64, 100)


def test_sglang_stream_reads_the_first_meta_info():
    events = [
        event(
            {
                "text": "x" * i,
                "meta_info": {"prompt_tokens": 9, "cached_tokens": 3, "completion_tokens": i},
            }
        )
        for i in range(3)
    ]
    scanner = StreamScanner(drop_usage_chunk=False)
    out = scanner.feed(b"".join(events)) + scanner.flush()
    assert out == b"".join(events) and scanner.usage == Usage(3, 9)


def test_partial_events_are_held_then_flushed():
    scanner = StreamScanner(drop_usage_chunk=True)
    assert scanner.feed(b'data: {"cho') == b""
    assert scanner.feed(b'ices": []}') == b""
    assert scanner.flush() == b'data: {"choices": []}'
    huge = b"x" * (2 << 20)  # not SSE at all: passed on rather than held
    assert StreamScanner(drop_usage_chunk=True).feed(huge) == huge


def test_responses_usage_and_id():
    body = (
        b'{"id":"resp_abc","object":"response","output":[{"type":"message","id":"msg_1",'
        b'"content":[{"type":"output_text","text":"say \\"id\\":\\"resp_fake\\""}]}],'
        b'"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},'
        b'"output_tokens":3}}'
    )
    assert scan_body(body) == Usage(32, 40)
    assert response_id_in(body) == "resp_abc"
    event = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_9"'
    assert response_id_in(event) == "resp_9"
    assert response_id_in(b'{"id":"msg_1"}') is None


def test_usage_reader_stream_body_and_limits():
    events = [
        b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":9,',
        b'"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n\n',
    ]
    reader = UsageReader(sse=True, drop_usage_chunk=True, ok=True)
    out = reader.feed(events[0], False) + reader.feed(events[1], True)
    assert out == b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n'  # whole events, no usage
    assert reader.usage() == Usage(4, 9)

    body = b'{"usage":{"prompt_tokens":20,"prompt_tokens_details":{"cached_tokens":16}}}'
    reader = UsageReader(sse=False, drop_usage_chunk=False, ok=True)
    assert reader.feed(body[:10], False) + reader.feed(body[10:], True) == body
    assert reader.usage() == Usage(16, 20)

    error = UsageReader(sse=False, drop_usage_chunk=False, ok=False)  # a 4xx/5xx: not scanned
    error.feed(body, True)
    assert error.usage() is None

    huge = UsageReader(sse=False, drop_usage_chunk=False, ok=True)  # too long to keep
    huge.feed(b" " * MAX_SCANNED_BODY, False)
    huge.feed(body, True)
    assert huge.usage() is None

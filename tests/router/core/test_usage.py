"""Reading cached tokens from bodies and streams; dropping the injected usage chunk; a
response id read from an answer cut into pieces anywhere (property-based: any chunking finds
the id the whole answer holds)."""

from __future__ import annotations

import json
import string
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.usage import (
    MAX_SCANNED_BODY,
    RESPONSE_ID_WITHIN,
    ResponseIdReader,
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


# ---- the response id, read in pieces ----------------------------------------------------

_ID_CHARS = string.ascii_letters + string.digits + "-_"
_ID = st.one_of(  # short, or about the longest the router takes (200 after ``resp_``)
    st.text(_ID_CHARS, min_size=1, max_size=40), st.text(_ID_CHARS, min_size=190, max_size=210)
)
_SPACE = st.text(" \t\r\n", max_size=3)
_DECOYS = st.lists(
    st.sampled_from([
        b'"id":"msg_1",',  # an output item's id
        b'"id":"resp_",',  # no id after the prefix
        b'"text":"say \\"id\\":\\"resp_fake\\"",',  # quoted inside a string: escaped
        b'"object":"response",',
    ]),
    max_size=3,
)  # fmt: skip
# before the id: nothing much, or enough to bring it near the end of the bytes searched
_FILLER = st.one_of(
    st.integers(0, 300), st.integers(RESPONSE_ID_WITHIN - 400, RESPONSE_ID_WITHIN + 50)
)


@st.composite
def answers(draw) -> bytes:
    """A worker's answer to a create: a JSON body or an event stream (response.created
    first), its id written with any spacing, decoys around it, or no id at all."""
    key = b""
    if draw(st.booleans()) or draw(st.booleans()):
        space = draw(_SPACE).encode()
        key = b'"id"' + space + b":" + draw(_SPACE).encode() + b'"resp_' + draw(_ID).encode()
        key += b'",'
    fields = b"".join(draw(_DECOYS)) + key + b"".join(draw(_DECOYS))
    fields += b'"instructions":"' + b"x" * draw(_FILLER) + b'"'
    if draw(st.booleans()):
        return b"{" + fields + b',"status":"completed","output":[]}'
    created = b'{"type":"response.created","response":{' + fields + b"}}"
    done = b'{"type":"response.output_item.added","item":{"id":"msg_2","type":"message"}}'
    return (
        b"event: response.created\ndata: " + created + b"\n\n"
        b"event: response.output_item.added\ndata: " + done + b"\n\ndata: [DONE]\n\n"
    )


def read_in_pieces(data: bytes, cuts: list[int]) -> list[str]:
    """Every id a reader returns, fed ``data`` cut at ``cuts``."""
    reader = ResponseIdReader()
    edges = [0, *sorted(cuts), len(data)]
    found = [reader.feed(data[a:b]) for a, b in pairwise(edges)]
    assert reader.done or len(data) < RESPONSE_ID_WITHIN
    assert len(reader.tail) < 300  # never more than one match's length kept
    return [f for f in found if f is not None]


@settings(max_examples=300, deadline=None)
@given(data=answers(), pieces=st.data())
def test_any_chunking_finds_the_id_the_whole_answer_holds(data: bytes, pieces) -> None:
    whole = response_id_in(data[:RESPONSE_ID_WITHIN])
    if len(data) <= 4096 and pieces.draw(st.booleans(), "byte by byte"):
        cuts = list(range(1, len(data)))
    else:
        cuts = pieces.draw(st.lists(st.integers(0, len(data)), max_size=30), "cuts")
    assert read_in_pieces(data, cuts) == ([] if whole is None else [whole])


def test_an_id_split_anywhere_is_found_once() -> None:
    data = b'{"id":"resp_split3","object":"response","status":"completed","output":[]}'
    for cut in range(len(data) + 1):
        assert read_in_pieces(data, [cut]) == ["resp_split3"], cut
    assert read_in_pieces(data, list(range(1, len(data)))) == ["resp_split3"]


def test_the_reader_keeps_little_and_stops_past_where_an_id_comes() -> None:
    reader = ResponseIdReader()
    assert reader.feed(b" " * (50 << 20)) is None  # one huge piece: not kept
    assert reader.done and reader.tail == b""
    assert reader.feed(b'{"id":"resp_late"}') is None  # past the first bytes: not looked at
    reader = ResponseIdReader()
    for _ in range(RESPONSE_ID_WITHIN // 1024 - 1):
        assert reader.feed(b"x" * 1024) is None
        assert len(reader.tail) < 300
    assert reader.feed(b"x" * 1019) is None
    assert not reader.done
    piece = b'"id":"resp_edge"'
    assert reader.feed(piece) is None  # it straddles the end of the bytes looked in
    assert reader.done

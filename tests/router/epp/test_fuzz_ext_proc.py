"""Fuzzing the endpoint picker's ext_proc stream (hypothesis): sequences of ext_proc messages
in any order, repeated, truncated, cancelled at any point, with bodies of every kind (valid
chat / completions JSON, unknown models, garbage, empty, over ``max_body_bytes``) and headers
of every kind (``:path``, ``:method``, ``:status`` numeric or not, content type, session,
subset hints), in both request body modes and every response body mode.

After every sequence: every booking released exactly once (as many released as routed; the
workers' load, pending prefill, pinned blocks back to 0), the in-flight gauge and the open
streams at 0, unrouted counted at most once, the stream answered or closed within a timeout
(an ImmediateResponse last, and nothing read after it), never the EPP's own 500 nor a logged
error; the gathered body never above the limit, nothing kept once the stream ends. Over the
whole run: no stream object left alive; and the first sequences replayed several times must
not grow the RSS (hypothesis's own bookkeeping grows with a run: the replay measures the EPP).

Drive: most sequences go through :meth:`RequestStream.run` with an async generator (volume:
the generator sees exactly when the stream asks for its next message), a fifth through the
real gRPC service (a grpc.aio server and client on 127.0.0.1, cancelled as a gateway does).
The router core routes to real sim workers (it books them; Envoy is what would send them
the bytes, so none are sent).

Volume: ``CACHE_ROUTER_FUZZ_EXAMPLES`` sequences (default 1,500; 6,000 with
``CACHE_ROUTER_SLOW=1``), then the first ``CORPUS``
of them replayed ``REPLAYS`` times; ``CACHE_ROUTER_FUZZ_REPORT=FILE`` appends the counts as
JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import orjson
import pytest
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from ext_proc_support import (
    Picker,
    request_body,
    request_headers,
    response_body,
    response_headers,
)
from reliability_support import all_zero, booked

from router.config import load_settings
from router.epp.processor import DESTINATION, SUBSET_KEY, SUBSET_NAMESPACE, RequestStream
from router.service.app import RouterApp, create_app
from traces.live.fleet import Service, sim_workers

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
TOTAL = int(os.environ.get("CACHE_ROUTER_FUZZ_EXAMPLES", 6000 if SLOW else 1500))
LIMIT = 64 << 10  # max_body_bytes of the fuzzed EPP: bodies over it stay cheap
EXCHANGE_TIMEOUT_S = 10.0  # one sequence's answers; past it, the stream hangs
CORPUS = 300  # sequences kept from the run, replayed REPLAYS times to watch the RSS
REPLAYS = 5
RSS_GROWTH_MIB = 16  # over the replays, after one warm round: a leak of 11 KiB a sequence
SESSION = "x-session-id"
ProcessingRequest = pb.ProcessingRequest


# ---- the EPP under test --------------------------------------------------------------------


class ErrorLog(logging.Handler):
    """Error records of the router and grpc: a traceback is a violation."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"[:300])


@dataclass
class Harness:
    """A router app and its EPP gRPC service on an event loop in a thread; the counts."""

    urls: list[str]
    loop: asyncio.AbstractEventLoop = field(default_factory=uvloop.new_event_loop)
    sequences: int = 0
    via: Counter = field(default_factory=Counter)
    ends: Counter = field(default_factory=Counter)
    answers: Counter = field(default_factory=Counter)
    errors: ErrorLog = field(default_factory=ErrorLog)
    corpus: list = field(default_factory=list)  # the first sequences, replayed for RSS
    replay_growth: int = 0

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        values = {"workers": self.urls, "max_body_bytes": LIMIT, "max_inflight": 1,
                  "log_level": "critical"}  # fmt: skip
        self.app: RouterApp = create_app(load_settings(**values))
        self.picker: Picker = self.run(self._start())
        for name in ("cache_router", "grpc"):
            logging.getLogger(name).addHandler(self.errors)
        self.started = time.monotonic()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> Picker:
        await self.app.startup()
        for _ in range(250):
            if all(w.models for w in self.app.pool.workers):
                break
            await asyncio.sleep(0.02)
        return await Picker(self.app).__aenter__()  # grpc.aio binds to the running loop

    def close(self) -> None:
        for name in ("cache_router", "grpc"):
            logging.getLogger(name).removeHandler(self.errors)

        async def stop() -> None:
            await self.picker.__aexit__()
            await self.app.shutdown()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def report(self) -> dict:
        summary = {
            "test": "ext_proc",
            "sequences": self.sequences,
            "via": dict(self.via),
            "ends": dict(self.ends),
            "answers": dict(sorted(self.answers.items())),
            "seconds": round(time.monotonic() - self.started, 1),
            "replayed": len(self.corpus) * REPLAYS,
            "replay_rss_growth_mib": round(self.replay_growth / 2**20, 1),
            "errors_logged": len(self.errors.records),
        }
        out = os.environ.get("CACHE_ROUTER_FUZZ_REPORT")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(summary) + "\n")
        return summary


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(2, ["--time-scale", "50", "--log-level", "warning"]) as started:
        yield started


@pytest.fixture(scope="module")
def harness(workers) -> Iterator[Harness]:
    h = Harness([w.url for w in workers])
    yield h
    h.close()


# ---- strategies ------------------------------------------------------------------------------

MODEL = "sim-model"
text = st.text(max_size=60)


def share(k: int, n: int) -> st.SearchStrategy[bool]:
    """True for about ``k`` in ``n`` draws; the common outcome listed first (hypothesis
    favours the first choices, as it favours small integers)."""
    choices = [True] * k + [False] * (n - k)
    return st.sampled_from(choices if 2 * k >= n else choices[::-1])


KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
         "/generate": "generate", "/v1/responses": "responses"}  # fmt: skip


@st.composite
def json_body(draw, path: str | None = None) -> bytes:
    """A chat, completions, generate or responses body, mostly the kind ``path`` takes:
    valid, or near it."""
    if path in KINDS and draw(share(9, 10)):
        kind = KINDS[path]
    else:
        kind = draw(st.sampled_from(sorted(KINDS.values())))
    model = draw(st.sampled_from([MODEL] * 12 + ["nobody", "", 7, None]))
    body: dict = {"model": model}
    if kind == "chat":
        content = draw(text if draw(share(9, 10)) else st.integers(-9, 9) | st.lists(text))
        body["messages"] = [{"role": draw(st.sampled_from(["user", "system"])), "content": content}]
    elif kind == "completion":
        body["prompt"] = draw(text | st.lists(st.integers(-3, 2**33), max_size=8))
    elif kind == "generate":
        body["text"] = draw(text)
    else:
        body["input"] = draw(text)
        if draw(share(1, 5)):
            body["previous_response_id"] = draw(st.sampled_from(["resp_fuzz", "resp_nobody"]))
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans() if draw(share(9, 10)) else st.integers(-9, 9))
    if draw(st.booleans()):
        body["max_tokens"] = draw(
            st.integers(1, 64) if draw(share(9, 10)) else st.integers(-5, 2**40)
        )
    return orjson.dumps(body)


hostile_body = st.one_of(
    st.binary(max_size=300),
    st.just(b""),
    st.integers(LIMIT - 64, LIMIT + 5000).map(lambda n: b'{"prompt": "' + b"a" * n + b'"}'),
    st.sampled_from(
        [b"{", b"[]", b"null", b'{"messages": 5}', b"\xff\xfe", b'{"prompt": "\xc3("}']
    ),
)


@st.composite
def body_bytes(draw, path: str | None = None) -> bytes:
    """Mostly a body for ``path`` (valid or near), else garbage, empty or huge."""
    return draw(json_body(path) if draw(share(7, 10)) else hostile_body)


PATHS = ["/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses",
         "/v1/responses/resp_fuzz", "/v1/responses/resp_nobody/cancel", "/v1/embeddings",
         "/v1/models", "/v1/models?limit=1", "/health", "/", "/v1/nowhere"]  # fmt: skip
GENERATION = ["/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"]
path = st.sampled_from(PATHS) | text.map(lambda s: "/" + s)
method = st.sampled_from(["POST"] * 5 + ["GET"] * 2 + ["DELETE", "PUT", ""]) | text
STATUSES = [b"200", b"200", b"404", b"500", b"503", b"banana", b"", b"2000", b"099", b"20",
            "٢٠٠".encode(), b"-1", b"9" * 5000, None]  # fmt: skip
status = st.sampled_from(STATUSES) | st.binary(max_size=6)
SSE_USAGE = (b'data: {"id": "cmpl-1", "choices": [{"text": "a"}]}\n\n'
             b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1, '
             b'"prompt_tokens_details": {"cached_tokens": 3}}}\n\ndata: [DONE]\n\n')  # fmt: skip
answer_bytes = st.one_of(
    st.sampled_from([
        SSE_USAGE, b'{"id": "resp_fuzz", "object": "response", "usage": {"input_tokens": 3}}',
        b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}', b"", b"data: x",
    ]),
    st.binary(max_size=200),
)  # fmt: skip
MODES = ["BUFFERED", "FULL_DUPLEX_STREAMED"]
RESPONSE_MODES = ["STREAMED", "NONE", "FULL_DUPLEX_STREAMED", "BUFFERED"]


@st.composite
def subset(draw, urls: list[str]) -> struct_pb2.Struct | None:
    if not draw(share(1, 4)):
        return None
    endpoints = [u.removeprefix("http://") for u in urls]
    value = draw(
        st.lists(st.sampled_from([*endpoints, "10.9.9.9:1", ""]), max_size=3)
        | st.sampled_from([",".join(endpoints), "nonsense", ""])
    )
    hint = struct_pb2.Struct()
    hint.update({SUBSET_KEY: value})
    return hint


@st.composite
def headers_message(draw, urls: list[str], end: bool | None = None) -> ProcessingRequest:
    extra: list[tuple[str, bytes]] = []
    if draw(st.booleans()):
        kinds = [b"application/json", b"multipart/form-data; boundary=x", b"\xff", b""]
        extra.append(("content-type", draw(st.sampled_from(kinds))))
    if draw(st.booleans()):
        extra.append((SESSION, draw(st.binary(max_size=20))))
    if draw(share(1, 10)):  # a pseudo-header again, after the first
        name = draw(st.sampled_from([":path", ":method", ":status"]))
        extra.append((name, draw(st.binary(max_size=20))))
    if draw(share(7, 10)):  # mostly what the router routes, else anything
        method_path = ("POST", draw(st.sampled_from(GENERATION)))
    else:
        method_path = (draw(method), draw(path))
    message = request_headers(
        *method_path, draw(st.booleans()) if end is None else end,
        draw(st.sampled_from(MODES)), draw(st.sampled_from(RESPONSE_MODES)), extra,
    )  # fmt: skip
    hint = draw(subset(urls))
    if hint is not None:
        message.metadata_context.filter_metadata[SUBSET_NAMESPACE].CopyFrom(hint)
    return message


@st.composite
def pieces(draw, data: bytes) -> list[bytes]:
    """``data`` cut at random points; sometimes many pieces past the limit (full duplex)."""
    if draw(share(1, 20)):
        size = draw(st.integers(8 << 10, 32 << 10))
        return [b"p" * size] * draw(st.integers(2, 12))
    n = draw(st.integers(1, 3))
    if n == 1 or len(data) < 2:
        return [data]
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), min_size=n - 1, max_size=n - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def path_of(message: ProcessingRequest) -> str | None:
    """The ``:path`` a request headers message names (the first)."""
    for header in message.request_headers.headers.headers:
        if header.key == ":path":
            return header.raw_value.decode("latin-1")
    return None


@st.composite
def protocol_sequence(draw, urls: list[str]) -> list[ProcessingRequest]:
    """What a gateway sends for one request (headers, body, response), then mutated:
    messages repeated, dropped, swapped, the end cut off."""
    has_body = draw(share(4, 5))
    messages = [draw(headers_message(urls, end=not has_body))]
    if has_body:
        cut = draw(pieces(draw(body_bytes(path_of(messages[0])))))
        messages += [request_body(p, end=i == len(cut) - 1) for i, p in enumerate(cut)]
        if draw(share(1, 6)):
            messages.append(ProcessingRequest(request_trailers={}))
    if draw(share(3, 4)):
        no_body = draw(share(1, 6))
        messages.append(response_headers(draw(status), end=no_body))
        if not no_body:
            answer = draw(answer_bytes)
            cut = draw(pieces(answer)) if len(answer) < 1000 else [answer]
            messages += [response_body(p, end=i == len(cut) - 1) for i, p in enumerate(cut)]
        if draw(share(1, 6)):
            messages.append(ProcessingRequest(response_trailers={}))
    for _ in range(draw(st.integers(0, 2))):
        if not messages:
            break
        i = draw(st.integers(0, len(messages) - 1))
        op = draw(st.sampled_from(["repeat", "drop", "swap", "cut"]))
        if op == "repeat":
            messages.insert(i, messages[i])
        elif op == "drop":
            del messages[i]
        elif op == "swap":
            j = draw(st.integers(0, len(messages) - 1))
            messages[i], messages[j] = messages[j], messages[i]
        else:
            del messages[i:]
    return messages


@st.composite
def any_message(draw, urls: list[str]) -> ProcessingRequest:
    which = draw(st.integers(0, 6))
    if which == 0:
        return draw(headers_message(urls))
    if which in (1, 2):
        return request_body(draw(body_bytes()), draw(st.booleans()))
    if which == 3:
        return response_headers(draw(status), draw(st.booleans()))
    if which == 4:
        return response_body(draw(answer_bytes), draw(st.booleans()))
    if which == 5:
        return ProcessingRequest(request_trailers={})
    return ProcessingRequest()


@st.composite
def sequence(draw, urls: list[str]) -> tuple[list[ProcessingRequest], str, str, int]:
    """Messages, how they go (``direct`` or ``grpc``), how the stream ends (``complete``:
    half-closed; ``hold``: left open; ``cancel``: cancelled after ``k`` messages)."""
    if draw(share(3, 4)):
        messages = draw(protocol_sequence(urls))
    else:
        messages = draw(st.lists(any_message(urls), max_size=8))
    via = "grpc" if draw(share(1, 5)) else "direct"
    ends = ["complete", "cancel"] if via == "grpc" else ["complete", "complete", "hold", "cancel"]
    end = draw(st.sampled_from(ends))
    k = draw(st.integers(0, len(messages)))
    return messages, via, end, k


# ---- one sequence and its invariants ---------------------------------------------------------


@dataclass
class Outcome:
    answers: list
    read_after_immediate: bool = False
    over_limit: bool = False
    kept_at_end: int = 0
    ended: bool = True  # the stream ended by itself (no cancel needed)
    rpc_error: str | None = None  # the gRPC stream failed (not cancelled by us)


def is_immediate(answer) -> bool:
    return answer.WhichOneof("response") == "immediate_response"


def routes(answer) -> bool:
    """An answer that names an endpoint: a booking made."""
    which = answer.WhichOneof("response")
    if which not in ("request_headers", "request_body"):
        return False
    headers = getattr(answer, which).response.header_mutation.set_headers
    return any(h.header.key == DESTINATION for h in headers)


async def drive_direct(h: Harness, messages: list, end: str, k: int) -> Outcome:
    """Through :meth:`RequestStream.run`: the generator checks, before each message, what
    the stream holds and whether it was already closed by an ImmediateResponse."""
    stream = RequestStream(h.app.core, SESSION, h.picker.processor.endpoints)
    outcome = Outcome([])
    waiting = asyncio.Event()
    sent = messages[:k] if end == "cancel" else messages

    def check() -> None:
        if any(is_immediate(a) for a in outcome.answers):
            outcome.read_after_immediate = True
        if sum(map(len, stream.body)) > LIMIT:
            outcome.over_limit = True

    async def feed() -> AsyncIterator:
        for message in sent:
            check()
            yield message
        check()
        if end != "complete":
            waiting.set()
            await asyncio.Event().wait()

    async def consume() -> None:
        async for answer in stream.run(feed()):
            outcome.answers.append(answer)

    task = asyncio.ensure_future(consume())
    waiter = asyncio.ensure_future(waiting.wait())
    await asyncio.wait([task, waiter], timeout=EXCHANGE_TIMEOUT_S, return_when="FIRST_COMPLETED")
    waiter.cancel()
    if not task.done():
        outcome.ended = False
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    outcome.kept_at_end = sum(map(len, stream.body))
    return outcome


async def drive_grpc(h: Harness, messages: list, end: str, k: int) -> Outcome:
    """Through the real gRPC service: half-closed after the messages, or cancelled after
    ``k`` of them (its answers read meanwhile)."""
    assert h.picker.stub is not None
    outcome = Outcome([])
    if end == "complete":
        call = h.picker.stub.Process(iter(messages))
    else:
        gone, stop = asyncio.Event(), asyncio.Event()

        async def feed() -> AsyncIterator:
            for message in messages[:k]:
                yield message
            gone.set()
            await stop.wait()  # until cancelled: then it ends (no task left behind)

        call = h.picker.stub.Process(feed())

    async def read() -> None:
        async for answer in call:
            outcome.answers.append(answer)

    reader = asyncio.ensure_future(read())
    if end == "complete":
        await asyncio.wait([reader], timeout=EXCHANGE_TIMEOUT_S)
    else:
        waiter = asyncio.ensure_future(gone.wait())
        await asyncio.wait(
            [reader, waiter], timeout=EXCHANGE_TIMEOUT_S, return_when="FIRST_COMPLETED"
        )
        waiter.cancel()
        await asyncio.sleep(0.002 * (k % 4))  # some answers come back first, some not
    if not reader.done():
        outcome.ended = False
        call.cancel()
    if end != "complete":
        stop.set()
    try:
        await reader
    except asyncio.CancelledError:
        pass
    except grpc.aio.AioRpcError as error:
        # ours (cancelled); or, after an ImmediateResponse, the client's view of a stream
        # the EPP closed while the client still had messages to send (grpc-core: INTERNAL);
        # else the service failed
        closed = any(is_immediate(a) for a in outcome.answers)
        if error.code() != grpc.StatusCode.CANCELLED and not closed:
            outcome.rpc_error = f"{error.code().name}: {error.details()}"
    return outcome


def snapshot(app: RouterApp) -> tuple[int, int]:
    released = sum(sum(w.stats.requests.values()) for w in app.pool.workers)
    return released, sum(app.pool.stats.unrouted.values())


async def one_sequence(h: Harness, messages: list, via: str, end: str, k: int) -> list[str]:
    """Run one sequence; the invariants it broke (empty: none)."""
    app = h.app
    released0, unrouted0 = snapshot(app)
    errors0 = len(h.errors.records)
    drive = drive_direct if via == "direct" else drive_grpc
    outcome = await drive(h, messages, end, k)
    stats = app.pool.stats

    def idle() -> bool:
        return stats.in_flight == 0 and h.picker.processor.streams == 0 and all_zero(booked(app))

    deadline = time.monotonic() + 5
    while not idle() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    broken = []
    answers = outcome.answers
    if not idle():
        broken.append(f"not released: in_flight {stats.in_flight}, streams "
                      f"{h.picker.processor.streams}, booked {booked(app)}")  # fmt: skip
    if stats.in_flight < 0:
        broken.append(f"in flight below 0: {stats.in_flight}")
    if outcome.rpc_error is not None:
        broken.append(f"the gRPC stream failed: {outcome.rpc_error}")
    if end == "complete" and not outcome.ended:
        broken.append("a half-closed stream did not end: it hangs")
    immediates = [i for i, a in enumerate(answers) if is_immediate(a)]
    if immediates and immediates[0] != len(answers) - 1:
        broken.append("answers after an ImmediateResponse")
    if outcome.read_after_immediate:
        broken.append("a message read after an ImmediateResponse")
    if immediates and end == "hold" and not outcome.ended:
        broken.append("the stream stayed open after an ImmediateResponse")
    for i in immediates:
        immediate = answers[i].immediate_response
        if immediate.status.code == 500 or not 200 <= immediate.status.code < 600:
            broken.append(f"immediate {immediate.status.code}: {immediate.body[:120]!r}")
        elif immediate.status.code != 200 and b'"error"' not in immediate.body:
            broken.append(f"immediate without the error envelope: {immediate.body[:120]!r}")
    if outcome.over_limit:
        broken.append(f"a gathered body past max_body_bytes ({LIMIT})")
    if outcome.kept_at_end:
        broken.append("body pieces kept after the stream ended")
    released, unrouted = snapshot(app)
    booked_count = sum(routes(a) for a in answers)
    h.answers["routed"] += booked_count
    if end != "cancel" and released - released0 != booked_count:
        broken.append(f"routed {booked_count} times, released {released - released0}")
    if booked_count > 1:
        broken.append(f"routed {booked_count} times in one stream")
    errors = [
        a for a in answers[-1:] if is_immediate(a) and a.immediate_response.status.code != 200
    ]
    counted = unrouted - unrouted0
    if counted > 1 or (end != "cancel" and errors and booked_count == 0 and counted != 1):
        broken.append(f"unrouted counted {counted} times")
    if len(h.errors.records) > errors0:
        broken.append(f"logged: {h.errors.records[errors0:][:2]}")
    for a in answers:
        which = a.WhichOneof("response") or "none"
        if which == "immediate_response":
            which = f"immediate {a.immediate_response.status.code} {a.immediate_response.details}"
        h.answers[which] += 1
    h.via[via] += 1
    h.ends[end] += 1
    return broken


# ---- tests ----------------------------------------------------------------------------------


def test_fuzz_ext_proc_sequences(harness: Harness) -> None:
    """Every sequence keeps every invariant (hypothesis shrinks a violation to its least)."""

    @settings(max_examples=TOTAL, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=sequence(harness.urls))
    def fuzz(case) -> None:
        messages, via, end, k = case
        broken = harness.run(one_sequence(harness, messages, via, end, k), 60)
        assert broken == [], (broken, [str(m)[:200] for m in messages], via, end, k)
        harness.sequences += 1
        if len(harness.corpus) < CORPUS:
            harness.corpus.append(case)

    fuzz()


def test_fuzzed_epp_holds_nothing_and_stays_bounded(harness: Harness) -> None:
    """Runs after the fuzz (file order): the first sequences replayed, the RSS after each
    round (a stream that keeps anything grows it), then the verdict over the whole run."""

    def replay() -> None:
        for messages, via, end, k in harness.corpus:
            broken = harness.run(one_sequence(harness, messages, via, end, k), 60)
            assert broken == [], (broken, via, end, k)

    replay()  # warm: pools, caches, learned owners at their steady size
    gc.collect()
    sizes = [rss()]
    for _ in range(REPLAYS):
        replay()
        gc.collect()
        sizes.append(rss())
    harness.replay_growth = sizes[-1] - min(sizes)  # what was freed meanwhile hides nothing
    summary = harness.report()
    assert summary["sequences"] >= min(TOTAL, 100), summary
    assert summary["via"].get("grpc", 0) > 0 and summary["via"].get("direct", 0) > 0
    assert any(name.startswith("immediate") for name in summary["answers"])
    assert summary["answers"].get("routed", 0) > 0  # some were routed, not all refused

    async def alive() -> int:
        gc.collect()
        return sum(isinstance(o, RequestStream) for o in gc.get_objects())

    assert harness.run(alive()) == 0  # every stream, and what it gathered, freed
    assert summary["replay_rss_growth_mib"] < RSS_GROWTH_MIB, summary
    assert harness.errors.records == []

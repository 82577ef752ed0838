"""Fuzzing every endpoint in process (hypothesis → direct ASGI calls): malformed and hostile
bodies, headers, paths and queries. The router must answer each with a status below 500 and,
when it answers itself with an error, the OpenAI JSON envelope; it must never hang, and
nothing may stay booked.

Why direct ASGI calls: volume. Thousands of inputs per second reach the real handlers
(raw-ASGI hot path, the admin app, the access rules, the body bounds) and the real upstream
client, which forwards what is routable to an :class:`EchoWorker` that always answers 200,
so any 5xx seen is the router's own. Byte-level HTTP (invalid UTF-8 in the request line,
huge headers, bad framing, slow clients) is fuzzed over real sockets in test_fuzz_socket.py.

Volume: ``CACHE_ROUTER_FUZZ_EXAMPLES`` (default 3,000 with CACHE_ROUTER_SLOW=1, else 300)
shared by the three tests (the 10,000-input bar run: bench/RESULTS.md);
``CACHE_ROUTER_FUZZ_REPORT=FILE`` appends the counts as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator

import orjson
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import EchoWorker, all_zero, asgi_call, booked

from router.config import load_settings
from router.proxy.app import RouterApp, create_app

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
TOTAL = int(os.environ.get("CACHE_ROUTER_FUZZ_EXAMPLES", 3000 if SLOW else 300))
LIMIT = 64 << 10  # max_body_bytes of the fuzzed router: oversized bodies stay cheap
CLIENT_KEY = b"client-key-0123"
ADMIN_KEY = b"admin-key-4567"


def fuzz_settings(share: float) -> settings:
    """``share`` of the total examples; no deadline (the router's loop runs in a thread)."""
    return settings(
        max_examples=max(50, int(TOTAL * share)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


class Harness:
    """A router app (and its echo worker) on an event loop in a thread; counts answers."""

    def __init__(self, **values) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.worker = self.run(EchoWorker().start())
        workers = [self.worker.url] if values.pop("with_worker", True) else []
        base = {
            "workers": workers,
            "max_body_bytes": LIMIT,
            "api_keys": [CLIENT_KEY.decode()],
            "admin_key": ADMIN_KEY.decode(),
            "read_timeout_s": 5.0,
            "log_level": "critical",
        }
        self.app: RouterApp = create_app(load_settings(**{**base, **values}))
        self.statuses: Counter[int] = Counter()
        self.router_5xx: list[tuple] = []
        self.calls = 0
        self.from_worker = 0  # answers the worker gave (the router marks them)

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, method: str, path: str, headers, chunks, query: bytes = b"") -> None:
        response = self.run(
            asgi_call(self.app, method, path, headers, chunks, query, timeout=10.0), 15.0
        )
        self.calls += 1
        self.statuses[response.status] += 1
        from_worker = b"x-cache-router-worker" in response.headers
        self.from_worker += from_worker
        assert response.status >= 200, "no response"
        if response.status >= 500 and not from_worker:
            self.router_5xx.append((method, path, headers, b"".join(chunks)[:300], response))
        if response.status >= 400 and not from_worker:
            assert response.headers.get(b"content-type", b"").startswith(b"application/json")
            error = orjson.loads(response.body)["error"]
            assert isinstance(error["message"], str) and isinstance(error["code"], str)

    def booked(self):
        async def read():
            return booked(self.app)

        return self.run(read())

    def close(self) -> None:
        async def stop():
            self.app.pool.close()
            self.worker.close()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def report(self, name: str) -> dict:
        summary = {
            "test": name,
            "inputs": self.calls,
            "statuses": dict(sorted(self.statuses.items())),
            "router_5xx": len(self.router_5xx),
            "worker_requests": self.worker.requests,
        }
        out = os.environ.get("CACHE_ROUTER_FUZZ_REPORT")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(summary) + "\n")
        return summary


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    # an admin key the inputs never carry: membership changes (fuzzed with the right key on
    # admin_harness) must not remove the worker the generation inputs are routed to
    h = Harness(admin_key="an-admin-key-the-fuzz-does-not-know")
    yield h
    h.close()


# ---- strategies ------------------------------------------------------------------------

leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)


def _containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6)


json_value = st.recursive(leaf, _containers, max_leaves=25)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_value},
    optional={
        "content": st.text(max_size=300) | json_value,
        "name": json_value,
        "tool_calls": json_value,
    },
)
token_ids = st.lists(st.integers(min_value=-3, max_value=2**33), max_size=40)
fields = {
    "model": st.text(max_size=20) | json_value,
    "messages": st.lists(message, max_size=4) | json_value,
    "prompt": st.text(max_size=300) | token_ids | st.lists(token_ids, max_size=3) | json_value,
    "text": st.text(max_size=300) | st.lists(st.text(max_size=20), max_size=3) | json_value,
    "input_ids": token_ids | st.lists(token_ids, max_size=3) | json_value,
    "stream": st.booleans() | json_value,
    "stream_options": st.fixed_dictionaries({"include_usage": json_value}) | json_value,
    "max_tokens": st.integers(min_value=-(2**63), max_value=2**64 - 1) | json_value,
    "max_completion_tokens": st.integers(min_value=-5, max_value=2**40) | json_value,
    "sampling_params": st.fixed_dictionaries({"max_new_tokens": json_value}) | json_value,
    "session_id": st.text(max_size=30) | json_value,
    "user": st.text(max_size=30) | st.integers(-(2**63), 2**63) | json_value,
    "tools": json_value,
    "n": json_value,
}
body_dict = st.fixed_dictionaries({}, optional=fields)
HUGE_NUMBERS = [
    b"1e400",
    b"-1e400",
    b"123456789012345678901234567890",
    b"-123456789012345678901234567890",
    b"NaN",
    b"Infinity",
    b"0.0000000000000000000000000001",
    b"18446744073709551616",
]


VALID = {
    "/v1/chat/completions": {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hello"}],
    },
    "/v1/completions": {"model": "fake-model", "prompt": "hello"},
    "/generate": {"text": "hello", "sampling_params": {"max_new_tokens": 4}},
}


@st.composite
def generation_body(draw, path: str = "/v1/completions") -> bytes:
    """A body for a generation endpoint: valid ones with some fields replaced by anything,
    JSON near the schema, then the hostile."""
    kind = draw(
        st.sampled_from(
            ["near_valid"] * 6
            + ["json"] * 3
            + ["raw", "mutated", "deep", "huge_number", "empty", "oversized", "bad_utf8", "value"]
        )
    )
    if kind == "near_valid":
        body = dict(VALID[path])
        body.update(draw(st.dictionaries(st.sampled_from(sorted(fields)), json_value, max_size=3)))
        for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2)):
            body[name] = draw(fields[name])
        return orjson.dumps(body)
    if kind == "json":
        return orjson.dumps(draw(body_dict))
    if kind == "value":  # valid JSON, not an object
        return orjson.dumps(draw(json_value))
    if kind == "raw":
        return draw(st.binary(max_size=600))
    if kind == "mutated":
        data = bytearray(orjson.dumps(draw(body_dict)))
        for _ in range(draw(st.integers(1, 6))):
            if not data:
                break
            i = draw(st.integers(0, len(data) - 1))
            op = draw(st.sampled_from(["flip", "cut", "dup", "insert"]))
            if op == "flip":
                data[i] = draw(st.integers(0, 255))
            elif op == "cut":
                del data[i:]
            elif op == "dup":
                data[i:i] = data[i : i + draw(st.integers(1, 50))]
            else:
                data[i:i] = draw(st.binary(min_size=1, max_size=8))
        return bytes(data)
    if kind == "deep":
        depth = draw(st.integers(1, 20_000))
        key = draw(st.sampled_from(["messages", "prompt", "input_ids", "text", "tools"]))
        inner = b"[" * depth + b"]" * depth
        if draw(st.booleans()):
            inner = b'{"a":' * depth + b"1" + b"}" * depth
        return b'{"%s": %s}' % (key.encode(), inner)
    if kind == "huge_number":
        key = draw(st.sampled_from(["max_tokens", "prompt", "input_ids", "stream", "user"]))
        number = draw(st.sampled_from(HUGE_NUMBERS))
        if key in ("prompt", "input_ids"):
            number = b"[" + number + b"]"
        return b'{"prompt": "hi", "text": "hi", "messages": [{"role": "user"}], "%s": %s}' % (
            key.encode(),
            number,
        )
    if kind == "empty":
        return b""
    if kind == "oversized":
        return b'{"prompt": "' + b"a" * (LIMIT + draw(st.integers(0, 5000))) + b'"}'
    # bad_utf8: invalid UTF-8 inside otherwise fine JSON
    junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
    message = b'{"role": "user", "content": "' + junk + b'"}'
    return b'{"prompt": "a' + junk + b'b", "messages": [' + message + b"]}"


# Header names and values as the HTTP layer can deliver them (llhttp refuses control bytes
# and non-token names on the wire; test_fuzz_socket.py sends those): tokens, and values of
# any byte but CTLs (obs-text 0x80-0xff included).
TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
header_name = st.binary(min_size=1, max_size=24).map(
    lambda b: bytes(TCHAR[x % len(TCHAR)] for x in b)
)
header_value = st.binary(max_size=200).map(
    lambda b: bytes(x if x == 9 or 32 <= x < 127 or x > 127 else 32 for x in b).strip()
)
auth = st.sampled_from(
    [b"Bearer " + CLIENT_KEY] * 12
    + [
        b"bearer " + CLIENT_KEY,
        b"Bearer " + ADMIN_KEY,
        b"Bearer wrong",
        b"Bearer ",
        b"Basic Zm9vOmJhcg==",
        CLIENT_KEY,
        b"Bearer \x80\xff",
        b"Bearer client-key-012",  # a prefix of the key
        None,
    ]
)

# A query string as the wire can carry it (llhttp refuses non-ASCII and spaces in the URL)
URLCHAR = bytes(c for c in range(0x21, 0x7F) if c != ord("#"))
query_bytes = st.binary(max_size=40).map(lambda b: bytes(URLCHAR[x % len(URLCHAR)] for x in b))


@st.composite
def request_headers(draw, body: bytes) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    value = draw(auth)
    if value is not None:
        headers.append((b"authorization", value))
    if draw(st.booleans()):
        kinds = [b"application/json", b"text/plain", b"\xff\xfe", b""]
        headers.append((b"content-type", draw(st.sampled_from(kinds))))
    if draw(st.integers(0, 3)) == 0:
        declared = draw(
            st.sampled_from(
                [str(len(body)).encode(), b"0", b"-1", b"abc", b"99999999999999999999999", b" 5"]
            )
        )
        headers.append((b"content-length", declared))
    if draw(st.booleans()):
        headers.append((b"x-session-id", draw(header_value)))
    if draw(st.integers(0, 4)) == 0:
        headers.append((b"x-admin-key", draw(st.sampled_from([ADMIN_KEY, b"nope", b""]))))
    for _ in range(draw(st.integers(0, 3))):
        headers.append((draw(header_name), draw(header_value)))
    if draw(st.integers(0, 30)) == 0:
        headers.append((b"x-huge", b"h" * draw(st.integers(10_000, 200_000))))
    return headers


@st.composite
def chunked(draw, body: bytes) -> list[bytes]:
    """The body as ASGI messages: one, or split at random points (a slow client)."""
    n = draw(st.integers(1, 4))
    if n == 1 or len(body) < 2:
        return [body]
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), min_size=n - 1, max_size=n - 1)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


@st.composite
def generation_request(draw):
    method_path = draw(
        st.sampled_from(
            [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/generate")]
        )
    )
    body = draw(generation_body(method_path[1]))
    headers = draw(request_headers(body))
    query = draw(st.sampled_from([b"", b"a=1", b"%ff%fe=%00"]) | query_bytes)
    return method_path, headers, draw(chunked(body)), query


path_text = st.text(max_size=40).map(lambda s: "/" + s)
other_paths = (
    st.sampled_from(
        [
            "/workers",
            "/v1/models",
            "/health",
            "/metrics",
            "/dashboard",
            "/dashboard/data",
            "/v1/chat/completions",
            "/v1/completions",
            "/generate",
            "/docs",
            "/openapi.json",
            "/",
            "/workers/",
            "//workers",
            "/%2e%2e/etc/passwd",
        ]
    )
    | path_text
)


@st.composite
def other_request(draw):
    """Any method on any path (wrong methods on the generation paths included)."""
    method = draw(st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"]))
    path = draw(other_paths)
    if method == "POST" and path in ("/v1/chat/completions", "/v1/completions", "/generate"):
        method = "GET"
    body = draw(st.sampled_from([b""]) | st.binary(max_size=300) | generation_body())
    headers = draw(request_headers(body))
    query = draw(st.sampled_from([b"", b"url=http://127.0.0.1:9"]) | query_bytes)
    return (method, path), headers, draw(chunked(body)), query


@st.composite
def admin_request(draw):
    """Membership changes with the right admin key: bodies and queries of every shape."""
    method = draw(st.sampled_from(["POST", "DELETE", "GET"]))
    url = draw(
        st.sampled_from(
            ["http://127.0.0.1:9", "127.0.0.1:9", "ftp://x", "", "http://", "http://127.0.0.1:x"]
        )
        | st.text(max_size=40)
    )
    payload = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "url": st.just(url) | json_value,
                "kv_capacity_tokens": st.integers(-(2**63), 2**64 - 1) | json_value,
            },
        )
    )
    body = draw(
        st.sampled_from([orjson.dumps(payload)] * 3 + [b"", b"[]", b"{", b"\xff"])
        | generation_body()
    )
    keys = [(b"x-admin-key", ADMIN_KEY), (b"authorization", b"Bearer " + ADMIN_KEY)]
    headers = [draw(st.sampled_from(keys))]
    query = draw(st.sampled_from([b"", b"url=" + url.encode("utf-8", "replace")]))
    return (method, "/workers"), headers, [body], query


# ---- tests -----------------------------------------------------------------------------


@fuzz_settings(0.6)
@given(request=generation_request())
def test_fuzz_generation_endpoints(harness: Harness, request) -> None:
    (method, path), headers, chunks, query = request
    harness.call(method, path, headers, chunks, query)


@fuzz_settings(0.25)
@given(request=other_request())
def test_fuzz_every_other_path_and_method(harness: Harness, request) -> None:
    (method, path), headers, chunks, query = request
    harness.call(method, path, headers, chunks, query)


def test_fuzzed_router_gave_no_5xx_and_holds_nothing(harness: Harness) -> None:
    """Runs after the two above (file order): the verdict over everything they sent."""
    summary = harness.report("generation+other")
    assert summary["inputs"] >= 100
    assert harness.worker.parse_errors == [], harness.worker.parse_errors[:3]
    assert harness.router_5xx == [], harness.router_5xx[:3]
    assert all_zero(harness.booked()), harness.booked()
    assert harness.run(_in_flight(harness.app)) == 0
    # every answer marked as the worker's was one the worker gave (how many of the draws
    # were routable varies with the draw, so the count itself is not a verdict)
    assert harness.worker.requests >= harness.from_worker, summary
    assert harness.run(_worker_count(harness.app)) == 1
    # and after all that, well-formed requests still reach the worker, one answer each
    before = harness.worker.requests
    for (method, path), body in WELL_FORMED:
        harness.call(method, path, [CLIENT_AUTH, JSON], [body])
    assert harness.worker.requests - before == len(WELL_FORMED), harness.statuses
    assert all_zero(harness.booked()), harness.booked()


CLIENT_AUTH = (b"authorization", b"Bearer " + CLIENT_KEY)
JSON = (b"content-type", b"application/json")
WELL_FORMED = [
    (
        ("POST", "/v1/chat/completions"),
        b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    ),
    (("POST", "/v1/completions"), b'{"model":"m","prompt":"hello","max_tokens":4}'),
    (("POST", "/generate"), b'{"text":"hello","sampling_params":{"max_new_tokens":4}}'),
] * 4


async def _in_flight(app) -> int:
    return app.pool.stats.in_flight


async def _worker_count(app) -> int:
    return len(app.pool.workers)


@pytest.fixture(scope="module")
def admin_harness() -> Iterator[Harness]:
    h = Harness(with_worker=False)
    yield h
    h.close()


@fuzz_settings(0.15)
@given(request=admin_request())
def test_fuzz_worker_membership_with_the_admin_key(admin_harness: Harness, request) -> None:
    (method, path), headers, chunks, query = request
    admin_harness.call(method, path, headers, chunks, query)


def test_fuzzed_admin_gave_no_5xx(admin_harness: Harness) -> None:
    summary = admin_harness.report("admin")
    assert summary["inputs"] >= 50
    assert admin_harness.router_5xx == [], admin_harness.router_5xx[:3]
    statuses = summary["statuses"]
    assert statuses.get(201, 0) + statuses.get(200, 0) > 0  # some changes went through

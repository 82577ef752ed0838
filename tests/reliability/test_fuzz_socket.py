"""Byte-level fuzzing over real sockets, against the router as `cache-router serve` runs it
(uvicorn + httptools + router.service.server's limits): invalid UTF-8 anywhere, huge and
many headers, bad Content-Length and chunked framing, other protocols, slow clients, and
seeded random mutations of valid requests.

Each exchange must end (an answer or a closed connection) within the read timeout plus slack
(never a hang); every status the router answers itself is below 500 and, for errors, JSON.
Afterwards nothing is booked or in flight, every connection is gone, and the router serves.
``CACHE_ROUTER_SOCKET_FUZZ`` sets the number of random mutations (default 1,000 with
CACHE_ROUTER_SLOW=1, else 150); ``CACHE_ROUTER_FUZZ_REPORT=FILE`` appends the counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter

from reliability_support import all_zero, booked, header, raw_exchange, wait_until

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
MUTATIONS = int(os.environ.get("CACHE_ROUTER_SOCKET_FUZZ", 1000 if SLOW else 150))
READ_TIMEOUT_S = 1.0

BODY = b'{"model": "fake-model", "prompt": "tell me something", "max_tokens": 4}'
STREAM_BODY = (
    b'{"model": "fake-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
)


def request(
    body: bytes = BODY, path: bytes = b"/v1/completions", extra: bytes = b"", method=b"POST"
) -> bytes:
    return (
        method + b" " + path + b" HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (len(body), extra, body)
    )


CASES: dict[str, bytes | list[bytes]] = {
    "valid": request(),
    "valid_stream": request(STREAM_BODY, b"/v1/chat/completions"),
    # invalid UTF-8 everywhere
    "utf8_path": request(path=b"/v1/\xff\xfe"),
    "utf8_query": request(path=b"/v1/completions?a=\xc3\x28"),
    "utf8_header_value": request(extra=b"x-session-id: \xed\xa0\x80\xff\r\n"),
    "utf8_header_name": request(extra=b"x-\xff: 1\r\n"),
    "utf8_body": request(b'{"prompt": "\xff\xfe\xfd"}'),
    "utf8_body_chat": request(b'{"messages": [{"role": "\xc0\xaf"}]}', b"/v1/chat/completions"),
    "percent_bad_utf8": request(path=b"/%ff%fe%00"),
    # sizes
    "huge_header": request(extra=b"x-big: " + b"a" * 1_000_000 + b"\r\n"),
    "many_headers": request(extra=b"".join(b"x-%d: v\r\n" % i for i in range(20_000))),
    "huge_url": request(path=b"/v1/completions?" + b"q" * 200_000),
    "huge_method": b"A" * 100_000 + b" / HTTP/1.1\r\n\r\n",
    "huge_body_declared": request(extra=b"")[:0]
    + b"POST /v1/completions HTTP/1.1\r\ncontent-length: 99999999999999\r\n\r\n{",
    "empty_body": request(b""),
    "body_just_over_limit": request(b'{"prompt": "' + b"x" * (1 << 20) + b'"}'),
    # framing
    "cl_not_a_number": b"POST /v1/completions HTTP/1.1\r\ncontent-length: abc\r\n\r\n" + BODY,
    "cl_negative": b"POST /v1/completions HTTP/1.1\r\ncontent-length: -5\r\n\r\n" + BODY,
    "cl_twice_different": b"POST /v1/completions HTTP/1.1\r\ncontent-length: 3\r\n"
    b"content-length: 70\r\n\r\n" + BODY,
    "cl_and_te": b"POST /v1/completions HTTP/1.1\r\ncontent-length: 5\r\n"
    b'transfer-encoding: chunked\r\n\r\n5\r\n{"a":\r\n0\r\n\r\n',
    "cl_too_long": b"POST /v1/completions HTTP/1.1\r\ncontent-length: 500\r\n\r\n" + BODY,
    "cl_too_short": b"POST /v1/completions HTTP/1.1\r\ncontent-length: 10\r\n\r\n" + BODY,
    "chunk_size_garbage": b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    b"zz\r\nabc\r\n0\r\n\r\n",
    "chunk_size_huge": b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    b"ffffffffffffffff\r\nabc",
    "chunked_valid": b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY),
    "te_unknown": b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n" + BODY,
    "header_no_colon": b"GET /health HTTP/1.1\r\nnocolon\r\n\r\n",
    "header_space_before_colon": b"GET /health HTTP/1.1\r\nx-a : 1\r\n\r\n",
    "header_ctl": b"GET /health HTTP/1.1\r\nx-a: \x00\x01\r\n\r\n",
    "obs_fold": b"GET /health HTTP/1.1\r\nx-a: 1\r\n  folded\r\n\r\n",
    "bare_lf": b"GET /health HTTP/1.1\nhost: x\n\n",
    "nul_in_line": b"GET /hea\x00lth HTTP/1.1\r\n\r\n",
    # other protocols and versions
    "http10": b"POST /v1/completions HTTP/1.0\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY),
    "http09": b"GET /\r\n\r\n",
    "http2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "http_version_99": b"GET /health HTTP/9.9\r\n\r\n",
    "tls_client_hello": bytes.fromhex("16030100a5010000a10303") + bytes(range(200)),
    "method_unknown": b"FOO /v1/completions HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
    "method_connect": b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n",
    "absolute_uri": b"GET http://127.0.0.1:1/health HTTP/1.1\r\n\r\n",
    "asterisk": b"OPTIONS * HTTP/1.1\r\n\r\n",
    "websocket_upgrade": b"GET /v1/completions HTTP/1.1\r\nconnection: upgrade\r\n"
    b"upgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"sec-websocket-version: 13\r\n\r\n",
    "h2c_upgrade": request(extra=b"connection: upgrade, http2-settings\r\nupgrade: h2c\r\n"),
    "expect_continue": request(extra=b"expect: 100-continue\r\n"),
    "only_crlf": b"\r\n" * 1000,
    "nothing": [b""],
    "pipelined_three": request() * 3,
    "pipelined_then_garbage": request() + b"\xff\xfe garbage\r\n\r\n",
    "random_bytes": bytes(random.Random(1).randrange(256) for _ in range(5000)),
    # slow clients: each piece READ_TIMEOUT_S / 3 apart, never finished in time
    "slowloris_head": [request()[i : i + 3] for i in range(0, 45, 3)],
    "slow_body": [request()[:-20], *[b" " for _ in range(10)]],
}
SLOW_CASES = {"slowloris_head": 0.35, "slow_body": 0.35}


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not out:
            break
        i = rng.randrange(len(out))
        op = rng.randrange(6)
        if op == 0:
            out[i] = rng.randrange(256)
        elif op == 1:
            del out[i : i + rng.randint(1, 20)]
        elif op == 2:
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 10)))
        elif op == 3:
            out[i:i] = rng.choice([b"\r\n", b"\n", b":", b" ", b"\x00", b"\r\n\r\n", b"%"])
        elif op == 4:
            out[i:i] = out[i : i + rng.randint(1, 200)] * rng.randint(1, 50)
        else:
            del out[i:]
    return bytes(out)


async def _check(router, name: str, data, counts: Counter, problems: list, pause: float) -> None:
    result = await raw_exchange(router.port, data, pause_s=pause, timeout=READ_TIMEOUT_S + 6)
    if result.timed_out:
        problems.append((name, "hang", result.head[:200]))
        return
    counts[result.status] += 1
    if result.status == 0:
        return  # closed without an answer (e.g. nothing was sent)
    from_worker = header(result.head, b"x-cache-router-worker") is not None
    if result.status >= 500 and not from_worker:
        problems.append((name, result.status, result.body[:300]))
    if result.status >= 400 and not from_worker and result.body:
        try:
            json.loads(result.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            problems.append((name, "not json", result.head[:300], result.body[:200]))


async def test_socket_fuzz(fake_workers, router_server):
    workers = fake_workers(2)
    router = router_server(
        workers=[w.url for w in workers],
        request_read_timeout_s=READ_TIMEOUT_S,
        read_timeout_s=3.0,
        max_header_bytes=65536,
        max_body_bytes=1 << 20,
    )
    counts: Counter[int] = Counter()
    problems: list = []
    sem = asyncio.Semaphore(16)

    async def case(name: str, data) -> None:
        async with sem:  # independent: many wait out the read timeout, so run them together
            await _check(router, name, data, counts, problems, SLOW_CASES.get(name, 0.0))

    await asyncio.gather(*(case(name, data) for name, data in CASES.items()))
    rng = random.Random(20240611)
    seeds = [request(), request(STREAM_BODY, b"/v1/chat/completions"), CASES["chunked_valid"]]

    async def mutated(i: int) -> None:
        data = _mutate(rng, rng.choice(seeds))
        async with sem:
            await _check(router, f"mutation {i}: {data[:80]!r}", data, counts, problems, 0.0)

    await asyncio.gather(*(mutated(i) for i in range(MUTATIONS)))
    total = len(CASES) + MUTATIONS
    report = {
        "test": "socket",
        "inputs": total,
        "statuses": dict(sorted(counts.items())),
        "problems": len(problems),
    }
    if out := os.environ.get("CACHE_ROUTER_FUZZ_REPORT"):
        with open(out, "a") as f:
            f.write(json.dumps(report) + "\n")
    assert problems == [], problems[:5]
    assert counts[200] >= 3 and counts[400] >= 10  # valid requests served, garbage refused
    # nothing stays behind: bookings, in-flight count, connections
    assert await asyncio.to_thread(
        wait_until, lambda: router.call(lambda: all_zero(booked(router.app))), 10
    )
    assert await asyncio.to_thread(
        wait_until,
        lambda: router.call(
            lambda: router.app.pool.stats.in_flight == 0 and router.app.pool.stats.connections == 0
        ),
        10,
    )
    assert (await raw_exchange(router.port, request())).status == 200

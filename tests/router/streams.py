"""A raw HTTP/1.1 streaming client for the proxy tests: it can hang up at any moment.

The disconnect and failover tests need exact control over when a client goes away and
what it received, which a general client hides; this one writes the request, reads what
arrives, and aborts the socket when told to.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass


@dataclass
class StreamResult:
    status: int
    received: bytes
    complete: bool  # the chunked body ended properly and [DONE] arrived
    disconnected: bool  # this client hung up on purpose
    worker: str | None


def request_bytes(path: str, body: dict, headers: dict[str, str] | None = None) -> bytes:
    data = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        "host: 127.0.0.1",
        "content-type: application/json",
        f"content-length: {len(data)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def _status_and_worker(received: bytes) -> tuple[int, str | None]:
    head, _, _ = received.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return 0, None
    status = int(head[9:12])
    worker = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-cache-router-worker":
            worker = value.strip().decode()
    return status, worker


async def stream(
    port: int,
    path: str,
    body: dict,
    *,
    hang_up_after_events: int | None = None,
    hang_up_after_s: float | None = None,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """Send one streamed request; hang up after N events or S seconds if asked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(path, body, headers))
    received = b""
    disconnected = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    hang_at = loop.time() + hang_up_after_s if hang_up_after_s is not None else None
    try:
        while True:
            wait = deadline - loop.time()
            if hang_at is not None:
                wait = min(wait, hang_at - loop.time())
            if wait <= 0:
                disconnected = hang_at is not None and loop.time() >= hang_at
                break
            try:
                data = await asyncio.wait_for(reader.read(65536), wait)
            except TimeoutError:
                continue
            if not data:
                break
            received += data
            if (
                hang_up_after_events is not None
                and received.count(b"data:") >= hang_up_after_events
            ):
                disconnected = True
                break
            if received.endswith(b"0\r\n\r\n"):
                break
    finally:
        writer.transport.abort()  # a hang-up without goodbye, as a killed client does
    status, worker = _status_and_worker(received)
    # an error event (a stream the worker cut, router.proxy.forward) is not a complete answer
    complete = (
        received.endswith(b"0\r\n\r\n")
        and b"data: [DONE]" in received
        and b'data: {"error"' not in received
    )
    return StreamResult(status, received, complete, disconnected, worker)

"""A client's request body read through ASGI: whole and bounded (413), or its first bytes and
a stream of the rest (an audio upload goes to the worker as the client sends it); a
disconnect is :class:`ClientGone`. The proxy's hot path and the admin side read with it."""

from __future__ import annotations

from router.core.errors import PayloadTooLarge


class ClientGone(Exception):
    """The client went away before its request body was complete."""


class BodyStream:
    """The rest of a request body, piece by piece as the client sends it: ``max_body_bytes``
    still holds (413), a disconnect is :class:`ClientGone`."""

    def __init__(self, receive, size: int, limit: int) -> None:
        self.receive = receive
        self.size = size
        self.limit = limit
        self.started = False  # a piece was read: the body cannot be sent again
        self.done = False

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes:
        if self.done:
            raise StopAsyncIteration
        self.started = True
        message = await self.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(f"request body exceeds {self.limit} bytes")
        self.done = not message.get("more_body", False)
        return chunk


async def open_body(receive, limit: int, peek: int) -> tuple[bytes, BodyStream | None]:
    """The body's first ``peek`` bytes or more (all of it if shorter), and a stream of the
    rest (None when there is none)."""
    parts: list[bytes] = []
    size = 0
    while size < peek:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        if not message.get("more_body", False):
            return b"".join(parts), None
    return b"".join(parts), BodyStream(receive, size, limit)


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; 413 past ``limit`` bytes, ClientGone on a disconnect."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)

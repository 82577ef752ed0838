"""ext_proc messages as a gateway sends them, and the EPP's gRPC service on 127.0.0.1 in front
of a router app, for the EPP's tests (imported by path: tests/router/epp is no package)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from router.config import load_settings
from router.epp.endpoints import Endpoints
from router.epp.processor import DESTINATION
from router.epp.service import ExternalProcessor
from router.service.app import RouterApp, create_app

SESSION_HEADER = "x-session-id"
MODES = processing_mode_pb2.ProcessingMode.BodySendMode


def request_headers(
    method: str,
    path: str,
    end: bool = False,
    request_mode: str = "BUFFERED",
    response_mode: str = "STREAMED",
    extra: Iterable[tuple[str, bytes]] = (),
) -> pb.ProcessingRequest:
    pairs = [(":method", method.encode()), (":path", path.encode()), *extra]
    values = [base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs]
    http = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)
    message = pb.ProcessingRequest(request_headers=http)
    message.protocol_config.request_body_mode = MODES.Value(request_mode)
    message.protocol_config.response_body_mode = MODES.Value(response_mode)
    return message


def request_body(data: bytes, end: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end))


def response_headers(status: bytes | None, end: bool = False) -> pb.ProcessingRequest:
    values = [] if status is None else [base_pb2.HeaderValue(key=":status", raw_value=status)]
    http = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)
    return pb.ProcessingRequest(response_headers=http)


def response_body(data: bytes, end: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end))


def kinds(answers: list[pb.ProcessingResponse]) -> list[str]:
    return [a.WhichOneof("response") for a in answers]


def header_of(immediate: pb.ImmediateResponse, name: str) -> bytes | None:
    for option in immediate.headers.set_headers:
        if option.header.key == name:
            return option.header.raw_value
    return None


def booked(app: RouterApp) -> int:
    """Bookings held on the workers (in flight plus pending prefill): 0 when all released."""
    return sum(w.state.num_requests + w.state.pending_prefill_tokens for w in app.pool.workers)


def released(app: RouterApp) -> int:
    """Bookings released so far, every outcome."""
    return sum(sum(w.stats.requests.values()) for w in app.pool.workers)


@asynccontextmanager
async def router_app(urls: list[str], **values) -> AsyncIterator[RouterApp]:
    """A started router app on ``urls`` that knows each worker's models."""
    base = {"workers": urls, "log_level": "warning"}
    app = create_app(load_settings(**{**base, **values}))
    await app.startup()
    try:
        for _ in range(250):  # each worker's /v1/models read (else a model is unknown)
            if all(w.models for w in app.pool.workers):
                break
            await asyncio.sleep(0.02)
        yield app
    finally:
        await app.shutdown()


class Picker:
    """The EPP's gRPC service for ``app`` on 127.0.0.1, and a client channel to it."""

    def __init__(self, app: RouterApp) -> None:
        self.processor = ExternalProcessor(app.core, SESSION_HEADER, Endpoints(5.0))
        self.server = grpc.aio.server()
        external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
            self.processor, self.server
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel: grpc.aio.Channel | None = None
        self.stub: external_processor_pb2_grpc.ExternalProcessorStub | None = None

    async def __aenter__(self) -> Picker:
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = external_processor_pb2_grpc.ExternalProcessorStub(self.channel)
        return self

    async def __aexit__(self, *_) -> None:
        if self.channel is not None:
            await self.channel.close()
        await self.server.stop(None)

    async def exchange(
        self, messages: list[pb.ProcessingRequest], timeout: float = 10.0
    ) -> list[pb.ProcessingResponse]:
        """Send ``messages``, half-close, and read every answer until the stream ends."""
        assert self.stub is not None
        call = self.stub.Process(iter(messages))
        return await asyncio.wait_for(_read_all(call), timeout)

    def hold(self, messages: list[pb.ProcessingRequest]) -> grpc.aio.StreamStreamCall:
        """A stream that sends ``messages`` and stays open (the client never half-closes)."""
        assert self.stub is not None

        async def send() -> AsyncIterator[pb.ProcessingRequest]:
            for message in messages:
                yield message
            await asyncio.Event().wait()

        return self.stub.Process(send())


async def _read_all(call) -> list[pb.ProcessingResponse]:
    return [answer async for answer in call]


async def read_until_closed(call) -> list[pb.ProcessingResponse]:
    """Every answer until the EPP closes the stream. After its ImmediateResponse the EPP
    ends the call: a client still sending then may see INTERNAL from grpc-core, which is
    its view of that close, not a failure of the service."""
    answers: list[pb.ProcessingResponse] = []
    try:
        async for answer in call:
            answers.append(answer)
    except grpc.aio.AioRpcError:
        if not answers or answers[-1].WhichOneof("response") != "immediate_response":
            raise
    return answers


async def settled(predicate, timeout: float = 5.0) -> bool:
    """Wait on the loop until ``predicate()`` holds (server-side ends are asynchronous)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def routed_to(answer) -> bytes | None:
    """The endpoint a header or body answer names, None if it names none."""
    which = answer.WhichOneof("response")
    if which not in ("request_headers", "request_body"):
        return None
    for option in getattr(answer, which).response.header_mutation.set_headers:
        if option.header.key == DESTINATION:
            return option.header.raw_value
    return None

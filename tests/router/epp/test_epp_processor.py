"""The EPP's gRPC service on its own (a real grpc.aio server and client on 127.0.0.1, the
router core in front of sim workers): the message sequences Envoy sends, and garbage it
never should, which gets an answer and never a crash or a booking left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from google.protobuf import struct_pb2

from router.config import load_settings
from router.epp.endpoints import Endpoints
from router.epp.processor import DESTINATION, LB_NAMESPACE
from router.epp.service import ExternalProcessor
from router.service.app import create_app
from traces.live.fleet import Service, sim_workers


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Service]]:
    with sim_workers(2, ["--time-scale", "50", "--log-level", "warning"]) as started:
        yield started


def headers(method: str, path: str, end: bool = False, **extra: str) -> pb.ProcessingRequest:
    values = [base_pb2.HeaderValue(key=":method", raw_value=method.encode()),
              base_pb2.HeaderValue(key=":path", raw_value=path.encode())]  # fmt: skip
    values += [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in extra.items()]
    http = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)
    return pb.ProcessingRequest(request_headers=http)


def body(data: bytes, end: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end))


async def exchange(app, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    """One ext_proc stream through a real gRPC server: every answer."""
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        ExternalProcessor(app.core, "x-session-id", Endpoints(5.0)), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
            call = stub.Process(iter(messages))
            return [answer async for answer in call]
    finally:
        await server.stop(None)


@pytest.fixture
async def app(workers):
    router = create_app(load_settings(workers=[w.url for w in workers], log_level="warning"))
    await router.startup()
    for _ in range(200):  # until each worker's /v1/models is read (else any worker may serve)
        if all(w.models for w in router.pool.workers):
            break
        await asyncio.sleep(0.02)
    yield router
    await router.shutdown()


def booked(app) -> int:
    return sum(w.state.num_requests for w in app.pool.workers)


async def test_a_buffered_body_gets_the_endpoint_header_and_metadata(app) -> None:
    prompt = b'{"model": "sim-model", "prompt": "hello there"}'
    answers = await exchange(app, [headers("POST", "/v1/completions"), body(prompt)])
    assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body"]
    common = answers[1].request_body.response
    (option,) = common.header_mutation.set_headers
    chosen = option.header.raw_value.decode()
    assert option.header.key == DESTINATION
    assert chosen in {w.url.removeprefix("http://") for w in app.pool.workers}
    listed = answers[1].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION]
    endpoints = listed.string_value.split(",")
    assert endpoints[0] == chosen and len(endpoints) == 2  # the pick, then a fallback
    assert booked(app) == 0  # the stream ended: released (no response came back here)


@pytest.mark.parametrize(
    "messages, status",
    [
        ([headers("POST", "/v1/completions"), body(b"{nope")], 400),
        ([headers("POST", "/v1/completions"), body(b'{"prompt": 5}')], 400),
        ([headers("POST", "/v1/chat/completions"),
          body(b'{"model": "x", "messages": [{"role": "user", "content": "a"}]}')], 404),
        ([headers("GET", "/v1/elsewhere", end=True)], 404),
        ([headers("GET", "/v1/responses/resp_nobody", end=True)], 404),
    ],
)  # fmt: skip
async def test_bad_requests_get_serves_errors(app, messages, status) -> None:
    answers = await exchange(app, messages)
    immediate = answers[-1].immediate_response
    assert immediate.status.code == status
    assert b'"error"' in immediate.body
    assert booked(app) == 0


async def test_garbage_sequences_never_crash_or_leak(app) -> None:
    sequences = [
        [body(b"early body, no headers")],
        [pb.ProcessingRequest(response_headers=pb.HttpHeaders())],
        [pb.ProcessingRequest(response_body=pb.HttpBody(body=b"\xff" * 100, end_of_stream=True))],
        [pb.ProcessingRequest()],
        [headers("POST", "/v1/completions"), body(b"", end=False)],  # gone before its end
        [headers("POST", "/v1/completions"),
         body(b'{"model": "sim-model", "prompt": "x"}'),
         pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
             headers=[base_pb2.HeaderValue(key=":status", raw_value=b"banana")])))],
    ]  # fmt: skip
    for messages in sequences:
        await exchange(app, messages)  # an answer or an error status, never a hang
        assert booked(app) == 0
    # and it still routes
    answers = await exchange(
        app, [headers("POST", "/v1/completions"), body(b'{"model": "sim-model", "prompt": "y"}')]
    )
    assert answers[-1].request_body.response.header_mutation.set_headers


async def test_an_empty_subset_is_a_503(app) -> None:
    message = headers("POST", "/v1/completions")
    hint = struct_pb2.Struct()
    hint.update({"x-gateway-destination-endpoint-subset": []})
    message.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    answers = await exchange(app, [message, body(b'{"model": "sim-model", "prompt": "z"}')])
    assert answers[-1].immediate_response.status.code == 503

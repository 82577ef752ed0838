"""The least an ext_proc server in grpcio can cost: a picker that does no work.

    python bench/epp/ext_proc_floor.py --port P --endpoint 127.0.0.1:8001 [--server aio|sync]

It answers Envoy's request headers with CONTINUE and the request body with the header
``x-gateway-destination-endpoint: ENDPOINT`` (and route-cache clearing), as the endpoint
picker does in its leanest processing mode (request headers and a BUFFERED body only), but
parses nothing, picks nothing and books nothing. ``bench/epp/epp_bench.py``'s ``envoy+floor-aio``
and ``envoy+floor-sync`` setups put it behind the same Envoy as the EPP: what they reach is
the ceiling of any Python endpoint picker on grpcio, its asyncio server (the EPP's) and its
thread-pool server. Plaintext; the process is stopped by its starter.
"""

from __future__ import annotations

import argparse
from concurrent import futures

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc


def answers(endpoint: str) -> tuple[pb.ProcessingResponse, pb.ProcessingResponse]:
    """The two fixed answers: to the request headers, and to the request body."""
    headers = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(
            key="x-gateway-destination-endpoint", raw_value=endpoint.encode()
        )
    )
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[header]), clear_route_cache=True
    )
    body = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    return headers, body


def answer(message: pb.ProcessingRequest, fixed: tuple) -> pb.ProcessingResponse | None:
    kind = message.WhichOneof("request")
    if kind == "request_headers":
        return fixed[0]
    if kind == "request_body":
        return fixed[1]
    return None  # other phases are not sent in this mode


class AsyncFloor(external_processor_pb2_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str) -> None:
        self.fixed = answers(endpoint)

    async def Process(self, request_iterator, context):
        async for message in request_iterator:
            reply = answer(message, self.fixed)
            if reply is not None:
                yield reply


class SyncFloor(external_processor_pb2_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str) -> None:
        self.fixed = answers(endpoint)

    def Process(self, request_iterator, context):
        for message in request_iterator:
            reply = answer(message, self.fixed)
            if reply is not None:
                yield reply


async def serve_aio(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        AsyncFloor(endpoint), server
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_sync(port: int, endpoint: str, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(SyncFloor(endpoint), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--endpoint", required=True, help="ip:port every request is sent to")
    ap.add_argument("--server", choices=("aio", "sync"), default="aio")
    ap.add_argument("--threads", type=int, default=64, help="sync: handler threads (streams)")
    args = ap.parse_args()
    if args.server == "aio":
        import uvloop

        uvloop.run(serve_aio(args.port, args.endpoint))
    else:
        serve_sync(args.port, args.endpoint, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

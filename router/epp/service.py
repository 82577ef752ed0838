"""The gRPC servicer: one :class:`~router.epp.processor.RequestStream` per ext_proc stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from router.epp.endpoints import Endpoints
from router.epp.processor import RequestStream
from router.proxy.routing import RouterCore

log = logging.getLogger("cache_router.epp")


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    """Envoy's external processing service, answered by the router core."""

    def __init__(self, core: RouterCore, session_header: str, endpoints: Endpoints) -> None:
        self.core = core
        self.session_header = session_header
        self.endpoints = endpoints
        self.streams = 0  # open streams (requests in the gateway)

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = RequestStream(self.core, self.session_header, self.endpoints)
        self.streams += 1
        try:
            async for answer in stream.run(request_iterator):
                yield answer
        finally:
            self.streams -= 1

"""The gRPC servicer: one :class:`~router.epp.processor.RequestStream` per ext_proc stream.

Each stream is one request in the gateway, so ``max_connections`` (``serve``'s bound on its
clients' connections) bounds the streams open here: one more is answered ``serve``'s 503
``connections`` (Retry-After) at its first message, and closed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from router.core.errors import ServiceUnavailable
from router.core.routing import RouterCore
from router.epp.endpoints import Endpoints
from router.epp.processor import RequestStream, immediate

log = logging.getLogger("cache_router.epp")


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    """Envoy's external processing service, answered by the router core."""

    def __init__(self, core: RouterCore, session_header: str, endpoints: Endpoints) -> None:
        self.core = core
        self.session_header = session_header
        self.endpoints = endpoints
        self.max_streams = core.settings.max_connections
        self.streams = 0  # open streams (requests in the gateway)

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context
    ) -> AsyncIterator[pb.ProcessingResponse]:
        if self.max_streams and self.streams >= self.max_streams:
            async for answer in self.refuse(request_iterator):
                yield answer
            return
        stream = RequestStream(self.core, self.session_header, self.endpoints)
        self.streams += 1
        try:
            async for answer in stream.run(request_iterator):
                yield answer
        finally:
            self.streams -= 1

    async def refuse(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest]
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Over the stream limit: ``serve``'s 503 for a connection over its limit, answered
        to the first message (an ImmediateResponse ends the stream)."""
        async for _ in request_iterator:
            self.core.pool.stats.count_rejected("connections")
            message = f"the endpoint picker has {self.streams} requests open"
            yield immediate(ServiceUnavailable(message, code="connections"))
            return

"""One request through the endpoint picker: Envoy's ext_proc stream for it, message by message.

Gateway API Inference Extension's Endpoint Picker Protocol over Envoy's external processing
service: the gateway streams each HTTP request's headers and body here, and this answers
with the endpoint to send it to; Envoy moves the bytes. The decisions are the router core's
(:class:`~router.proxy.routing.RouterCore`, the same object ``serve`` forwards with), so
reading, picking, booking, learning and releasing are ``serve``'s own:

- request headers: the path, method, session header, content type; a request without a
  body (a call on a stored response) is routed at once;
- request body (``BUFFERED``: one message; ``FULL_DUPLEX_STREAMED``: pieces, gathered to
  the end, then sent back unchanged): parsed, picked (within the gateway's subset hint,
  ``envoy.lb.subset_hint``), booked; the answer sets ``x-gateway-destination-endpoint:
  ip:port`` and the dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint`` (the
  pick, then fallbacks for the gateway's retries). Bad bodies, unknown models, no healthy
  worker, an empty or all-ineligible subset: an ImmediateResponse with ``serve``'s status
  and OpenAI-style JSON error;
- response headers: the worker's status (a 5xx counts against it, as in ``serve``);
- response body (``STREAMED`` or ``FULL_DUPLEX_STREAMED``; ``NONE`` sends none): the first
  piece ends the prefill, the cached tokens it reports are scored and fed back, a stored
  response's id is learned;
- the end of the stream, however it comes (the response done, Envoy closing it early, the
  client gone): the booking is released, exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from router.cache.worker_state import Booking
from router.epp.endpoints import Endpoints
from router.fleet.pool import Worker
from router.proxy.errors import (
    RETRY_AFTER,
    RETRY_STATUSES,
    BadRequest,
    NotFound,
    RouterError,
    ServiceUnavailable,
)
from router.proxy.parse import GENERATION_PATHS, OTHER_PATHS, RESPONSE_CALL, response_call_id
from router.proxy.routing import Routed, RouterCore
from router.proxy.usage import UsageReader

log = logging.getLogger("cache_router.epp")

DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
WORKER_HEADER = "x-cache-router-worker"
FALLBACKS = 2  # endpoints after the pick, for the gateway's retries
_BodyMode = processing_mode_pb2.ProcessingMode.BodySendMode
FULL_DUPLEX = _BodyMode.Value("FULL_DUPLEX_STREAMED")
_CONTINUE = pb.CommonResponse()


def routed_kind(method: str, path: str) -> str | None:
    """The core's endpoint for ``method path``; None for a path the router does not route."""
    if method == "POST":
        kind = GENERATION_PATHS.get(path) or OTHER_PATHS.get(path)
        if kind is not None:
            return kind
    return RESPONSE_CALL if response_call_id(method, path) is not None else None


class RequestStream:
    """The state of one ext_proc stream: one HTTP request and its response."""

    def __init__(self, core: RouterCore, session_header: str, endpoints: Endpoints) -> None:
        self.core = core
        self.session_header = session_header
        self.endpoints = endpoints
        self.worker_header = core.settings.worker_header
        self.kind: str | None = None
        self.method = "GET"
        self.path = "/"
        self.session: str | None = None
        self.content_type: bytes | None = None
        self.subset: list[str] | None = None
        self.duplex_request = False
        self.duplex_response = False
        self.body: list[bytes] = []
        self.routed: Routed | None = None
        self.worker: Worker | None = None
        self.booking: Booking | None = None
        self.status = 0
        self.status_label = "cancelled"  # what the end of the stream counts, unless answered
        self.first = True
        self.reader: UsageReader | None = None
        self.learn = False

    # ---- the stream --------------------------------------------------------------------

    async def run(self, messages: AsyncIterator[pb.ProcessingRequest]) -> AsyncIterator:
        """Answer each message; release whatever is held when the stream ends."""
        try:
            async for message in messages:
                for answer in await self.on_message(message):
                    yield answer
        finally:
            self.end()

    async def on_message(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        which = message.WhichOneof("request")
        try:
            if which == "request_headers":
                return await self.on_request_headers(message)
            if which == "request_body":
                return await self.on_request_body(message.request_body)
            if which == "response_headers":
                return self.on_response_headers(message.response_headers)
            if which == "response_body":
                return self.on_response_body(message.response_body)
            if which == "request_trailers":
                return [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
            if which == "response_trailers":
                return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        except RouterError as error:
            if self.routed is None:
                self.core.unrouted(self.kind or "other", str(error.status))
            return [immediate(error)]
        except Exception:  # a bug, or a message no gateway sends: answer, never crash
            log.exception("unexpected error on an ext_proc %s message", which)
            return [immediate(RouterError("internal error in the endpoint picker"))]
        return []

    async def on_request_headers(self, message: pb.ProcessingRequest) -> list:
        config = message.protocol_config
        self.duplex_request = config.request_body_mode == FULL_DUPLEX
        self.duplex_response = config.response_body_mode == FULL_DUPLEX
        self.subset = subset_hint(message)
        headers = message.request_headers
        for header in headers.headers.headers:
            key = header.key
            value = header.raw_value or header.value.encode()
            if key == ":path":
                self.path = value.decode("latin-1").split("?", 1)[0]
            elif key == ":method":
                self.method = value.decode("latin-1")
            elif key == self.session_header:
                self.session = value.decode("latin-1")
            elif key == "content-type":
                self.content_type = value
        self.kind = routed_kind(self.method, self.path)
        if self.kind is None:
            raise NotFound(f"no route for {self.method} {self.path}")
        if headers.end_of_stream:  # no body: route now
            return [await self.route(b"", "request_headers")]
        if self.duplex_request:
            return []  # the header answer waits for the body (it carries the pick)
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=_CONTINUE))]

    async def on_request_body(self, body: pb.HttpBody) -> list:
        self.body.append(body.body)
        if not body.end_of_stream:
            return []
        raw = b"".join(self.body)
        self.body = []
        if not self.duplex_request:
            return [await self.route(raw, "request_body")]
        # full duplex: the pick in the header answer, then the body sent back as it came
        answer = await self.route(raw, "request_headers")
        if answer.WhichOneof("response") == "immediate_response":
            return [answer]
        streamed = pb.StreamedBodyResponse(body=raw, end_of_stream=True)
        mutation = pb.BodyMutation(streamed_response=streamed)
        body_answer = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
        return [answer, pb.ProcessingResponse(request_body=body_answer)]

    def on_response_headers(self, headers: pb.HttpHeaders) -> list:
        for header in headers.headers.headers:
            if header.key == ":status":
                self.status = int(header.raw_value or header.value or 0)
                break
        routed, worker = self.routed, self.worker
        if routed is not None and worker is not None and self.status:
            self.core.answered(routed, worker, self.status)
            self.status_label = str(self.status)
            self.learn = routed.learn_owner and self.status == 200
            if headers.end_of_stream:
                self.finish_response()
        common = _CONTINUE
        if worker is not None and self.worker_header:  # as serve says where it went
            header = base_pb2.HeaderValue(key=WORKER_HEADER, raw_value=worker.url.encode())
            mutation = pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(header=header)])
            common = pb.CommonResponse(header_mutation=mutation)
        return [pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))]

    def on_response_body(self, body: pb.HttpBody) -> list:
        data = body.body
        booking, routed, worker = self.booking, self.routed, self.worker
        if booking is not None and routed is not None and worker is not None:
            if self.first:
                self.first = False
                booking.first_token()
                ok = 0 < self.status < 300
                self.reader = UsageReader(ok and routed.request.stream, False, ok)
            if self.learn:
                self.learn = self.core.learn_owner(data, worker)
            if self.reader is not None:
                self.reader.feed(data, body.end_of_stream)  # read, not changed: passes as is
            if body.end_of_stream:
                self.finish_response()
        if self.duplex_response:
            streamed = pb.StreamedBodyResponse(body=data, end_of_stream=body.end_of_stream)
            mutation = pb.BodyMutation(streamed_response=streamed)
            answer = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
        else:
            answer = pb.BodyResponse(response=_CONTINUE)
        return [pb.ProcessingResponse(response_body=answer)]

    # ---- routing -----------------------------------------------------------------------

    async def route(self, raw: bytes, phase: str) -> pb.ProcessingResponse:
        """Parse, pick and book; the answer for ``phase`` that names the endpoint."""
        core = self.core
        if self.kind is None:  # no gateway sends this; answer it all the same
            raise BadRequest("a request body came before its headers", code="invalid_stream")
        self.routed = routed = await core.understand(
            self.kind, raw, self.session, self.method, self.path, self.content_type
        )
        exclude = None
        of = self.endpoints.of
        if self.subset is not None:
            allowed = set(self.subset)
            exclude = [w for w in core.pool.workers if of(w) not in allowed]
            if len(exclude) == len(core.pool.workers):
                raise ServiceUnavailable(
                    "none of the gateway's subset of endpoints is in this picker's fleet",
                    code="no_endpoint_in_subset",
                )
        worker, pick = core.choose(routed, None, exclude)
        endpoint = of(worker)
        while endpoint is None:  # its host name not resolved yet (being resolved): another
            if routed.owner is not None:  # only the owner holds the stored response
                raise ServiceUnavailable(
                    f"worker {worker.url}: its host name has not resolved yet",
                    code="endpoint_unresolved",
                )
            exclude = [*(exclude or ()), worker]
            worker, pick = core.choose(routed, None, exclude)
            endpoint = of(worker)
        self.worker = worker
        self.booking = core.book(routed, worker, pick)
        endpoints = [endpoint, *self.fallbacks(routed, worker, exclude)]
        header = base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=DESTINATION, raw_value=endpoints[0].encode())
        )
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=[header]), clear_route_cache=True
        )
        metadata = struct_pb2.Struct()
        metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION] = ",".join(endpoints)
        if phase == "request_headers":
            return pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
            )
        return pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
        )

    def fallbacks(self, routed: Routed, chosen: Worker, exclude: list | None) -> list[str]:
        """Other healthy workers that serve the model, least loaded first."""
        if routed.owner is not None:
            return []  # only the owner holds the stored response
        views = self.core.pool.views_for(routed.features.model)
        others = [
            w
            for w, view in zip(self.core.pool.workers, views, strict=True)
            if w is not chosen and view.healthy and (not exclude or w not in exclude)
        ]
        others.sort(key=lambda w: w.state.num_requests)
        found = (self.endpoints.of(w) for w in others)
        return [e for e in found if e is not None][:FALLBACKS]

    # ---- the end -----------------------------------------------------------------------

    def finish_response(self) -> None:
        """The response is complete: its usage read and fed back, the booking released."""
        routed, worker, booking = self.routed, self.worker, self.booking
        if routed is None or worker is None or booking is None or booking.finished:
            return
        usage = self.reader.usage() if self.reader is not None else None
        if usage is not None:
            self.core.report(routed, worker, booking, usage)
        self.core.release(routed, worker, booking, self.status_label)
        self.core.settle(routed)

    def end(self) -> None:
        """The stream ended: release what the response did not (Envoy closed it early, the
        client left, or the response body was not sent here)."""
        routed, worker, booking = self.routed, self.worker, self.booking
        if routed is None or worker is None or booking is None:
            return
        if not booking.finished:
            if not self.status:
                self.status_label = "client_disconnect"
            self.core.release(routed, worker, booking, self.status_label)
        self.core.settle(routed)


def subset_hint(message: pb.ProcessingRequest) -> list[str] | None:
    """The gateway's subset of endpoints, if its filter metadata carries one."""
    namespaces = message.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    value = namespaces[SUBSET_NAMESPACE].fields.get(SUBSET_KEY)
    if value is None:
        return []
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.string_value]
    if kind == "string_value":
        return [e.strip() for e in value.string_value.split(",") if e.strip()]
    return []


def immediate(error: RouterError) -> pb.ProcessingResponse:
    """The gateway answers the client itself: ``serve``'s status and JSON error."""
    headers = [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json")
        )
    ]
    if error.status in RETRY_STATUSES:
        name, value = RETRY_AFTER
        headers.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=name.decode(), raw_value=value)
            )
        )
    response = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=error.status),
        headers=pb.HeaderMutation(set_headers=headers),
        body=error.body(),
        details=error.code,
    )
    return pb.ProcessingResponse(immediate_response=response)

"""One request through the endpoint picker: Envoy's ext_proc stream for it, message by message.

Gateway API Inference Extension's Endpoint Picker Protocol over Envoy's external processing
service: the gateway streams each HTTP request's headers and body here, and this answers
with the endpoint to send it to; Envoy moves the bytes. The decisions are the router core's
(:class:`~router.core.routing.RouterCore`, the same object ``serve`` forwards with), so
reading, picking, booking, learning and releasing are ``serve``'s own:

- request headers: the path, method, session header, content type; a routed path is
  admitted as ``serve`` admits it (in flight from here to its end, 429 past
  ``max_inflight``); a request without a body (a call on a stored response) is routed at
  once; ``GET /v1/models`` is answered here with ``serve``'s merged list of the fleet;
- request body (``BUFFERED``: one message; ``FULL_DUPLEX_STREAMED``: pieces, gathered to
  the end, 413 and dropped past ``max_body_bytes``, then sent back unchanged): parsed,
  picked (within the gateway's subset hint, ``envoy.lb.subset_hint``), booked; the answer
  sets ``x-gateway-destination-endpoint: ip:port`` and the dynamic metadata ``envoy.lb`` /
  ``x-gateway-destination-endpoint`` (the pick, then fallbacks for the gateway's retries).
  With ``--flow-control`` the answer waits for the request's turn
  (:mod:`router.core.flow`; Envoy holds the request meanwhile), or is a 429 refusal.
  Bad bodies, unknown models, no healthy worker, an empty or all-ineligible subset: an
  ImmediateResponse with ``serve``'s status and OpenAI-style JSON error. A stream routes
  once: request headers or body after the body ended (no gateway sends them) are a 400
  ``invalid_stream``;
- an ImmediateResponse ends the stream (Envoy sends nothing more on it after one): what it
  held is released then, and the stream is closed;
- response headers: the worker's status (a 5xx counts against it, as in ``serve``; one
  that is not a status, as an unreadable answer: a 502);
- response body (``STREAMED`` or ``FULL_DUPLEX_STREAMED``; ``NONE`` sends none): the first
  piece ends the prefill, the cached tokens it reports are scored and fed back, a stored
  response's id is learned;
- the end of the stream, however it comes (the response done, Envoy closing it early, the
  client gone): the booking is released, exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from router.cache.worker_state import Booking
from router.core.errors import (
    RETRY_AFTER,
    RETRY_STATUSES,
    BadRequest,
    NotFound,
    PayloadTooLarge,
    RouterError,
    ServiceUnavailable,
    echo,
)
from router.core.flow import bearer_key
from router.core.parse import routed_kind
from router.core.routing import Routed, RouterCore
from router.core.usage import ResponseIdReader, UsageReader
from router.epp.endpoints import Endpoints
from router.fleet.pool import Worker
from router.service.admin import fleet_models

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
MODELS_PATH = "/v1/models"
UNREADABLE_STATUS = 502  # a response ``:status`` that is no HTTP status: an unreadable answer


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
        self.body_size = 0
        self.headers_seen = False
        self.body_ended = False  # the request is whole: nothing more may route it
        self.admitted = False  # counted in flight (core.admit), until left once
        self.over = False  # an ImmediateResponse went: the stream is closed
        self.ended = False
        self.routed: Routed | None = None
        self.worker: Worker | None = None
        self.booking: Booking | None = None
        self.status = 0
        self.status_label = "cancelled"  # what the end of the stream counts, unless answered
        self.first = True
        self.reader: UsageReader | None = None
        self.learn: ResponseIdReader | None = None  # reads the id of a stored response
        # the request's headers, kept for flow control's classification (when it is on)
        self.flow_headers: dict[str, str] | None = {} if core.flow is not None else None

    # ---- the stream --------------------------------------------------------------------

    async def run(self, messages: AsyncIterator[pb.ProcessingRequest]) -> AsyncIterator:
        """Answer each message; release whatever is held when the stream ends. After an
        ImmediateResponse the stream is over: closed, later messages never read."""
        try:
            async for message in messages:
                for answer in await self.on_message(message):
                    yield answer
                if self.over:
                    return
        finally:
            self.end()

    async def on_message(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """The answers to one message; an error is the gateway's ImmediateResponse, which
        ends the stream."""
        if self.over:
            return []
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
            return [self.refuse(error)]
        except Exception:  # a bug, or a message no gateway sends: answer, never crash
            log.exception("unexpected error on an ext_proc %s message", which)
            return [self.refuse(RouterError("internal error in the endpoint picker"))]
        return []

    def refuse(self, error: RouterError) -> pb.ProcessingResponse:
        """The gateway answers ``error`` itself and the stream is over: a request no worker
        was booked for counts as unrouted (once: nothing follows), a booking is released."""
        if self.booking is None:
            self.core.unrouted(self.kind or "other", str(error.status))
        self.over = True
        self.end("cancelled")
        return immediate(error)

    async def on_request_headers(self, message: pb.ProcessingRequest) -> list:
        if self.headers_seen:  # no gateway sends them twice: never a second route
            raise BadRequest("the request headers came twice", code="invalid_stream")
        self.headers_seen = True
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
            if self.flow_headers is not None:
                self.flow_headers.setdefault(key, value.decode("latin-1"))
        self.kind = routed_kind(self.method, self.path)
        if self.kind is None:
            if self.method == "GET" and self.path == MODELS_PATH:
                return [await self.models()]
            raise NotFound(f"no route for {echo(self.method)} {echo(self.path)}")
        self.core.admit()  # 429 past max_inflight, before the body is read
        self.admitted = True
        if headers.end_of_stream:  # no body: route now
            self.body_ended = True
            return [await self.route(b"", "request_headers")]
        if self.duplex_request:
            return []  # the header answer waits for the body (it carries the pick)
        return [pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=_CONTINUE))]

    async def models(self) -> pb.ProcessingResponse:
        """``serve``'s ``GET /v1/models``: the fleet's models, answered by the gateway."""
        listed = orjson.dumps(await fleet_models(self.core.pool))
        self.over = True
        return immediate_response(200, listed, "models")

    async def on_request_body(self, body: pb.HttpBody) -> list:
        if self.kind is None:  # no gateway sends this; answer it all the same
            raise BadRequest("a request body came before its headers", code="invalid_stream")
        if self.body_ended:  # routed already: a stream routes (and books) once
            raise BadRequest("a request body came after its end", code="invalid_stream")
        self.gather(body.body)
        if not body.end_of_stream:
            return []
        self.body_ended = True
        raw = b"".join(self.body)
        self.body = []
        if not self.duplex_request:
            return [await self.route(raw, "request_body")]
        # full duplex: the pick in the header answer, then the body sent back as it came
        answer = await self.route(raw, "request_headers")
        streamed = pb.StreamedBodyResponse(body=raw, end_of_stream=True)
        mutation = pb.BodyMutation(streamed_response=streamed)
        body_answer = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
        return [answer, pb.ProcessingResponse(request_body=body_answer)]

    def gather(self, piece: bytes) -> None:
        """Keep one piece of the request body; past ``max_body_bytes``, 413 and none kept
        (as ``serve``: a full-duplex body would otherwise grow without end)."""
        self.body_size += len(piece)
        limit = self.core.settings.max_body_bytes
        if self.body_size > limit:
            self.body = []
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        self.body.append(piece)

    def on_response_headers(self, headers: pb.HttpHeaders) -> list:
        if self.status:  # no gateway sends them twice: the worker's answer counts once
            return [self.response_headers_answer()]
        self.status = response_status(headers)
        routed, worker = self.routed, self.worker
        if routed is not None and worker is not None and self.status:
            self.core.answered(routed, worker, self.status)
            self.status_label = str(self.status)
            self.learn = self.core.owner_reader(routed, self.status)
            if headers.end_of_stream:
                self.finish_response()
        return [self.response_headers_answer()]

    def response_headers_answer(self) -> pb.ProcessingResponse:
        """Continue; the worker's URL in a header, as ``serve`` says where it went."""
        common = _CONTINUE
        worker = self.worker
        if worker is not None and self.worker_header:
            header = base_pb2.HeaderValue(key=WORKER_HEADER, raw_value=worker.url.encode())
            mutation = pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(header=header)])
            common = pb.CommonResponse(header_mutation=mutation)
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))

    def on_response_body(self, body: pb.HttpBody) -> list:
        data = body.body
        booking, routed, worker = self.booking, self.routed, self.worker
        if booking is not None and routed is not None and worker is not None:
            if self.first:
                self.first = False
                booking.first_token()
                ok = 0 < self.status < 300
                self.reader = UsageReader(ok and routed.request.stream, False, ok)
            if self.learn is not None:
                self.learn = self.core.learn_owner(self.learn, data, worker)
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
        assert self.kind is not None  # on_request_headers set it, or answered
        self.routed = routed = await core.understand(
            self.kind, raw, self.session, self.method, self.path, self.content_type
        )
        headers = self.flow_headers
        if headers is not None:  # flow control: the stream is held until the request's turn
            key = bearer_key(headers.get("authorization"))
            await core.flow_wait(routed, headers.get, len(raw), key)
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
        """The response is complete: its usage read and fed back, the booking released,
        the request no longer in flight."""
        routed, worker, booking = self.routed, self.worker, self.booking
        if routed is None or worker is None or booking is None or booking.finished:
            return
        usage = self.reader.usage() if self.reader is not None else None
        if usage is not None:
            self.core.report(routed, worker, booking, usage)
        self.core.release(routed, worker, booking, self.status_label)
        self.core.settle(routed)
        self.leave()

    def leave(self) -> None:
        """No longer in flight: once, however the request ends."""
        if self.admitted:
            self.admitted = False
            self.core.leave()

    def end(self, unanswered: str = "client_disconnect") -> None:
        """The stream ended (or an ImmediateResponse ended it): release what the response
        did not (Envoy closed it early, the client left, the response body was not sent
        here); ``unanswered``: the outcome counted when no worker status came. Once."""
        if self.ended:
            return
        self.ended = True
        self.body = []
        self.leave()
        routed, worker, booking = self.routed, self.worker, self.booking
        if routed is None or worker is None or booking is None:
            return
        if not booking.finished:
            if not self.status:
                self.status_label = unanswered
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


def response_status(headers: pb.HttpHeaders) -> int:
    """The response's ``:status``; 0 when absent; one that is not three digits (no gateway
    sends it) as an unreadable answer, a 502."""
    for header in headers.headers.headers:
        if header.key == ":status":
            raw = header.raw_value or header.value.encode()
            if len(raw) == 3 and raw.isdigit() and raw[:1] in b"12345":
                return int(raw)
            log.debug("response :status %r is no HTTP status: counted as a 502", raw[:16])
            return UNREADABLE_STATUS
    return 0


def immediate(error: RouterError) -> pb.ProcessingResponse:
    """The gateway answers the client itself: ``serve``'s status and JSON error."""
    retry = error.status in RETRY_STATUSES
    return immediate_response(error.status, error.body(), error.code, retry)


def immediate_response(
    status: int, body: bytes, details: str, retry: bool = False
) -> pb.ProcessingResponse:
    """An ImmediateResponse: ``status`` and a JSON ``body`` (``retry``: Retry-After)."""
    pairs = [("content-type", b"application/json")]
    if retry:
        name, value = RETRY_AFTER
        pairs.append((name.decode(), value))
    headers = [
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value))
        for key, value in pairs
    ]
    response = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=pb.HeaderMutation(set_headers=headers),
        body=body,
        details=details,
    )
    return pb.ProcessingResponse(immediate_response=response)

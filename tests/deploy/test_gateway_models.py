"""deploy/k8s/gateway (the EPP behind a GIE gateway) and the models that validate its CRD kinds.

The overlay passes deploy/validate_k8s.py and its parts point at each other (the pool at the
vLLM pods and the picker's Service, the route at the pool and the Gateway, the picker at the
same pods); deploy/gateway_models.py refuses what the InferencePool, Gateway and
HTTPRoute CRDs refuse, each case from a copy of the overlay's own valid resource.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError

from router.config import load_settings
from router.fleet.discovery_k8s import K8sDiscovery, api_configuration

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
_spec = importlib.util.spec_from_file_location("validate_k8s", DEPLOY / "validate_k8s.py")
validate_k8s = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate_k8s)
models = validate_k8s.gateway_models()

Resource = dict[str, Any]
POOL = ("InferencePool", "cache-router")
GATEWAY = ("Gateway", "inference-gateway")
ROUTE = ("HTTPRoute", "cache-router")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def overlay() -> dict[tuple[str, str], Resource]:
    out = run(BIN / "kubectl", "kustomize", DEPLOY / "k8s" / "gateway")
    assert out.returncode == 0, out.stderr
    resources = [r for r in yaml.safe_load_all(out.stdout) if r]
    by_key = {(r["kind"], r["metadata"]["name"]): r for r in resources}
    assert len(by_key) == len(resources)
    return by_key


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def pod_labels(workload: Resource) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


# ---- the overlay -------------------------------------------------------------------------------


def test_the_gateway_overlay_validates() -> None:
    out = run(
        sys.executable, DEPLOY / "validate_k8s.py", "--kubectl", BIN / "kubectl",
        DEPLOY / "k8s" / "gateway",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "in 1 kustomizations" in out.stdout and "0 problem(s)" in out.stdout


def test_the_crd_kinds_go_to_the_gateway_models(overlay: dict[tuple[str, str], Resource]) -> None:
    for kind, name in (POOL, GATEWAY, ROUTE):
        resource = overlay[(kind, name)]
        model = validate_k8s._crd_models()[(resource["apiVersion"], kind)]
        assert model.__module__ == "gateway_models" and model.__name__ == kind
        assert validate_k8s.check_resource(resource, "overlay") == []


def test_the_serve_router_is_replaced_by_the_picker(
    overlay: dict[tuple[str, str], Resource],
) -> None:
    for kind in ("Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"):
        assert (kind, "cache-router") not in overlay, kind
    assert ("ConfigMap", "cache-router-config") not in overlay
    kept = [
        ("Deployment", "cache-router-redis"), ("StatefulSet", "vllm"), ("Service", "vllm"),
        ("ServiceMonitor", "vllm"), ("ServiceAccount", "cache-router"),
        ("Role", "cache-router-discovery"), ("RoleBinding", "cache-router-discovery"),
    ]  # fmt: skip
    for key in kept:
        assert key in overlay, key
    for resource in overlay.values():
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cache-router"


def test_the_pool_holds_the_vllm_pods_and_names_the_picker(
    overlay: dict[tuple[str, str], Resource],
) -> None:
    pool = overlay[("InferencePool", "cache-router")]["spec"]
    vllm = overlay[("StatefulSet", "vllm")]
    assert selects(pool["selector"]["matchLabels"], pod_labels(vllm))
    epp = overlay[("Deployment", "cache-router-epp")]
    assert not selects(pool["selector"]["matchLabels"], pod_labels(epp))
    worker = vllm["spec"]["template"]["spec"]["containers"][0]
    worker_ports = {p["containerPort"] for p in worker["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == [8000] and 8000 in worker_ports

    ref = pool["endpointPickerRef"]
    assert (ref["kind"], ref["failureMode"]) == ("Service", "FailClose")
    service = overlay[("Service", ref["name"])]
    (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc["appProtocol"] == "http2" and grpc["port"] == 9002
    assert selects(service["spec"]["selector"], pod_labels(epp))
    container = epp["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[grpc["targetPort"]] == 9002  # the EPP's --port default
    http = next(p for p in service["spec"]["ports"] if p["name"] == "http")
    assert named[http["targetPort"]] == 9090  # its --http-port default
    monitor = overlay[("ServiceMonitor", "cache-router-epp")]["spec"]
    assert selects(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["endpoints"][0]["port"] == "http"


def test_the_route_sends_the_gateway_to_the_pool(overlay: dict[tuple[str, str], Resource]) -> None:
    route = overlay[("HTTPRoute", "cache-router")]["spec"]
    gateway = overlay[("Gateway", "inference-gateway")]["spec"]
    assert [(p["kind"], p["name"]) for p in route["parentRefs"]] == [
        ("Gateway", "inference-gateway")
    ]
    assert [(lst["protocol"], lst["port"]) for lst in gateway["listeners"]] == [("HTTP", 80)]
    (rule,) = route["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "cache-router"}
    ]
    assert rule["timeouts"] == {"request": "300s"}
    assert ("InferencePool", rule["backendRefs"][0]["name"]) in overlay


def test_the_picker_runs_epp_on_the_pools_pods(
    overlay: dict[tuple[str, str], Resource], tmp_path: Path
) -> None:
    epp = overlay[("Deployment", "cache-router-epp")]
    pod = epp["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert epp["spec"]["replicas"] >= 2
    assert pod["serviceAccountName"] == "cache-router" and pod["automountServiceAccountToken"]
    assert container["command"] == ["cache-router", "epp"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"]

    # the config file: the mounted ConfigMap, accepted by the router's settings
    args = container["args"]
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = overlay[("ConfigMap", volume["configMap"]["name"])]
    config_file = tmp_path / config_path.name
    config_file.write_text(config_map["data"][config_path.name])
    env = {e["name"]: e["value"] for e in container["env"]}
    settings = load_settings(config_file, state_url=env["CACHE_ROUTER_STATE_URL"])
    assert settings.policy == "ttft"
    assert settings.shutdown_timeout_s < pod["terminationGracePeriodSeconds"]

    # its workers: one URL per pod of the pool, <pod>.<headless service>:<the pool's port>
    pool = overlay[("InferencePool", "cache-router")]["spec"]
    sts = overlay[("StatefulSet", "vllm")]
    headless = overlay[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == pool["selector"]["matchLabels"]
    port = pool["targetPorts"][0]["number"]
    name, svc = sts["metadata"]["name"], headless["metadata"]["name"]
    expected = [f"http://{name}-{i}.{svc}:{port}" for i in range(sts["spec"]["replicas"])]
    assert settings.workers == expected

    # the replicas share the Redis Service's state
    host = urlsplit(settings.state_url).hostname
    redis = overlay[("Service", host)]
    assert settings.state_url == f"redis://{host}:{redis['spec']['ports'][0]['port']}/0"

    # the command line itself parses (--print-envoy-config: parse, print, exit)
    local_args = [a.replace(str(config_path), str(config_file)) for a in args]
    out = run(BIN / "cache-router", "epp", *local_args, "--print-envoy-config", "8081")
    assert out.returncode == 0, out.stderr


def test_the_discovery_alternative_follows_the_pools_pods(
    overlay: dict[tuple[str, str], Resource],
) -> None:
    """The k8s:// URI epp-configmap.yaml offers instead of the list: the EndpointSlices of the
    Service over the pool's pods, read as pod IPs on the pool's port."""
    comment = overlay[("ConfigMap", "cache-router-epp-config")]["data"]["config.yaml"]
    (uri,) = re.findall(r'"(k8s://[^"]+)"', comment)
    uri = uri.replace("$(POD_NAMESPACE)", "inference")
    discovery = K8sDiscovery.from_uri(uri, configuration=api_configuration("https://127.0.0.1:1"))
    service_name = discovery.label_selector.removeprefix("kubernetes.io/service-name=")
    service = overlay[("Service", service_name)]
    pool = overlay[("InferencePool", "cache-router")]["spec"]
    assert service["spec"]["selector"] == pool["selector"]["matchLabels"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == discovery.port_name]
    assert port["port"] == pool["targetPorts"][0]["number"]
    endpoint_slice = {
        "metadata": {"name": "vllm-abcde", "namespace": "inference"},
        "ports": [{"name": port["name"], "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.1.2.3"], "conditions": {"ready": True}}],
    }
    assert discovery.slice_urls(endpoint_slice) == {"http://10.1.2.3:8000"}


# ---- the models refuse what the CRDs refuse ------------------------------------------------


def _pool_without_picker(r: Resource) -> None:
    del r["spec"]["endpointPickerRef"]


def _two_target_ports(r: Resource) -> None:
    r["spec"]["targetPorts"].append({"number": 8001})


def _port_zero(r: Resource) -> None:
    r["spec"]["targetPorts"][0]["number"] = 0


def _picker_port_zero(r: Resource) -> None:
    r["spec"]["endpointPickerRef"]["port"]["number"] = 0


def _unknown_pool_field(r: Resource) -> None:
    r["spec"]["endpointPickerRef"]["failMode"] = "FailOpen"


def _picker_service_without_port(r: Resource) -> None:
    del r["spec"]["endpointPickerRef"]["port"]


def _bad_failure_mode(r: Resource) -> None:
    r["spec"]["endpointPickerRef"]["failureMode"] = "FailSafe"


def _port_as_string(r: Resource) -> None:
    r["spec"]["targetPorts"][0]["number"] = "8000"


def _no_labels(r: Resource) -> None:
    r["spec"]["selector"]["matchLabels"] = {}


def _unknown_route_field(r: Resource) -> None:
    r["spec"]["rules"][0]["backendRefs"][0]["weigth"] = 1


def _bad_timeout(r: Resource) -> None:
    r["spec"]["rules"][0]["timeouts"]["request"] = "5min"


def _backend_timeout_over_request(r: Resource) -> None:
    r["spec"]["rules"][0]["timeouts"]["backendRequest"] = "6m"


def _relative_path(r: Resource) -> None:
    r["spec"]["rules"][0]["matches"][0]["path"]["value"] = "v1/chat"


def _bad_path_type(r: Resource) -> None:
    r["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Prefix"


def _bad_method(r: Resource) -> None:
    r["spec"]["rules"][0]["matches"][0]["method"] = "FETCH"


def _weight_too_big(r: Resource) -> None:
    r["spec"]["rules"][0]["backendRefs"][0]["weight"] = 1_000_001


def _filter_without_its_body(r: Resource) -> None:
    r["spec"]["rules"][0]["filters"] = [{"type": "RequestHeaderModifier"}]


def _same_parent_twice(r: Resource) -> None:
    r["spec"]["parentRefs"].append(dict(r["spec"]["parentRefs"][0]))


def _no_rules(r: Resource) -> None:
    r["spec"]["rules"] = []


def _bad_protocol(r: Resource) -> None:
    r["spec"]["listeners"][0]["protocol"] = "HTTP/1.1"


def _no_listeners(r: Resource) -> None:
    r["spec"]["listeners"] = []


def _listener_port_out_of_range(r: Resource) -> None:
    r["spec"]["listeners"][0]["port"] = 65536


def _tls_on_http(r: Resource) -> None:
    r["spec"]["listeners"][0]["tls"] = {"certificateRefs": [{"name": "cert"}]}


def _same_listener_name_twice(r: Resource) -> None:
    r["spec"]["listeners"].append({"name": "http", "port": 8080, "protocol": "HTTP"})


def _no_class(r: Resource) -> None:
    del r["spec"]["gatewayClassName"]


def _bad_name(r: Resource) -> None:
    r["metadata"]["name"] = "Inference_Gateway"


BROKEN: list[tuple[tuple[str, str], Callable[[Resource], None], str]] = [
    (POOL, _pool_without_picker, "spec.endpointPickerRef\n  Field required"),
    (POOL, _two_target_ports, "spec.targetPorts\n  List should have at most 1 item"),
    (POOL, _port_zero, "spec.targetPorts.0.number\n  Input should be greater than or equal to 1"),
    (POOL, _picker_port_zero, "spec.endpointPickerRef.port.number\n  Input should be greater"),
    (
        POOL,
        _unknown_pool_field,
        "spec.endpointPickerRef.failMode\n  Extra inputs are not permitted",
    ),
    (POOL, _picker_service_without_port, "port is required when kind is 'Service'"),
    (POOL, _bad_failure_mode, "spec.endpointPickerRef.failureMode\n  Input should be 'FailOpen'"),
    (POOL, _port_as_string, "spec.targetPorts.0.number\n  Input should be a valid integer"),
    (POOL, _no_labels, "spec.selector.matchLabels\n  Dictionary should have at least 1 item"),
    (ROUTE, _unknown_route_field, "spec.rules.0.backendRefs.0.weigth\n  Extra inputs"),
    (ROUTE, _bad_timeout, "spec.rules.0.timeouts.request\n  String should match pattern"),
    (ROUTE, _backend_timeout_over_request, "backendRequest timeout cannot be longer"),
    (ROUTE, _relative_path, "path 'v1/chat': must start with '/'"),
    (ROUTE, _bad_path_type, "spec.rules.0.matches.0.path.type\n  Input should be 'Exact'"),
    (ROUTE, _bad_method, "spec.rules.0.matches.0.method\n  Input should be 'GET'"),
    (ROUTE, _weight_too_big, "spec.rules.0.backendRefs.0.weight\n  Input should be less than"),
    (ROUTE, _filter_without_its_body, "filter.requestHeaderModifier must be specified"),
    (ROUTE, _same_parent_twice, "each reference needs a sectionName of its own"),
    (ROUTE, _no_rules, "spec.rules\n  List should have at least 1 item"),
    (GATEWAY, _bad_protocol, "spec.listeners.0.protocol\n  String should match pattern"),
    (GATEWAY, _no_listeners, "spec.listeners\n  List should have at least 1 item"),
    (GATEWAY, _listener_port_out_of_range, "spec.listeners.0.port\n  Input should be less than"),
    (GATEWAY, _tls_on_http, "tls must not be specified for protocol HTTP"),
    (GATEWAY, _same_listener_name_twice, "Listener name must be unique"),
    (GATEWAY, _no_class, "spec.gatewayClassName\n  Field required"),
    (GATEWAY, _bad_name, "metadata.name\n  String should match pattern"),
]


@pytest.mark.parametrize(("key", "breaks", "error"), BROKEN, ids=[b.__name__ for _, b, _ in BROKEN])
def test_a_broken_resource_is_refused(
    overlay: dict[tuple[str, str], Resource],
    key: tuple[str, str],
    breaks: Callable[[Resource], None],
    error: str,
) -> None:
    resource = copy.deepcopy(overlay[key])
    assert validate_k8s.check_resource(resource, "here") == []  # valid before
    breaks(resource)
    problems = validate_k8s.check_resource(resource, "here")
    assert len(problems) == 1 and problems[0].startswith(f"here: {key[0]}/"), problems
    assert error in problems[0], problems[0]
    model = models.MODELS[(resource["apiVersion"], resource["kind"])]
    with pytest.raises(ValidationError):
        model.model_validate(resource)


def test_a_later_release_may_relax_a_rule_but_the_models_keep_it() -> None:
    """A manifest that passes is one GIE v1.0.0 / Gateway API v1.3.0 accept too: fields added
    later (InferencePool appProtocol, HTTPRoute rules[].name) are unknown here."""
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }
    parsed = models.InferencePool.model_validate(pool)
    assert parsed.spec.endpoint_picker_ref.failure_mode == "FailClose"  # the CRD's default
    assert parsed.spec.endpoint_picker_ref.kind == "Service"
    with pytest.raises(ValidationError, match="appProtocol"):
        models.InferencePool.model_validate(
            {**pool, "spec": {**pool["spec"], "appProtocol": "http"}}
        )
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {"rules": [{"name": "all", "backendRefs": [{"name": "svc", "port": 80}]}]},
    }
    with pytest.raises(ValidationError, match=r"rules\.0\.name"):
        models.HTTPRoute.model_validate(route)
    del route["spec"]["rules"][0]["name"]
    assert models.HTTPRoute.model_validate(route).spec.rules[0].backend_refs[0].weight == 1


@pytest.mark.parametrize(
    ("text", "seconds"), [("300s", 300), ("1h", 3600), ("1m30s", 90), ("250ms", 0.25), ("0s", 0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert models.duration_seconds(text) == pytest.approx(seconds)
    assert models.RouteTimeouts.model_validate({"request": text}).request == text


def test_validate_k8s_fails_on_a_bad_pool_in_a_kustomization(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [pool.yaml]\n")
    (tmp_path / "pool.yaml").write_text(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p}\n"
        "spec:\n  selector: {matchLabels: {app: vllm}}\n"
        "  targetPorts: [{number: 8000}, {number: 8001}]\n"
        "  endpointPickerRef: {name: epp, port: {number: 9002}}\n"
    )
    out = run(sys.executable, DEPLOY / "validate_k8s.py", "--kubectl", BIN / "kubectl", tmp_path)
    assert out.returncode == 1
    assert "InferencePool/p" in out.stdout and "List should have at most 1 item" in out.stdout
    assert "2 problem(s)" in out.stdout  # the file, and kubectl kustomize's output of it

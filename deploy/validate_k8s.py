"""Validate the Kubernetes manifests of deploy/k8s (``make lint-deploy``).

    python deploy/validate_k8s.py deploy/k8s

For every kustomization under the given folders (a folder with ``kustomization.yaml``):
each manifest file it holds, and the output of ``kubectl kustomize`` on it (what ``kubectl
apply -k`` would send), resource by resource:

- built-in kinds with kubernetes-validate, strictly (unknown fields are errors), against
  the Kubernetes versions in ``VERSIONS``;
- the Prometheus operator's ``monitoring.coreos.com/v1`` ServiceMonitor and PodMonitor with
  the models that ``cloudcoil-models-prometheus-operator`` generates from the operator's CRD
  schemas (types, enums, patterns), plus a check that every field given is a field of the
  model (the models themselves ignore unknown fields);
- the Gateway API Inference Extension's ``inference.networking.k8s.io/v1`` InferencePool and
  the Gateway API's ``gateway.networking.k8s.io/v1`` Gateway and HTTPRoute with the pydantic
  models of ``gateway_models.py`` (beside this file), written from those CRDs' schemas (which
  releases: its docstring); they refuse unknown fields themselves;
- any other kind is an error: add a validator before adding the kind.

Exit status 1 if anything failed, after reporting everything.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

VERSIONS = ("1.30.0", "1.37.0")  # the oldest Kubernetes we claim, and the newest schemas


def gateway_models() -> Any:
    """deploy/gateway_models.py, imported once (as ``gateway_models``) from beside this file."""
    module = sys.modules.get("gateway_models")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "gateway_models", Path(__file__).with_name("gateway_models.py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["gateway_models"] = module  # before running it: pydantic resolves names there
        spec.loader.exec_module(module)
    return module


def _crd_models() -> dict[tuple[str, str], Any]:
    from cloudcoil.models.prometheus_operator import v1

    return {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): v1.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PodMonitor"): v1.PodMonitor,
        **gateway_models().MODELS,
    }


def unknown_fields(given: Any, known: Any, path: str = "") -> Iterator[str]:
    """Paths present in ``given`` but absent from the model's dump ``known``."""
    if isinstance(given, dict) and isinstance(known, dict):
        for key, value in given.items():
            if key not in known:
                yield f"{path}.{key}".lstrip(".")
            else:
                yield from unknown_fields(value, known[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(known, list):
        for i, (a, b) in enumerate(zip(given, known, strict=False)):
            yield from unknown_fields(a, b, f"{path}[{i}]")


def check_resource(resource: dict[str, Any], where: str) -> list[str]:
    """Problems with one resource (empty: valid)."""
    kind, api = resource.get("kind"), resource.get("apiVersion")
    name = f"{where}: {kind}/{(resource.get('metadata') or {}).get('name')}"
    model = _crd_models().get((api, kind))
    if model is not None:
        from pydantic import ValidationError

        try:
            parsed = model.model_validate(resource)
        except ValidationError as exc:
            return [f"{name}: {exc}"]
        dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return [f"{name}: unknown field {field}" for field in unknown_fields(resource, dumped)]
    problems = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{name}: Kubernetes {version}: {path}: {exc.message}")
        except SchemaNotFoundError as exc:
            problems.append(f"{name}: no schema to validate it ({exc.message})")
            break
    return problems


def kustomize(folder: Path, kubectl: str) -> str:
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder}: {out.stderr.strip()}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path, help="folders to search for kustomizations")
    parser.add_argument(
        "--kubectl",
        default=shutil.which("kubectl", path=os.path.dirname(sys.executable)) or "kubectl",
        help="kubectl binary, for `kubectl kustomize` (default: the one beside this Python)",
    )
    args = parser.parse_args(argv)
    folders = sorted({k.parent for root in args.roots for k in root.rglob("kustomization.yaml")})
    if not folders:
        print("validate_k8s: no kustomization.yaml found", file=sys.stderr)
        return 1
    problems: list[str] = []
    checked = 0
    for folder in folders:
        sources: list[tuple[str, str]] = [
            (str(f), f.read_text())
            for f in sorted(folder.glob("*.yaml"))
            if f.name != "kustomization.yaml"
        ]
        try:
            sources.append((f"kubectl kustomize {folder}", kustomize(folder, args.kubectl)))
        except RuntimeError as exc:
            problems.append(str(exc))
        for where, text in sources:
            for resource in yaml.safe_load_all(text):
                if not resource:
                    continue
                checked += 1
                problems += check_resource(resource, where)
    for problem in problems:
        print(f"ERROR {problem}")
    print(
        f"validate_k8s: {checked} resources in {len(folders)} kustomizations, "
        f"Kubernetes {', '.join(VERSIONS)}: {len(problems)} problem(s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

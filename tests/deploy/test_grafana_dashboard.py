"""Every metric the Grafana dashboard queries exists where Prometheus scrapes it.

A simulated worker and ``cache-router serve`` in front of it run on 127.0.0.1 (the
processes of :mod:`traces.live.fleet`), the router with ``--state-url`` on a real redis-server so
the scale-out series exist too; a few completions go through the router so that the
labelled series exist; both ``/metrics`` pages are parsed with prometheus_client's parser.
Every PromQL expression of deploy/grafana/dashboards/cache-router.json (panel targets and
template variables) is parsed with a real PromQL parser, and each metric it selects must be
a series of the router (``cache_router_*``) or of the worker (``vllm:*``, which the
simulated worker exports under vLLM's names), of a type that fits how it is queried, with
the labels the query matches on.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from traces.live.fleet import HOST, Service, free_port, start_service

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from scale_support import RedisServer

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "dashboards" / "cache-router.json"

# Series Prometheus makes itself, not any exporter.
SYNTHETIC = {"up"}
# Labels a scraped series may carry besides its exporter's: Prometheus adds job and instance
# to every target; deploy/prometheus/prometheus.yml and vllm-servicemonitor.yaml add worker
# (the router's URL of the worker) to the workers' series.
TARGET_LABELS = {"job", "instance"}
WORKER_TARGET_LABELS = TARGET_LABELS | {"worker"}
# Router counters that only count failures, so a few good requests leave them without samples.
FAILURE_ONLY = {
    "cache_router_retries_total",
    "cache_router_upstream_errors_total",
    "cache_router_shadow_corrections_total",
    "cache_router_tokenize_total",
    "cache_router_state_sync_errors_total",
}
RATE_FUNCTIONS = {"rate", "irate", "increase"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}


@dataclass
class Series:
    """A queryable series name of one exporter: its family, type, and labels seen."""

    name: str
    family: str
    type: str
    labels: set[str] = field(default_factory=set)
    samples: int = 0


def series_by_name(text: str) -> dict[str, Series]:
    """Every name a PromQL query can select in an exposition, resolved to its family.

    A counter family ``x`` is queried as ``x_total``; a histogram ``h`` as ``h_bucket``,
    ``h_sum`` and ``h_count``; a gauge by its own name. Families without samples still
    count (their names are declared), with no labels known.
    """
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            name = family.name + suffix
            out[name] = Series(name, family.name, family.type)
        for sample in family.samples:
            series = out.setdefault(sample.name, Series(sample.name, family.name, family.type))
            series.samples += 1
            series.labels.update(sample.labels)
    return out


# ---- the dashboard's queries -------------------------------------------------------------

_RANGE_VARS = re.compile(r"\$\{?__(?:rate_interval|interval|range)\b\}?")
_VARS = re.compile(r"\$\{\w+(?::\w+)?\}|\$\w+")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([^,()]+?)\s*,\s*\w+\s*\)\s*$")
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def to_promql(expr: str) -> str:
    """A Grafana query as plain PromQL: range variables → 5m, other variables → ``.*``."""
    return _VARS.sub(".*", _RANGE_VARS.sub("5m", expr))


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    out = []
    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        if (m := _LABEL_VALUES.match(query)) or (m := _QUERY_RESULT.match(query)):
            out.append((f"variable {var['name']}", m.group(1)))
        else:
            raise AssertionError(f"variable {var['name']}: unrecognised query {query!r}")
    return out


@dataclass
class Selected:
    """One vector selector of a query, and whether a rate-like function reads it."""

    name: str | None
    labels: set[str]
    under_rate: bool


def selectors(expr: str) -> list[Selected]:
    """The vector selectors of ``expr``; those that rate()/irate()/increase() read are marked."""
    ast = promql_parser.parse(to_promql(expr))
    found: list[Selected] = []
    rated: Counter[str] = Counter()  # selectors (as text) a rate-like call reads, not yet seen

    def visit(node: Any) -> None:
        # pre-order: a call is visited before the selector inside its range argument
        if isinstance(node, promql_parser.Call) and node.func.name in RATE_FUNCTIONS:
            for arg in node.args:
                if isinstance(arg, promql_parser.MatrixSelector):
                    rated[str(arg.vector_selector)] += 1
        elif isinstance(node, promql_parser.VectorSelector):
            key = str(node)
            under_rate = rated[key] > 0
            rated[key] -= under_rate
            found.append(_selected(node, under_rate))

    promql_parser.walk(ast, pre_visit=visit)
    return found


def _selected(vs: Any, under_rate: bool) -> Selected:
    labels = {m.name for m in vs.matchers.matchers} | {
        m.name for group in vs.matchers.or_matchers for m in group
    }
    return Selected(vs.name, labels - {"__name__"}, under_rate)


# ---- the stack -------------------------------------------------------------------------


@dataclass
class Scrapes:
    router: dict[str, Series]
    worker: dict[str, Series]


@pytest.fixture(scope="module")
def scrapes() -> Iterator[Scrapes]:
    """A sim worker and a router on 127.0.0.1 after a few requests; both /metrics parsed."""
    started: list[Service] = []
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="grafana-redis-"))).start()
    try:
        wport = free_port()
        worker = start_service(
            "sim-worker",
            ["sim-worker", "--host", HOST, "--port", str(wport), "--time-scale", "50",
             "--log-level", "warning"],
            wport,
        )  # fmt: skip
        started.append(worker)
        rport = free_port()
        router = start_service(
            "router",
            ["serve", "--host", HOST, "--port", str(rport), "--worker", worker.url,
             "--log-level", "warning", "--state-url", redis.url],
            rport,
            timeout_s=60,
        )  # fmt: skip
        started.append(router)
        # A shared ~3,000-byte prefix (several 512-token blocks at 4 bytes a token), so the
        # later requests hit the worker's cache and both sides count cached tokens.
        prefix = "You are a helpful assistant. " * 100
        with httpx.Client(base_url=router.url, timeout=30) as client:
            for i in range(5):
                if i % 2:
                    body = {
                        "model": "sim-model",
                        "prompt": f"{prefix} question {i}",
                        "max_tokens": 4,
                    }
                    r = client.post("/v1/completions", json=body)
                else:
                    body = {
                        "model": "sim-model",
                        "messages": [{"role": "user", "content": f"{prefix} question {i}"}],
                        "max_tokens": 4,
                        "stream": i == 4,
                    }
                    r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
            router_text = client.get("/metrics").text
        worker_text = httpx.get(worker.url + "/metrics", timeout=10).text
        yield Scrapes(series_by_name(router_text), series_by_name(worker_text))
    finally:
        for service in reversed(started):
            service.stop()
        redis.stop()
        shutil.rmtree(redis.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def queries() -> list[tuple[str, str]]:
    return dashboard_queries(json.loads(DASHBOARD.read_text()))


# ---- tests ----------------------------------------------------------------------------


def test_every_query_parses(queries: list[tuple[str, str]]) -> None:
    assert len(queries) >= 20
    for where, expr in queries:
        try:
            promql_parser.parse(to_promql(expr))
        except ValueError as exc:
            pytest.fail(f"{where}: {expr!r}: {exc}")


def test_every_queried_metric_is_exported(queries: list[tuple[str, str]], scrapes: Scrapes) -> None:
    problems = []
    used: set[str] = set()
    for where, expr in queries:
        variable = where.startswith("variable ")  # label_values(metric, label): no rate()
        for sel in selectors(expr):
            if sel.name is None:
                problems.append(f"{where}: a selector without a metric name")
                continue
            used.add(sel.name)
            if sel.name in SYNTHETIC:
                continue
            if sel.name.startswith("cache_router_"):
                source, exporter, extra = scrapes.router, "the router", TARGET_LABELS
            elif sel.name.startswith("vllm:"):
                source, exporter, extra = scrapes.worker, "the worker", WORKER_TARGET_LABELS
            else:
                problems.append(f"{where}: {sel.name}: neither a router nor a vLLM metric")
                continue
            series = source.get(sel.name)
            if series is None:
                problems.append(f"{where}: {sel.name} is not in {exporter}'s /metrics")
                continue
            if sel.under_rate and series.type == "gauge":
                problems.append(f"{where}: rate() of the gauge {sel.name}")
            if not (sel.under_rate or variable) and series.type in ("counter", "histogram"):
                problems.append(f"{where}: {sel.name} ({series.type}) read without rate()")
            if series.samples and not sel.labels <= series.labels | extra:
                missing = sorted(sel.labels - series.labels - extra)
                problems.append(f"{where}: {sel.name} has no label {', '.join(missing)}")
    assert not problems, "\n".join(problems)
    # the dashboard covers both exporters
    assert any(n.startswith("cache_router_") for n in used)
    assert any(n.startswith("vllm:") for n in used)


def test_queried_router_series_have_samples(
    queries: list[tuple[str, str]], scrapes: Scrapes
) -> None:
    """After a few good requests every queried router series but the failure counters exists."""
    names = {s.name for _, e in queries for s in selectors(e) if s.name}
    empty = sorted(
        n
        for n in names
        if n.startswith("cache_router_") and n not in FAILURE_ONLY
        and n in scrapes.router and not scrapes.router[n].samples
    )  # fmt: skip
    assert not empty, f"no samples after 5 requests: {empty}"
    assert scrapes.worker["vllm:prefix_cache_hits_total"].samples


def test_name_resolution_handles_suffixes() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum 0.5\n'
        "# TYPE c_total counter\nc_total 3\n"
        "# TYPE g gauge\ng 2\n"
        "# TYPE vllm:q_total counter\n"
    )
    series = series_by_name(text)
    assert series["h_bucket"].type == "histogram" and series["h_bucket"].labels == {"le"}
    assert {"h_count", "h_sum"} <= series.keys() and "h" not in series
    assert series["c_total"].type == "counter" and "c" not in series
    assert series["g"].type == "gauge"
    assert "vllm:q_total" in series and series["vllm:q_total"].samples == 0


def test_selectors_see_through_grafana_variables() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{policy=~"$policy"}[$__rate_interval])))'
        ' / on() group_left sum(b{worker=~"${worker}"})'
    )
    found = {(s.name, frozenset(s.labels), s.under_rate) for s in selectors(expr)}
    assert found == {("a_bucket", frozenset({"policy"}), True), ("b", frozenset({"worker"}), False)}

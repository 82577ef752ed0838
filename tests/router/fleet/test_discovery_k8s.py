"""K8sDiscovery (router/fleet/discovery_k8s.py) against a real HTTP server on 127.0.0.1 that
replays recorded EndpointSlice lists and watch streams (tests/data/k8s, the API's wire format)
and checks every request the client sends: path, bearer token, labelSelector, LIST vs WATCH,
the resourceVersion a watch resumes from, bookmarks asked for, a timeout given."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio.config import incluster_config

from router.fleet.discovery_k8s import K8sDiscovery, api_configuration

DATA = Path(__file__).parents[2] / "data" / "k8s"
NAMESPACE = "llm"
SELECTOR = "kubernetes.io/service-name=vllm"
PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
TOKEN = "test-token"
WATCH_TIMEOUT_S = 30


def urls(*hosts: str, port: int = 8000, scheme: str = "http") -> frozenset[str]:
    return frozenset(f"{scheme}://{h}:{port}" for h in hosts)


INITIAL = urls("10.244.1.17", "10.244.2.9", "10.244.3.4", "10.244.5.20")
RELISTED = urls("10.244.1.17", "10.244.2.9", "10.244.3.4", "10.244.3.8", "10.244.4.12")


def as_bool(values: list[str]) -> bool:
    """A query boolean as the API server reads it (apimachinery's Convert_Slice_string_To_bool):
    absent, "0" or "false" (any case) is false, anything else true."""
    return bool(values) and values[0] != "0" and values[0].lower() != "false"


@dataclass
class Step:
    """One request the server expects, and its answer."""

    verb: str  # "list" or "watch"
    body: str | None = None  # data file: a list, a watch stream (.jsonl) or a Status
    since: str | None = None  # the resourceVersion a watch must start from
    status: int = 200  # not 200: answer with this status and the Status in ``body``
    end: str = "close"  # a watch's end: "close" (timeoutSeconds), "drop" (cut), "hold"


class FakeApiServer:
    """Answers EndpointSlice LIST/WATCH requests from a script of :class:`Step`; past the
    script a watch is held open (a quiet cluster). Mismatched requests go to ``problems``."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = deque(steps)
        self.seen: list[tuple[str, str | None]] = []
        self.problems: list[str] = []
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, port: int = 0) -> FakeApiServer:
        app = web.Application()
        app.router.add_get(PATH, self.handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _check(self, request: web.Request, step: Step, verb: str) -> None:
        q = request.query
        wrong = []
        if verb != step.verb:
            wrong.append(f"a {verb.upper()}, expected a {step.verb.upper()}")
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            wrong.append(f"Authorization {request.headers.get('Authorization')!r}")
        if "application/json" not in request.headers.get("Accept", ""):
            wrong.append(f"Accept {request.headers.get('Accept')!r}")
        if q.get("labelSelector") != SELECTOR:
            wrong.append(f"labelSelector {q.get('labelSelector')!r}")
        if verb == "list" and "resourceVersion" in q:  # a fresh, consistent list
            wrong.append(f"LIST with resourceVersion {q['resourceVersion']!r}")
        if verb == "watch":
            if q.get("resourceVersion") != step.since:
                wrong.append(f"resourceVersion {q.get('resourceVersion')!r}, not {step.since!r}")
            if not as_bool(q.getall("allowWatchBookmarks", [])):
                wrong.append("no allowWatchBookmarks")
            if q.get("timeoutSeconds") != str(WATCH_TIMEOUT_S):
                wrong.append(f"timeoutSeconds {q.get('timeoutSeconds')!r}")
        self.problems.extend(
            f"request {len(self.seen)} ({request.query_string}): {w}" for w in wrong
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        verb = "watch" if as_bool(request.query.getall("watch", [])) else "list"
        self.seen.append((verb, request.query.get("resourceVersion")))
        if self.steps:
            step = self.steps.popleft()
        elif verb == "watch":
            step = Step("watch", since=request.query.get("resourceVersion"), end="hold")
        else:
            step = Step("past the script", status=500, body="status-503.json")
        self._check(request, step, verb)
        if step.status != 200 or verb == "list":
            body = json.dumps(json.loads((DATA / step.body).read_text()), separators=(",", ":"))
            return web.Response(status=step.status, text=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if step.body:
            for line in (DATA / step.body).read_bytes().splitlines():
                await resp.write(line + b"\n")  # one event per chunk, as the server flushes
        if step.end == "drop":
            request.transport.close()  # cut: no terminating chunk
        elif step.end == "hold":
            await self._closing.wait()
        return resp


class Consumer:
    """Runs ``source.snapshots()`` in a task; ``next()`` waits (bounded) for the next one."""

    def __init__(self, source: K8sDiscovery) -> None:
        self.source = source
        self.queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for snapshot in self.source.snapshots():
            self.queue.put_nowait(snapshot)

    async def next(self, timeout: float = 5.0) -> frozenset[str]:
        get = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait(
            {get, self.task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
        if get in done:
            return get.result()
        get.cancel()
        if self.task in done:
            self.task.result()  # the source failed: raise its exception
        raise AssertionError("no snapshot in time")

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def source_for(port: int, query: str = f"labelSelector={SELECTOR}&port=8000") -> K8sDiscovery:
    return K8sDiscovery.from_uri(
        f"k8s://{NAMESPACE}?{query}",
        configuration=api_configuration(f"http://127.0.0.1:{port}", token=TOKEN),
        watch_timeout_s=WATCH_TIMEOUT_S,
        request_timeout_s=5.0,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )


async def test_list_then_watch_changes_bookmark_and_dropped_watch():
    server = await FakeApiServer(
        [
            Step("list", "list-initial.json"),
            Step("watch", "watch-changes.jsonl", since="41820"),  # ends at its timeout
            Step("watch", "watch-after-bookmark.jsonl", since="42180", end="drop"),
            Step("watch", since="42230", end="hold"),  # resumed from the last event, no LIST
        ]
    ).start()
    source = source_for(server.port)
    consumer = Consumer(source)
    try:
        # LIST: ready endpoints only (not vllm-3 starting, not vllm-4 or the manual slice's
        # ready-but-terminating one), and the manual slice's endpoint without conditions.
        assert await consumer.next() == INITIAL
        # WATCH: ADDED slice vllm-x8m3c, MODIFIED (vllm-1 not ready), DELETED vllm-manual
        after_added = INITIAL | urls("10.244.4.12")
        assert await consumer.next() == after_added
        assert await consumer.next() == after_added - urls("10.244.2.9")
        assert await consumer.next() == after_added - urls("10.244.2.9", "10.244.5.20")
        # the BOOKMARK changed nothing; the next watch started from it (the server checks)
        assert await consumer.next() == after_added - urls("10.244.5.20")
        await until(lambda: len(server.seen) == 4)  # dropped, then resumed from 42230
        await asyncio.sleep(0.1)
        assert consumer.queue.empty()
        assert server.seen == [
            ("list", None),
            ("watch", "41820"),
            ("watch", "42180"),
            ("watch", "42230"),
        ]
        assert server.problems == []
        assert source.stats.snapshots == 5
        assert source.stats.errors == {"dropped": 1}
        assert source.resource_version == "42230"
    finally:
        await consumer.close()
        await server.stop()


async def test_expired_resource_version_lists_again():
    server = await FakeApiServer(
        [
            Step("list", "list-initial.json"),
            Step("watch", "watch-expired.jsonl", since="41820"),  # ERROR event, code 410
            Step("list", "list-relist.json"),
            Step("watch", "status-410.json", since="43120", status=410),  # HTTP 410
            Step("list", "list-relist.json"),
            Step("watch", since="43120", end="hold"),
        ]
    ).start()
    source = source_for(server.port)
    consumer = Consumer(source)
    try:
        assert await consumer.next() == INITIAL
        assert await consumer.next() == RELISTED  # the state as of the new list
        assert await consumer.next() == RELISTED  # listed again after the HTTP 410
        await until(lambda: len(server.seen) == 6)
        assert [verb for verb, _ in server.seen] == [
            "list",
            "watch",
            "list",
            "watch",
            "list",
            "watch",
        ]
        assert server.problems == []
        assert source.stats.errors == {}  # an expired version is routine, not a failure
    finally:
        await consumer.close()
        await server.stop()


async def test_api_server_down_keeps_the_last_snapshot_and_recovers(caplog):
    caplog.set_level(logging.INFO, logger="cache_router.discovery")
    with socket.socket() as s:  # a port with nothing listening (yet)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = source_for(port)
    consumer = Consumer(source)
    server = None
    try:
        await until(lambda: source.stats.errors.get("connect", 0) >= 3)
        assert consumer.queue.empty()  # no empty snapshot for a server that does not answer
        assert "Cannot connect" in (source.stats.last_error or "")
        server = await FakeApiServer(
            [
                Step("list", "status-503.json", status=503),
                Step("list", "list-initial.json"),
                Step("watch", since="41820", end="hold"),
            ]
        ).start(port)
        assert await consumer.next() == INITIAL
        assert source.stats.errors["http 503"] == 1
        assert server.problems == []
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per streak
        assert "keeping the last 0 workers" in warnings[0].getMessage()
        assert any("answers again" in r.getMessage() for r in caplog.records)
    finally:
        await consumer.close()
        if server is not None:
            await server.stop()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (f"labelSelector={SELECTOR}&portName=http", urls("10.244.1.30", "[fd00:10:244:1::1e]")),
        (f"labelSelector={SELECTOR}", urls("10.244.1.30", "[fd00:10:244:1::1e]", port=9400)),
        (
            f"labelSelector={SELECTOR}&port=8443&scheme=https",
            urls("10.244.1.30", "[fd00:10:244:1::1e]", port=8443, scheme="https"),
        ),
        (f"labelSelector={SELECTOR}&portName=grpc", frozenset()),  # no such port: none
    ],
)
async def test_port_selection(query, expected):
    server = await FakeApiServer([Step("list", "list-named-ports.json")]).start()
    consumer = Consumer(source_for(server.port, query))
    try:
        assert await consumer.next() == expected
        assert server.problems == []
    finally:
        await consumer.close()
        await server.stop()


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("dns://llm?labelSelector=a=b", "expected k8s://NAMESPACE"),
        ("k8s://?labelSelector=a=b", "no namespace"),
        ("k8s://Not_A_Namespace?labelSelector=a=b", "is not a Kubernetes namespace"),
        ("k8s://llm/vllm?labelSelector=a=b", "unexpected path"),
        ("k8s://llm", "labelSelector is required"),
        ("k8s://llm?labelSelector=", "labelSelector is required"),
        ("k8s://llm?labelSelector=a=b&labelSelector=c=d", "labelSelector given twice"),
        ("k8s://llm?selector=a=b", "unknown option 'selector'"),
        ("k8s://llm?labelSelector=a=b&port=http", "port 'http' is not a number"),
        ("k8s://llm?labelSelector=a=b&port=70000", "port 70000 is not in 1..65535"),
        ("k8s://llm?labelSelector=a=b&port=8000&portName=http", "port or portName, not both"),
        ("k8s://llm?labelSelector=a=b&scheme=grpc", "scheme must be http or https"),
    ],
)
def test_bad_uris(uri, message):
    configuration = api_configuration("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="--discover") as caught:
        K8sDiscovery.from_uri(uri, configuration=configuration)
    assert message in str(caught.value)


def test_in_cluster_configuration(monkeypatch, tmp_path):
    uri = f"k8s://{NAMESPACE}?labelSelector={SELECTOR}&port=8000"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="no in-cluster Kubernetes credentials"):
        K8sDiscovery.from_uri(uri)
    # in a pod: the service account's token and CA, the API server from the environment
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    source = K8sDiscovery.from_uri(uri)
    assert source.uri == uri
    assert source.configuration.host == "https://10.96.0.1:443"
    assert source.configuration.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert source.configuration.api_key["BearerToken"] == "Bearer sa-token"

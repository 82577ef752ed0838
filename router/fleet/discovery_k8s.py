"""``--discover k8s://NAMESPACE?labelSelector=...``: workers from Kubernetes EndpointSlices.

The informer pattern of client-go's Reflector, over kubernetes_asyncio's API client (auth, TLS,
URLs, query encoding): LIST the ``discovery.k8s.io/v1`` EndpointSlices that match the label
selector, yield the ready endpoints, then WATCH from the list's ``resourceVersion`` (with
bookmarks, so a quiet watch still advances it) and yield again after each change. A watch that
ends or drops resumes from the last ``resourceVersion`` seen, without a new LIST; only a 410
(the server no longer holds that version) lists again. Failures follow the rules of
:mod:`router.fleet.discovery_source`: the last snapshot stands while the API server is away.

Query options: ``port=8000`` (every endpoint on that port), ``portName=http`` (the port of
that name in each slice's ``ports``), neither (each slice's first port); ``scheme=https``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration, DiscoveryV1Api
from kubernetes_asyncio.config import ConfigException, load_incluster_config

from router.config import normalize_url
from router.fleet.discovery_source import DiscoveryStats

log = logging.getLogger("cache_router.discovery")

QUERY_KEYS = ("labelSelector", "port", "portName", "scheme")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1123 label


def api_configuration(
    host: str, *, token: str | None = None, ca_cert: str | None = None, verify_ssl: bool = True
) -> Configuration:
    """A client configuration for an API server given by hand (tests, ``kubectl proxy``):
    ``host`` like ``https://10.0.0.1:6443``, a bearer ``token``, a CA file or no TLS check."""
    configuration = Configuration(host=host, ssl_ca_cert=ca_cert)
    configuration.verify_ssl = verify_ssl
    if token is not None:
        configuration.api_key["BearerToken"] = f"Bearer {token}"
    return configuration


class _Expired(Exception):
    """410: the resourceVersion we watch from is gone from the server's history."""


class _Failure(Exception):
    """A transient failure, with the kind it is counted under in ``stats.errors``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class K8sDiscovery:
    """Follows the ready endpoints of the EndpointSlices matching ``label_selector``."""

    def __init__(
        self,
        namespace: str,
        label_selector: str,
        *,
        port: int | None = None,
        port_name: str | None = None,
        scheme: str = "http",
        configuration: Configuration | None = None,
        uri: str | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
    ) -> None:
        where = f"--discover {uri!r}" if uri else "k8s discovery"
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"{where}: namespace {namespace!r} is not a Kubernetes namespace")
        if not label_selector.strip():
            raise ValueError(
                f"{where}: labelSelector is required (e.g. kubernetes.io/service-name=vllm), "
                "or every EndpointSlice of the namespace would be taken"
            )
        if port is not None and port_name is not None:
            raise ValueError(f"{where}: give port or portName, not both")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"{where}: port {port} is not in 1..65535")
        if port_name is not None and not port_name:
            raise ValueError(f"{where}: portName is empty")
        if scheme not in ("http", "https"):
            raise ValueError(f"{where}: scheme must be http or https, not {scheme!r}")
        if configuration is None:
            configuration = Configuration()
            try:  # the pod's service account: token + CA under /var/run/secrets/kubernetes.io
                load_incluster_config(client_configuration=configuration)
            except ConfigException as exc:
                raise ValueError(
                    f"{where}: no in-cluster Kubernetes credentials ({exc}); run it in a pod "
                    "whose service account token is mounted"
                ) from exc
        self.namespace = namespace
        self.label_selector = label_selector
        self.port = port
        self.port_name = port_name
        self.scheme = scheme
        self.configuration = configuration
        self.uri = uri or self._describe()
        self.stats = DiscoveryStats()
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.resource_version: str | None = None  # where the next WATCH starts; None: LIST
        self._slices: dict[str, frozenset[str]] = {}  # namespace/name -> its worker URLs
        self._streak = 0  # failures in a row
        self._portless: set[str] = set()  # slices already warned about having no usable port

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> K8sDiscovery:
        """``k8s://NAMESPACE?labelSelector=...[&port=N|&portName=NAME][&scheme=https]``;
        ``kwargs`` go to the constructor (``configuration=`` instead of in-cluster config)."""
        parts = urlsplit(uri)
        form = "expected k8s://NAMESPACE?labelSelector=...[&port=N|&portName=NAME]"
        if parts.scheme != "k8s":
            raise ValueError(f"--discover {uri!r}: {form}")
        if not parts.netloc:
            raise ValueError(f"--discover {uri!r}: no namespace; {form}")
        if parts.path not in ("", "/") or parts.fragment:
            raise ValueError(f"--discover {uri!r}: unexpected path or fragment; {form}")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in QUERY_KEYS:
                raise ValueError(
                    f"--discover {uri!r}: unknown option {key!r} (known: {', '.join(QUERY_KEYS)})"
                )
            if key in query:
                raise ValueError(f"--discover {uri!r}: {key} given twice")
            query[key] = value
        port = query.get("port")
        if port is not None and not port.isdigit():
            raise ValueError(f"--discover {uri!r}: port {port!r} is not a number")
        return cls(
            parts.netloc,
            query.get("labelSelector", ""),
            port=int(port) if port is not None else None,
            port_name=query.get("portName"),
            scheme=query.get("scheme", "http"),
            uri=uri,
            **kwargs,
        )

    def _describe(self) -> str:
        query = {"labelSelector": self.label_selector}
        if self.port is not None:
            query["port"] = str(self.port)
        if self.port_name is not None:
            query["portName"] = self.port_name
        if self.scheme != "http":
            query["scheme"] = self.scheme
        return f"k8s://{self.namespace}?{urlencode(query, safe='/=,')}"

    # -- EndpointSlice -> worker URLs --------------------------------------------------------

    def slice_urls(self, obj: dict[str, Any]) -> frozenset[str]:
        """The URLs of one EndpointSlice's ready endpoints (empty if none, or no port fits)."""
        port = self.port if self.port is not None else self._slice_port(obj.get("ports") or [])
        if port is None:
            if obj.get("endpoints") and self._key(obj) not in self._portless:
                self._portless.add(self._key(obj))
                wanted = f"no port named {self.port_name!r}" if self.port_name else "no port"
                log.warning("discovery %s: slice %s has %s", self.uri, self._key(obj), wanted)
            return frozenset()
        urls = set()
        for endpoint in obj.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            # ready absent means ready (API reference); a terminating endpoint takes no new work
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            addresses = endpoint.get("addresses") or []
            if not addresses:
                continue
            # Only the first address: the API reference defines no meaning for the others (the
            # EndpointSlice controller writes exactly one), so more would be the same pod twice.
            urls.add(normalize_url(f"{self.scheme}://{_host(addresses[0])}:{port}"))
        return frozenset(urls)

    def _urls_of(self, obj: dict[str, Any]) -> frozenset[str]:
        try:
            return self.slice_urls(obj)
        except (AttributeError, TypeError, ValueError) as exc:  # not shaped as an EndpointSlice
            raise _Failure("bad response", f"watch: not an EndpointSlice: {exc!r}") from exc

    def _slice_port(self, ports: list[dict[str, Any]]) -> int | None:
        for entry in ports:
            if self.port_name is None or entry.get("name") == self.port_name:
                return entry.get("port")  # null: "all ports", nothing to dial
        return None

    def _current(self) -> frozenset[str]:
        return frozenset().union(*self._slices.values())

    # -- the stream --------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[frozenset[str]]:
        """LIST, then WATCH for ever; yields after the LIST and after each change."""
        api_client = ApiClient(self.configuration)
        api = DiscoveryV1Api(api_client)
        loop = asyncio.get_running_loop()
        self.resource_version = None  # a new stream starts with a snapshot
        try:
            while True:
                started = loop.time()
                try:
                    if self.resource_version is None:
                        await self._list(api)
                        self._recovered()
                        self.stats.snapshots += 1
                        yield self._current()
                        started = loop.time()
                    last = self._current()
                    async with aclosing(self._watch(api)) as changes:  # closed if we are
                        async for _ in changes:
                            self._recovered()
                            now = self._current()
                            if now != last:
                                last = now
                                self.stats.snapshots += 1
                                yield now
                    self._recovered()  # ended at timeoutSeconds: resume from the same version
                except _Expired as exc:
                    log.info("discovery %s: %s; listing again", self.uri, exc)
                    self.resource_version = None
                except _Failure as exc:
                    await asyncio.sleep(self._failed(exc.kind, str(exc)))
                    continue
                if loop.time() - started < self.backoff_initial_s:  # a server ending at once
                    await asyncio.sleep(self.backoff_initial_s)
        finally:
            await api_client.close()

    async def _list(self, api: DiscoveryV1Api) -> None:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with _failures("list"):
            resp = await api.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=self.label_selector,
                _preload_content=False,
                _request_timeout=timeout,
            )
            async with resp:
                body = await resp.read()
        if resp.status != 200:
            raise _http_failure("list", resp.status, body)
        try:
            listing = orjson.loads(body)
            version = listing["metadata"]["resourceVersion"]
            slices = {self._key(obj): self.slice_urls(obj) for obj in listing.get("items") or []}
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # JSONDecodeError too
            raise _Failure("bad response", f"list: not an EndpointSliceList: {exc!r}") from exc
        self._slices = slices
        self.resource_version = str(version)
        log.debug("discovery %s: listed %d slices at %s", self.uri, len(slices), version)

    async def _watch(self, api: DiscoveryV1Api) -> AsyncIterator[None]:
        """One WATCH from ``resource_version``: applies each event, yields after those that may
        change the set; returns when the server ends it (timeoutSeconds)."""
        timeout = aiohttp.ClientTimeout(
            total=self.watch_timeout_s + self.request_timeout_s, sock_connect=self.request_timeout_s
        )
        async with _failures("watch"):
            resp = await api.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=self.label_selector,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                watch=True,
                _preload_content=False,
                _request_timeout=timeout,
            )
            async with resp:
                if resp.status != 200:
                    raise _http_failure("watch", resp.status, await resp.read())
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip() and self._apply(line):
                            yield None
                if buffer.strip():  # the stream stopped inside an event: a dropped watch
                    raise _Failure("dropped", "watch: stream cut inside an event")

    def _apply(self, line: bytes) -> bool:
        """Apply one watch event; True if it may have changed the set."""
        try:
            event = orjson.loads(line)
            kind, obj = event["type"], event["object"]
            version = (obj.get("metadata") or {}).get("resourceVersion")
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise _Failure("bad response", f"watch: not a watch event: {exc}") from exc
        if kind == "ERROR":  # a Status object
            code, message = obj.get("code"), obj.get("message") or obj.get("reason")
            if code == 410:
                raise _Expired(f"watch from {self.resource_version}: {message}")
            raise _Failure(f"watch error {code}", f"watch: {message} ({code})")
        if version is not None:
            self.resource_version = str(version)
        if kind in ("ADDED", "MODIFIED"):
            self._slices[self._key(obj)] = self._urls_of(obj)
            return True
        if kind == "DELETED":
            self._slices.pop(self._key(obj), None)
            return True
        if kind != "BOOKMARK":
            log.debug("discovery %s: ignoring a %r watch event", self.uri, kind)
        return False

    def _key(self, obj: dict[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace') or self.namespace}/{meta.get('name')}"

    def _failed(self, kind: str, message: str) -> float:
        """Count a transient failure; the delay before the next try."""
        self.stats.error(kind, message)
        self._streak += 1
        if self._streak == 1:
            log.warning(
                "discovery %s: %s; keeping the last %d workers, retrying",
                self.uri,
                message,
                len(self._current()),
            )
        else:
            log.debug("discovery %s: %s (failure %d in a row)", self.uri, message, self._streak)
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** (self._streak - 1))

    def _recovered(self) -> None:
        if self._streak:
            log.info("discovery %s: API server answers again (%d failures)", self.uri, self._streak)
            self._streak = 0


def _host(address: str) -> str:
    """An IPv6 address in brackets, as a URL wants it; IPv4 and names as they are."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


class _failures:
    """Turns the client's connection errors and timeouts into counted :class:`_Failure`."""

    def __init__(self, what: str) -> None:
        self.what = what

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, _Failure | _Expired | asyncio.CancelledError):
            return
        if isinstance(exc, aiohttp.ClientConnectorError):
            raise _Failure("connect", f"{self.what}: {exc}") from exc
        if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
            raise _Failure("dropped", f"{self.what}: connection dropped ({exc})") from exc
        if isinstance(exc, TimeoutError):
            raise _Failure("timeout", f"{self.what}: timed out") from exc
        if isinstance(exc, aiohttp.ClientError | OSError):
            raise _Failure("client", f"{self.what}: {exc or type(exc).__name__}") from exc


def _http_failure(what: str, status: int, body: bytes) -> Exception:
    """A non-200 answer: 410 means list again, anything else is transient (a Status body's
    message says why, e.g. RBAC's "endpointslices ... is forbidden")."""
    message = ""
    try:
        status_obj = orjson.loads(body)
        if isinstance(status_obj, dict):
            message = str(status_obj.get("message") or "")
    except orjson.JSONDecodeError:
        message = body[:200].decode("utf-8", "replace")
    if status == 410:
        return _Expired(f"{what}: HTTP 410 {message}".rstrip())
    return _Failure(f"http {status}", f"{what}: HTTP {status} {message}".rstrip())

"""``--discover``: workers found by DNS or the Kubernetes API join the fleet and leave it.

Each URI becomes a source (:mod:`router.fleet.discovery_source`: DNS in
:mod:`router.fleet.discovery_dns`, EndpointSlices in :mod:`router.fleet.discovery_k8s`) that
yields the whole set of workers it sees whenever that may have changed. Each snapshot is
applied through :class:`~router.fleet.membership.Membership`, the path of ``POST/DELETE
/workers``: a URL that appears joins (probed and read for its models at once), one that goes
leaves and drains (its requests in flight finish). A source only removes the workers it
found itself (a ``--worker`` flag or an admin API addition stays), and a worker that two
sources list stays while either does.

Roles (disaggregated fleets): a URI's ``role=prefill`` or ``role=decode`` parameter (and an
SGLang prefill pool's ``bootstrap_port=N``) gives the role of the workers it finds, e.g.
``dns://prefill.llm.svc:8000?role=prefill``; the source itself never sees them.

Replicas (``--processes``, ``--state-url``): every replica runs its sources; their changes
go to the shared worker set like an admin change, so all replicas converge on the same
fleet, also while one of them has not yet looked again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode

from router.config import Settings
from router.fleet import periodic
from router.fleet.discovery_source import DiscoverySource
from router.fleet.membership import Membership
from router.fleet.pool import BOTH, ROLES

log = logging.getLogger("cache_router.discovery")

SCHEMES = ("dns://", "dns+srv://", "k8s://")


def make_source(uri: str, settings: Settings) -> DiscoverySource:
    """The source for one ``--discover`` URI (ValueError for a URI no source takes)."""
    if uri.startswith(("dns://", "dns+srv://")):
        from router.fleet.discovery_dns import DnsDiscovery

        return DnsDiscovery.from_uri(
            uri, interval_s=settings.discover_interval_s, nameserver=settings.discover_nameserver
        )
    if uri.startswith("k8s://"):
        from router.fleet.discovery_k8s import K8sDiscovery

        return K8sDiscovery.from_uri(uri)
    raise ValueError(f"--discover {uri!r}: expected one of {', '.join(SCHEMES)}")


def split_role(uri: str) -> tuple[str, str, int | None]:
    """``uri`` without its ``role`` and ``bootstrap_port`` parameters, and their values
    (ValueError for a role that is not one, or a port that is not a number)."""
    base, sep, query = uri.partition("?")
    if not sep:
        return uri, BOTH, None
    params = parse_qsl(query, keep_blank_values=True)
    kept = [(k, v) for k, v in params if k not in ("role", "bootstrap_port")]
    found = dict(params)
    role = found.get("role", BOTH)
    if role not in ROLES:
        raise ValueError(f"--discover {uri!r}: role must be one of {', '.join(ROLES)}")
    port = found.get("bootstrap_port")
    if port is not None and not port.isdigit():
        raise ValueError(f"--discover {uri!r}: bootstrap_port must be a number")
    rest = base + ("?" + urlencode(kept) if kept else "")
    return rest, role, int(port) if port is not None else None


class Discovery:
    """Runs every ``--discover`` source and applies its snapshots to the fleet."""

    def __init__(self, membership: Membership, settings: Settings) -> None:
        self.membership = membership
        self.static = {url for url, _ in settings.roles()}  # never removed by a source
        self.sources = []
        self.roles: dict[str, tuple[str, int | None]] = {}  # source URI: role, bootstrap port
        for uri in settings.discover:
            rest, role, port = split_role(uri)
            source = make_source(rest, settings)
            self.sources.append(source)
            self.roles[source.uri] = (role, port)
        self.found: dict[str, frozenset[str]] = {s.uri: frozenset() for s in self.sources}
        self.joined = 0
        self.left = 0
        self._tasks: list[asyncio.Task] = []

    def apply(self, source: DiscoverySource, snapshot: frozenset[str]) -> None:
        """``source`` now sees ``snapshot``: add what is new, drain what it no longer lists."""
        pool = self.membership.pool
        before = self.found[source.uri]
        self.found[source.uri] = snapshot
        others = set().union(*(v for k, v in self.found.items() if k != source.uri))
        role, port = self.roles.get(source.uri, (BOTH, None))
        for url in sorted(snapshot - before):
            if pool.get(url) is None:
                try:
                    self.membership.add(url, role=role, bootstrap_port=port)
                except ValueError as exc:  # a URL the pool refuses: say so, keep going
                    log.warning("discovery %s: %s", source.uri, exc)
                    continue
                self.joined += 1
                log.info("discovery %s: %s joined", source.uri, url)
        for url in sorted(before - snapshot):
            if url in others or url in self.static or pool.get(url) is None:
                continue
            self.membership.remove(url)
            self.left += 1
            log.info("discovery %s: %s left (draining)", source.uri, url)

    async def _follow(self, source: DiscoverySource) -> None:
        while True:  # a source that ends or fails is restarted, never left dead
            try:
                async for snapshot in source.snapshots():
                    self.apply(source, snapshot)
            except Exception:
                log.exception("discovery %s failed; restarting it", source.uri)
            await asyncio.sleep(1.0)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow(s), name=f"discover {s.uri}") for s in self.sources
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await periodic.cancel(task)

    def describe(self) -> list[dict[str, Any]]:
        """One entry per source (``/workers/discovery``)."""
        return [
            {
                "uri": s.uri,
                "role": self.roles[s.uri][0],
                "workers": sorted(self.found[s.uri]),
                "snapshots": s.stats.snapshots,
                "errors": dict(s.stats.errors),
                "last_error": s.stats.last_error,
            }
            for s in self.sources
        ]

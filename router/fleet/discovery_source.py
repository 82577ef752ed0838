"""What a worker discovery source is (``--discover``): a stream of the whole set of workers.

A source (DNS: :mod:`router.fleet.discovery_dns`; Kubernetes EndpointSlices:
:mod:`router.fleet.discovery_k8s`) yields *snapshots*: the complete set of worker base URLs
(``http://IP:PORT``, as :func:`router.config.normalize_url` writes them) it sees now, each
time that set may have changed. The fleet (:mod:`router.fleet.discovery`) adds the URLs that
appear and drains the ones that go, through the same path as ``POST/DELETE /workers``.

Rules every source keeps, so a flaky name server or API server never empties a fleet:

- a *transient* failure (timeout, connection refused, SERVFAIL, a dropped watch, HTTP 5xx)
  yields nothing: the last snapshot stands, the source logs, counts and retries;
- only an *authoritative* answer (the name has no records; the API lists no ready endpoint)
  yields an empty set;
- the generator runs until cancelled, and closes what it opened when it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class DiscoveryStats:
    """A source's counters (shown on ``/workers``' discovery entry and in ``/metrics``)."""

    snapshots: int = 0  # snapshots yielded
    errors: dict[str, int] = field(default_factory=dict)  # transient failures by kind
    last_error: str | None = None

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = message


class DiscoverySource(Protocol):
    """One ``--discover`` URI, turned into a stream of worker sets."""

    uri: str  # the URI it was made from, for logs and /workers
    stats: DiscoveryStats

    def snapshots(self) -> AsyncIterator[frozenset[str]]:
        """Yield the full set of worker base URLs whenever it may have changed (a source may
        yield an unchanged set; the fleet ignores it). Runs until cancelled."""
        ...

"""``--discover dns://NAME:PORT`` and ``dns+srv://_SERVICE._PROTO.NAME``: workers from DNS.

A headless Kubernetes Service, a Consul DNS interface or a hand-kept zone lists a fleet as
records; this source looks the name up every ``interval_s`` and yields every worker found:

- ``dns://NAME:PORT``: each A and AAAA address of NAME is a worker at PORT (a name with only
  A or only AAAA records is normal: what exists is used);
- ``dns+srv://_SERVICE._PROTO.NAME``: each SRV target is resolved to its A/AAAA addresses, at
  the record's port. Priority and weight are ignored (every target is a worker: the router
  balances them itself); a target with no address is skipped.

``?scheme=https`` makes the URLs ``https://``. Answers are never cached here, so a change is
seen on the next look-up once the name server's own TTL lets it through. Per
:mod:`router.fleet.discovery_source`, a timeout, SERVFAIL, REFUSED or network error yields
nothing (the last list stands) and counts; only NXDOMAIN or no records yields an empty set.
A and AAAA are asked apart, and each answer stands on its own: when one family fails alone
(a server that refuses or drops AAAA queries, as some do), the name is resolved by the other,
the failed family keeps its last good addresses (none if it never had any), and the failure
is logged and counts; the look-up fails only when both families do.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import dns.asyncresolver
import dns.exception
import dns.name
import dns.resolver

from router.config import normalize_url
from router.fleet.discovery_source import DiscoveryStats

log = logging.getLogger("cache_router.discovery")

# the failures after which the last list stands (anything else from dnspython is a DNSException
# too, and is treated the same way: never empty a fleet on an answer we do not understand)
_TRANSIENT = (dns.exception.DNSException, OSError)
_FAMILIES = ("A", "AAAA")
_Known = dict[tuple[object, str], tuple[str, ...]]  # (name, family) -> its addresses


@dataclass(frozen=True)
class DnsQuery:
    """What a ``dns://`` or ``dns+srv://`` URI asks for."""

    name: str  # as written: absolute if it ends with a dot
    port: int | None  # dns://: every address's port; dns+srv://: None (from the records)
    srv: bool
    scheme: str = "http"


def parse_dns_uri(uri: str) -> DnsQuery:
    """The query a ``--discover`` URI stands for; ValueError saying what is wrong with it."""
    parts = urlsplit(uri.strip())
    if parts.scheme not in ("dns", "dns+srv"):
        raise ValueError(f"--discover {uri!r}: expected dns://NAME:PORT or dns+srv://NAME")
    srv = parts.scheme == "dns+srv"
    form = "dns+srv://_SERVICE._PROTO.NAME" if srv else "dns://NAME:PORT"
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"--discover {uri!r}: no user@ part in {form}")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"--discover {uri!r}: nothing may follow the name in {form}")
    name = parts.hostname  # lower-cased, brackets of an IPv6 literal removed
    if not name:
        raise ValueError(f"--discover {uri!r}: empty name, expected {form}")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        raise ValueError(f"--discover {uri!r}: {name} is an address, not a name (use --worker)")
    try:
        labels = dns.name.from_text(name).labels
    except dns.exception.DNSException as exc:
        raise ValueError(f"--discover {uri!r}: {name!r} is not a DNS name: {exc}") from None
    try:
        port = parts.port
    except ValueError as exc:  # "Port out of range 0-65535", "could not be cast to integer"
        raise ValueError(f"--discover {uri!r}: bad port: {exc}") from None
    if srv:
        if port is not None:
            raise ValueError(f"--discover {uri!r}: no port in {form} (the records give it)")
        # RFC 2782: without the _service._proto labels the SRV query finds nothing, silently
        if len(labels) < 4 or not (labels[0].startswith(b"_") and labels[1].startswith(b"_")):
            raise ValueError(f"--discover {uri!r}: expected {form}, e.g. _http._tcp.{name}")
    elif not port:
        raise ValueError(f"--discover {uri!r}: missing port, expected {form}")
    scheme = "http"
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key != "scheme":
            raise ValueError(f"--discover {uri!r}: unknown parameter {key!r} (only scheme=)")
        if value not in ("http", "https"):
            raise ValueError(f"--discover {uri!r}: scheme must be http or https, not {value!r}")
        scheme = value
    return DnsQuery(name=name, port=port, srv=srv, scheme=scheme)


def parse_nameserver(nameserver: str) -> tuple[str, int]:
    """``IP``, ``IP:PORT``, ``[IPv6]:PORT`` or a bare IPv6 → (address, port)."""
    text = nameserver.strip()
    host, port = text, "53"
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"nameserver {nameserver!r}: expected IP or IP:PORT")
        port = rest[1:] or port
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        address = str(ipaddress.ip_address(host))
        number = int(port)
    except ValueError:
        raise ValueError(f"nameserver {nameserver!r}: expected IP or IP:PORT") from None
    if not 0 < number < 65536:
        raise ValueError(f"nameserver {nameserver!r}: port out of range")
    return address, number


def _error_kind(exc: BaseException) -> str:
    """The ``kind`` label of a failed look-up (a small fixed set, for /metrics)."""
    if isinstance(exc, dns.exception.Timeout):
        return "timeout"
    if isinstance(exc, dns.resolver.NoNameservers):  # SERVFAIL, REFUSED, unreachable server
        return "server"
    if isinstance(exc, OSError):
        return "network"
    return "dns"


class DnsDiscovery:
    """One ``dns://`` or ``dns+srv://`` URI, looked up every ``interval_s`` seconds."""

    def __init__(self, uri: str, query: DnsQuery, interval_s: float,
                 nameserver: str | None = None, timeout_s: float = 2.0) -> None:  # fmt: skip
        self.uri = uri
        self.query = query
        self.interval_s = interval_s
        self.stats = DiscoveryStats()
        if nameserver is None:
            # the system's resolver (/etc/resolv.conf), with its search domains, as getaddrinfo
            # would: a short Kubernetes service name then works as it does in the pod
            try:
                self._resolver = dns.asyncresolver.Resolver()
            except dns.resolver.NoResolverConfiguration as exc:
                raise ValueError(f"--discover {uri!r}: {exc}; give a name server") from None
            self._search = True
        else:
            address, port = parse_nameserver(nameserver)
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [address]
            self._resolver.port = port
            self._search = False
        self._resolver.cache = None  # every look-up asks: the server's TTL is the only cache
        self._resolver.lifetime = timeout_s  # one look-up, retries included
        self._resolver.timeout = timeout_s / 2  # so a lost UDP packet is tried again once
        self._failing = False
        self._known: _Known = {}  # each family's last good answer, names of the last look-up
        self._families_failing: set[tuple[object, str]] = set()  # logged once per streak

    @classmethod
    def from_uri(cls, uri: str, interval_s: float, nameserver: str | None = None,
                 timeout_s: float = 2.0) -> DnsDiscovery:  # fmt: skip
        """The source for ``uri`` (ValueError for a bad URI or name server)."""
        return cls(uri, parse_dns_uri(uri), interval_s, nameserver, timeout_s)

    async def _family(self, name: str | dns.name.Name, rdtype: str) -> tuple[str, ...]:
        """``name``'s addresses of one family; () if it has none (an authoritative answer)."""
        try:
            answer = await self._resolver.resolve(name, rdtype, search=self._search)
        except dns.resolver.NoAnswer:
            return ()
        return tuple(record.address for record in answer)

    async def _addresses(self, name: str | dns.name.Name, fresh: _Known) -> list[str]:
        """The A and AAAA addresses of ``name``, each family's answer on its own; one that
        fails alone keeps its last good addresses (each family's, into ``fresh``), unless
        the name does not exist (NXDOMAIN). Raises when both fail."""
        answers = await asyncio.gather(
            *(self._family(name, rdtype) for rdtype in _FAMILIES), return_exceptions=True
        )
        gone = any(isinstance(a, dns.resolver.NXDOMAIN) for a in answers)
        found: list[str] = []
        failed: list[tuple[str, BaseException]] = []
        for rdtype, answer in zip(_FAMILIES, answers, strict=True):
            if isinstance(answer, dns.resolver.NXDOMAIN):
                answer = ()
            elif isinstance(answer, _TRANSIENT):
                failed.append((rdtype, answer))
                continue
            elif isinstance(answer, BaseException):  # a bug, or cancelled: not a DNS answer
                raise answer
            self._family_answered(name, rdtype)
            fresh[name, rdtype] = answer
            found.extend(answer)
        if len(failed) == len(_FAMILIES):
            raise failed[0][1]
        for rdtype, exc in failed:
            kept = () if gone else self._known.get((name, rdtype), ())
            fresh[name, rdtype] = kept
            found.extend(kept)
            self._family_failed(name, rdtype, exc, len(kept))
        return found

    async def resolve(self) -> frozenset[str]:
        """Every worker URL the records list now; raises a transient failure as is."""
        fresh: _Known = {}
        urls = await self._resolve(fresh)
        self._known = fresh  # the names looked up now: a target gone from SRV is forgotten
        self._families_failing &= fresh.keys()
        return urls

    async def _resolve(self, fresh: _Known) -> frozenset[str]:
        q = self.query
        if not q.srv:
            addresses = await self._addresses(q.name, fresh)
            return frozenset(_url(q.scheme, a, q.port) for a in addresses)
        try:
            answer = await self._resolver.resolve(q.name, "SRV", search=self._search)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return frozenset()
        urls: set[str] = set()
        for record in answer:
            if record.target == dns.name.root:  # "." : the service is explicitly not offered
                continue
            addresses = await self._addresses(record.target, fresh)
            urls.update(_url(q.scheme, a, record.port) for a in addresses)
        return frozenset(urls)

    async def snapshots(self) -> AsyncIterator[frozenset[str]]:
        """Look up, yield, sleep ``interval_s``; a failed look-up yields nothing."""
        while True:
            try:
                urls = await self.resolve()
            except _TRANSIENT as exc:
                self._failed(exc)
            else:
                if self._failing:
                    self._failing = False
                    log.info("discovery %s: resolving again (%d workers)", self.uri, len(urls))
                self.stats.snapshots += 1
                yield urls
            await asyncio.sleep(self.interval_s)

    def _count(self, exc: BaseException) -> str:
        """Count a failure under its kind; its message."""
        kind = _error_kind(exc)
        message = f"{kind}: {exc or type(exc).__name__}"
        self.stats.error(kind, message)
        return message

    def _failed(self, exc: BaseException) -> None:
        message = self._count(exc)
        if not self._failing:  # once per streak, not every interval
            self._failing = True
            log.warning(
                "discovery %s: %s; keeping the last list, retrying every %g s",
                self.uri, message, self.interval_s,
            )  # fmt: skip

    def _family_failed(self, name: object, rdtype: str, exc: BaseException, kept: int) -> None:
        """One family of ``name`` failed, the other answered: counted, logged once a streak."""
        message = self._count(exc)
        if (name, rdtype) not in self._families_failing:
            self._families_failing.add((name, rdtype))
            log.warning(
                "discovery %s: %s; %s resolved by its other family, keeping its last %d %s "
                "addresses", self.uri, message, name, kept, rdtype,
            )  # fmt: skip

    def _family_answered(self, name: object, rdtype: str) -> None:
        if (name, rdtype) in self._families_failing:
            self._families_failing.discard((name, rdtype))
            log.info("discovery %s: %s %s answered again", self.uri, name, rdtype)


def _url(scheme: str, address: str, port: int | None) -> str:
    host = f"[{address}]" if ":" in address else address
    return normalize_url(f"{scheme}://{host}:{port}")

"""DNS discovery (router/fleet/discovery_dns.py) against a real dnsmasq on 127.0.0.1: A, AAAA
and SRV records become worker URLs, changes show within two intervals, NXDOMAIN empties the
list, and a stopped or refusing server yields nothing (the last list stands) until it is back.
A server that answers A but refuses or drops AAAA (or the reverse) resolves the name by the
family that answers; the failing one keeps its last good addresses, and counts.

The tests skip without dnsmasq, unless ``CACHE_ROUTER_DNS=1`` (set by CI), where they fail.
dnsmasq re-reads ``--addn-hosts`` on SIGHUP but not the ``srv-host=`` lines of its config
file, so an SRV change restarts it (same port).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import dns.exception
import dns.resolver
import pytest
from dns_support import Dnsmasq

from router.fleet.discovery_dns import DnsDiscovery, DnsQuery, parse_dns_uri, parse_nameserver

INTERVAL = 0.2
TIMEOUT = 0.2  # per look-up, so an outage round is short
WAIT = 3.0  # the most any one snapshot may take to come


@pytest.fixture
def dnsmasq(tmp_path) -> Iterator[Dnsmasq]:
    server = Dnsmasq(tmp_path)
    yield server
    server.stop()


class Feed:
    """A source's snapshots, read by a background task (so that waiting for one with a
    timeout never cancels the generator itself)."""

    def __init__(self, source: DnsDiscovery) -> None:
        self.source = source
        self.queue: asyncio.Queue[frozenset[str] | BaseException] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            async for snapshot in self.source.snapshots():
                self.queue.put_nowait(snapshot)
        except Exception as exc:  # surfaced by next()
            self.queue.put_nowait(exc)

    async def next(self, timeout: float = WAIT) -> frozenset[str]:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def drain(self) -> list[frozenset[str]]:
        items = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, BaseException):
                raise item
            items.append(item)
        return items


@contextlib.asynccontextmanager
async def follow(uri: str, server: Dnsmasq) -> AsyncIterator[Feed]:
    source = DnsDiscovery.from_uri(uri, INTERVAL, nameserver=server.nameserver, timeout_s=TIMEOUT)
    feed = Feed(source)
    try:
        yield feed
    finally:
        feed.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(feed.task, WAIT)


async def within_two(feed: Feed, wanted: frozenset[str]) -> None:
    """After a change: the next snapshot may have been resolved before it, the second not."""
    feed.drain()
    seen = [await feed.next(), await feed.next()]
    assert wanted in seen, seen


async def test_a_records(dnsmasq):
    dnsmasq.set_hosts("10.0.0.1 workers.test", "10.0.0.2 workers.test", "10.0.0.3 other.test")
    dnsmasq.start()
    async with follow("dns://workers.test:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
        assert await feed.next() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
        assert feed.source.stats.snapshots >= 2
        assert feed.source.stats.errors == {}
    async with follow("dns://Workers.test.:8443?scheme=https", dnsmasq) as feed:
        assert await feed.next() == {"https://10.0.0.1:8443", "https://10.0.0.2:8443"}


async def test_record_added_then_removed_within_two_intervals(dnsmasq):
    dnsmasq.set_hosts("10.0.0.1 workers.test")
    dnsmasq.start()
    async with follow("dns://workers.test:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://10.0.0.1:8000"}
        dnsmasq.set_hosts("10.0.0.1 workers.test", "10.0.0.2 workers.test")
        await within_two(feed, frozenset({"http://10.0.0.1:8000", "http://10.0.0.2:8000"}))
        dnsmasq.set_hosts("10.0.0.2 workers.test")
        await within_two(feed, frozenset({"http://10.0.0.2:8000"}))


async def test_aaaa_alone_and_with_a(dnsmasq):
    dnsmasq.set_hosts("fd00::1 v6.test", "fd00::2 both.test", "10.0.0.9 both.test")
    dnsmasq.start()
    async with follow("dns://v6.test:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://[fd00::1]:8000"}
    async with follow("dns://both.test:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://[fd00::2]:8000", "http://10.0.0.9:8000"}
        assert feed.source.stats.errors == {}


async def test_srv_targets_ports_and_restart(dnsmasq):
    srv = "_vllm._tcp.fleet.test"
    dnsmasq.set_hosts("10.0.1.1 t1.test", "fd00::11 t1.test", "10.0.1.2 t2.test")
    dnsmasq.set_srv((srv, "t1.test", 8001), (srv, "t2.test", 8002), (srv, "gone.test", 8003))
    dnsmasq.start()
    async with follow(f"dns+srv://{srv}", dnsmasq) as feed:
        # gone.test resolves to nothing: skipped, not an error
        assert await feed.next() == {
            "http://10.0.1.1:8001",
            "http://[fd00::11]:8001",
            "http://10.0.1.2:8002",
        }
        assert feed.source.stats.errors == {}
        # srv-host= lines are not re-read on SIGHUP: a restart (same port) picks them up
        dnsmasq.set_srv((srv, "t2.test", 9002))
        dnsmasq.restart()
        await within_two(feed, frozenset({"http://10.0.1.2:9002"}))


async def test_nxdomain_and_no_records_are_empty(dnsmasq):
    dnsmasq.set_hosts("10.0.0.1 workers.test")
    dnsmasq.start()
    for uri in ("dns://nope.test:8000", "dns+srv://_vllm._tcp.nope.test",
                "dns+srv://_vllm._tcp.workers.test"):  # fmt: skip
        async with follow(uri, dnsmasq) as feed:
            assert await feed.next() == frozenset(), uri
            assert feed.source.stats.errors == {}
    async with follow("dns://workers.test:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://10.0.0.1:8000"}
        dnsmasq.set_hosts()  # the name is gone: an authoritative empty list
        await within_two(feed, frozenset())


async def test_many_records_come_whole_over_tcp(dnsmasq):
    # 300 A records do not fit a 512-byte UDP answer: truncated, then asked again over TCP
    addresses = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(300)]
    dnsmasq.set_hosts(*(f"{a} big.test" for a in addresses))
    dnsmasq.start()
    async with follow("dns://big.test:8000", dnsmasq) as feed:
        assert await feed.next() == {f"http://{a}:8000" for a in addresses}


async def test_outage_keeps_the_last_list_then_recovers(dnsmasq, caplog):
    caplog.set_level(logging.INFO, logger="cache_router.discovery")
    dnsmasq.set_hosts("10.0.0.1 workers.test", "10.0.0.2 workers.test")
    dnsmasq.start()
    before = frozenset({"http://10.0.0.1:8000", "http://10.0.0.2:8000"})
    async with follow("dns://workers.test:8000", dnsmasq) as feed:
        assert await feed.next() == before
        dnsmasq.stop()
        assert all(s == before for s in feed.drain())  # resolved before the stop, if any
        with pytest.raises(TimeoutError):  # about 3 failed rounds: nothing yielded
            await feed.next(timeout=6 * INTERVAL)
        stats = feed.source.stats
        assert stats.errors.get("timeout", 0) >= 2, stats.errors
        assert stats.last_error and stats.last_error.startswith("timeout")
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # once per outage, not every interval
        dnsmasq.set_hosts("10.0.0.2 workers.test")
        dnsmasq.start()
        assert await feed.next() == {"http://10.0.0.2:8000"}
        assert any("resolving again" in r.getMessage() for r in caplog.records)


async def test_refused_is_transient(dnsmasq):
    dnsmasq.start()  # no upstream: a name outside .test is REFUSED
    async with follow("dns://workers.example:8000", dnsmasq) as feed:
        with pytest.raises(TimeoutError):
            await feed.next(timeout=3 * INTERVAL)
        assert feed.source.stats.errors.get("server", 0) >= 1, feed.source.stats.errors
        assert feed.source.stats.snapshots == 0


# dnsmasq answers .test from its files only; a name elsewhere is answered from the hosts file
# when it lists that family, else forwarded: with no upstream, REFUSED (as the repro's server)


async def test_aaaa_refused_keeps_the_a_answer(dnsmasq, caplog):
    caplog.set_level(logging.INFO, logger="cache_router.discovery")
    srv = "_vllm._tcp.fleet.test"
    dnsmasq.set_hosts("10.0.0.1 w.example", "10.0.1.1 t1.example")
    dnsmasq.set_srv((srv, "t1.example", 8001))
    dnsmasq.start()
    async with follow("dns://w.example:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://10.0.0.1:8000"}
        assert await feed.next() == {"http://10.0.0.1:8000"}
        stats = feed.source.stats
        assert stats.errors.get("server", 0) >= 2, stats.errors  # counted every time
        assert "AAAA" in (stats.last_error or "") and "REFUSED" in (stats.last_error or "")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "AAAA" in warnings[0], warnings  # once per streak
    async with follow(f"dns+srv://{srv}", dnsmasq) as feed:  # an SRV target's too
        assert await feed.next() == {"http://10.0.1.1:8001"}


async def test_a_failing_family_keeps_its_last_addresses(dnsmasq, caplog):
    caplog.set_level(logging.INFO, logger="cache_router.discovery")
    dnsmasq.set_hosts("10.0.0.1 w.example", "fd00::1 w.example")
    dnsmasq.start()
    async with follow("dns://w.example:8000", dnsmasq) as feed:
        assert await feed.next() == {"http://10.0.0.1:8000", "http://[fd00::1]:8000"}
        assert feed.source.stats.errors == {}
        # AAAA now refused: its last answer stands, the A change shows
        dnsmasq.set_hosts("10.0.0.1 w.example", "10.0.0.2 w.example")
        both_a = {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
        await within_two(feed, frozenset({*both_a, "http://[fd00::1]:8000"}))
        # A refused and AAAA back: the reverse
        dnsmasq.set_hosts("fd00::2 w.example")
        await within_two(feed, frozenset({*both_a, "http://[fd00::2]:8000"}))
        # both answer again: exactly what they list
        dnsmasq.set_hosts("10.0.0.3 w.example", "fd00::3 w.example")
        await within_two(feed, frozenset({"http://10.0.0.3:8000", "http://[fd00::3]:8000"}))
    assert any("answered again" in r.getMessage() for r in caplog.records)


async def test_aaaa_dropped_keeps_the_a_answer(dnsmasq):
    # AAAA of .example goes to a server that never answers: the query times out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        dnsmasq.conf.write_text(f"server=/example/127.0.0.1#{silent.getsockname()[1]}\n")
        dnsmasq.set_hosts("10.0.0.1 w.example")
        dnsmasq.start()
        async with follow("dns://w.example:8000", dnsmasq) as feed:
            assert await feed.next() == {"http://10.0.0.1:8000"}
            stats = feed.source.stats
            assert stats.errors.get("timeout", 0) >= 1, stats.errors
            assert stats.snapshots >= 1


class _Answers:
    """A resolver stub: per family, addresses or the exception dnspython would raise."""

    def __init__(self, **answers) -> None:
        self.answers = answers

    async def resolve(self, name, rdtype, search=False):
        answer = self.answers[rdtype]
        if isinstance(answer, BaseException):
            raise answer
        return [type("Record", (), {"address": a})() for a in answer]


async def test_nxdomain_drops_a_failing_familys_last_addresses():
    source = DnsDiscovery.from_uri("dns://w.test:8000", INTERVAL, nameserver="127.0.0.1:1")
    source._resolver = _Answers(A=["10.0.0.1"], AAAA=["fd00::1"])
    assert await source.resolve() == {"http://10.0.0.1:8000", "http://[fd00::1]:8000"}
    source._resolver = _Answers(A=["10.0.0.1"], AAAA=dns.exception.Timeout())
    assert await source.resolve() == {"http://10.0.0.1:8000", "http://[fd00::1]:8000"}
    source._resolver = _Answers(A=dns.resolver.NXDOMAIN(), AAAA=dns.exception.Timeout())
    assert await source.resolve() == frozenset()  # the name is gone: nothing kept
    source._resolver = _Answers(A=dns.exception.Timeout(), AAAA=dns.exception.Timeout())
    with pytest.raises(dns.exception.Timeout):  # both fail: the look-up fails
        await source.resolve()
    source._resolver = _Answers(A=["10.0.0.1"], AAAA=RuntimeError("a bug"))
    with pytest.raises(RuntimeError):  # not a DNS failure: never taken for one
        await source.resolve()
    # each family that failed alone counted (the whole failure counts in snapshots())
    assert source.stats.errors == {"timeout": 2}


def test_parse_dns_uri():
    assert parse_dns_uri("dns://workers.test:8000") == DnsQuery("workers.test", 8000, srv=False)
    assert parse_dns_uri(" dns://W.Test.:1?scheme=https ") == DnsQuery(
        "w.test.", 1, srv=False, scheme="https"
    )
    assert parse_dns_uri("dns+srv://_vllm._tcp.w.test") == DnsQuery(
        "_vllm._tcp.w.test", None, srv=True
    )
    assert parse_nameserver("10.0.0.53") == ("10.0.0.53", 53)
    assert parse_nameserver("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_nameserver("[::1]:5353") == ("::1", 5353)
    assert parse_nameserver("fd00::53") == ("fd00::53", 53)


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("dns://workers.test", "missing port"),
        ("dns://workers.test:0", "missing port"),
        ("dns://:8000", "empty name"),
        ("dns://", "empty name"),
        ("dns://workers.test:99999", "bad port"),
        ("dns://workers.test:http", "bad port"),
        ("dns://10.0.0.1:8000", "is an address"),
        ("dns://[fd00::1]:8000", "is an address"),
        ("dns://a..b:8000", "not a DNS name"),
        ("dns://user@workers.test:8000", "no user@"),
        ("dns://workers.test:8000/v1", "nothing may follow"),
        ("dns://workers.test:8000?scheme=ftp", "http or https"),
        ("dns://workers.test:8000?port=1", "unknown parameter"),
        ("dns+srv://workers.test", "_SERVICE._PROTO"),
        ("dns+srv://_vllm._tcp.workers.test:8000", "no port"),
        ("http://workers.test:8000", "expected dns://"),
    ],
)
def test_bad_uri(uri, says):
    with pytest.raises(ValueError, match=says):
        DnsDiscovery.from_uri(uri, INTERVAL)


@pytest.mark.parametrize("nameserver", ["localhost", "127.0.0.1:x", "127.0.0.1:70000", "[::1"])
def test_bad_nameserver(nameserver):
    with pytest.raises(ValueError, match="nameserver"):
        DnsDiscovery.from_uri("dns://workers.test:8000", INTERVAL, nameserver=nameserver)

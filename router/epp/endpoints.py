"""The ``ip:port`` a gateway sends each worker's requests to.

The Endpoint Picker Protocol names an endpoint by address (``x-gateway-destination-endpoint:
ip:port``): Envoy's original-destination cluster parses the header as an IP address and
answers 503 "no healthy upstream" for anything else. Workers may be named by host name
(``http://vllm-0.vllm:8000``, a compose service, ``localhost``), so host names are resolved
here, off the request path: once before the picker serves, for each worker first seen since
(in the background: until its name resolves, the worker is not picked), and again every
``interval_s`` (a pod behind a name moves). Workers found by ``--discover`` come as addresses
already.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable

from router.fleet import periodic
from router.fleet.pool import Worker, WorkerPool

log = logging.getLogger("cache_router.epp")


def address(host: str, port: int) -> str | None:
    """``ip:port`` (``[ip]:port`` for IPv6) when ``host`` is an IP address, else None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def literal(worker: Worker) -> str | None:
    """``worker``'s address when its URL names an IP address (no lookup needed), else None."""
    return address(worker.upstream.host, worker.upstream.port)


class Endpoints:
    """Each worker's address for the gateway, host names resolved in the background."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._by_url: dict[str, str] = {}
        self._resolving: dict[str, asyncio.Task] = {}

    def of(self, worker: Worker) -> str | None:
        """``ip:port`` of ``worker``; None while its host name has not resolved (it is being
        resolved now)."""
        found = self._by_url.get(worker.url)
        if found is None:
            found = literal(worker)
            if found is not None:
                self._by_url[worker.url] = found
            elif worker.url not in self._resolving:
                task = asyncio.get_running_loop().create_task(self._resolve(worker))
                self._resolving[worker.url] = task
        return found

    async def _resolve(self, worker: Worker) -> None:
        url, host, port = worker.url, worker.upstream.host, worker.upstream.port
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
            # IPv4 first where a name has both (Envoy's V4_PREFERRED): servers often
            # listen on 0.0.0.0 only, and "localhost" lists ::1 first
            infos.sort(key=lambda info: info[0] != socket.AF_INET)
            resolved = address(str(infos[0][4][0]), port) if infos else None
            if resolved is None:
                raise OSError("no address")
            if self._by_url.get(url) != resolved:
                log.info("worker %s is %s for the gateway", url, resolved)
            self._by_url[url] = resolved
        except OSError as exc:
            log.warning("worker %s: cannot resolve %s (%s); not picked until it does",
                        url, host, exc)  # fmt: skip
        finally:
            self._resolving.pop(url, None)

    async def refresh(self, workers: Iterable[Worker]) -> None:
        """Resolve every worker's host name again; forget the workers that left."""
        workers = list(workers)
        urls = {w.url for w in workers}
        for url in [u for u in self._by_url if u not in urls]:
            del self._by_url[url]
        named = [w for w in workers if literal(w) is None and w.url not in self._resolving]
        await asyncio.gather(*(self._resolve(w) for w in named))

    async def run(self, pool: WorkerPool) -> None:
        """:meth:`refresh` the pool's workers every ``interval_s`` from one interval on (the
        first refresh is the caller's, before serving), until cancelled."""
        await asyncio.sleep(self.interval_s)
        await periodic.every(self.interval_s, lambda: self.refresh(pool.workers), log,
                             "resolving the workers' host names")  # fmt: skip

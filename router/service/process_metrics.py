"""``/metrics`` under ``serve --processes N``: whichever process a scrape reaches answers for all.

Each process keeps its own counters, and SO_REUSEPORT hands a scrape to one of them at random,
so a per-process ``/metrics`` would make every counter jump between the processes' values
(``rate()`` would read each jump down as a reset). With ``--processes`` each child also
listens on a private unix socket in the supervisor's run folder (``--process-socket
DIR/K.sock``). The process a scrape reaches asks its siblings there for their own exposition
(``GET /metrics?scope=process``) and answers with every process's samples, each labelled
``process="K"``: the slot, stable across restarts, the way a pod label tells replicas apart
(aggregate with ``sum by (...)``). A sibling that does not answer within a second (being
restarted) is left out of that scrape; ``cache_router_metrics_processes`` says how many
answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

LABEL = "process"
SIBLING_TIMEOUT_S = 1.0
REQUEST = b"GET /metrics?scope=process HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"


async def fetch_own(path: Path, timeout: float = SIBLING_TIMEOUT_S) -> str | None:
    """One sibling's own exposition over its unix socket (None: it did not answer)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(REQUEST)
            response = await reader.read()
    except (OSError, TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    return body.decode(errors="replace")


class _Merged(Collector):
    """Every process's families, samples relabelled, one family per name."""

    def __init__(self, expositions: dict[str, str]) -> None:
        self.expositions = expositions

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for process, text in self.expositions.items():
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(
                    s._replace(labels={**s.labels, LABEL: process}) for s in family.samples
                )
        yield from families.values()
        answered = GaugeMetricFamily(
            "cache_router_metrics_processes",
            "router processes whose metrics this scrape holds (serve --processes)",
        )
        answered.add_metric([], len(self.expositions))
        yield answered


async def gather(own_socket: Path, own: bytes) -> bytes:
    """The exposition of every process whose socket is beside ``own_socket``."""
    siblings = sorted(p for p in own_socket.parent.glob("*.sock") if p != own_socket)
    texts = await asyncio.gather(*(fetch_own(p) for p in siblings))
    expositions = {own_socket.stem: own.decode()}
    expositions |= {
        p.stem: text for p, text in zip(siblings, texts, strict=True) if text is not None
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(dict(sorted(expositions.items()))))
    return generate_latest(registry)

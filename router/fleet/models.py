"""Which models each worker serves: its ``GET /v1/models``, read periodically.

vLLM lists its served model names and every LoRA adapter loaded (at start with
``--lora-modules`` or later through ``/v1/load_lora_adapter``), an adapter with ``parent``
set to its base model; SGLang lists its served model (and its adapters, likewise). The pool
routes a request naming a model only to the workers that list it
(:meth:`router.fleet.pool.WorkerPool.views_for`), and keeps adapters' prefix caches apart.

A worker is read when it joins, then every ``models_interval_s``. A failed read (down, no
such endpoint, bad JSON) keeps what was known, so a flaky worker never loses its models; a
worker never read serves any model until it answers. Workers pinned with ``--worker-models``
are not read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from router.fleet import periodic
from router.fleet.pool import Worker, WorkerPool
from router.fleet.upstream import UpstreamError

log = logging.getLogger("cache_router.models")

MODELS_PATH = "/v1/models"


def parse_models(body: bytes) -> tuple[frozenset[str], frozenset[str]] | None:
    """(every model id, the adapters among them) of a ``/v1/models`` answer; None if it is
    not an OpenAI model list."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    models: set[str] = set()
    adapters: set[str] = set()
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        models.add(item["id"])
        if item.get("parent"):
            adapters.add(item["id"])
    return frozenset(models), frozenset(adapters)


class ModelsWatcher:
    """Reads every (unpinned) worker's model list in one background task."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        s = pool.settings
        self.interval = s.models_interval_s
        self.timeout = s.health_timeout_s
        self._task: asyncio.Task | None = None
        self._kicks: set[asyncio.Task] = set()

    async def read(self, worker: Worker) -> bool:
        """Read ``worker``'s list into the pool; True if it answered one."""
        if worker.models_pinned or worker.removed:
            return False
        try:
            status, body = await asyncio.wait_for(
                worker.upstream.fetch("GET", MODELS_PATH, timeout=self.timeout), self.timeout
            )
        except (UpstreamError, TimeoutError):
            return False
        parsed = parse_models(body) if status == 200 else None
        if parsed is None:
            log.debug("worker %s: no model list (HTTP %d)", worker.url, status)
            return False
        if not worker.removed:
            self.pool.set_models(worker, *parsed)
        return True

    async def read_all(self) -> None:
        workers = [w for w in self.pool.workers if not w.models_pinned]
        if workers:
            await asyncio.gather(*(self.read(w) for w in workers))

    def kick(self, worker: Worker) -> None:
        """Read ``worker`` now (it just joined or came back), without waiting for the round."""
        if self._task is None or worker.models_pinned:
            return
        task = asyncio.get_running_loop().create_task(self.read(worker))
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                periodic.every(self.interval, self.read_all, log, "model list round")
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        await periodic.cancel(task)
        for kick in list(self._kicks):
            kick.cancel()

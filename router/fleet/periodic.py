"""The loop and shutdown shared by the router's background tasks (health, worker metrics,
KV events): run a round every interval, never let one failed round stop the loop, and cancel
cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


async def every(interval: float, round_: Callable[[], Awaitable[None]], log: logging.Logger,
                what: str) -> None:  # fmt: skip
    """Await ``round_()`` forever, ``interval`` seconds apart, logging (not raising) failures."""
    while True:
        try:
            await round_()
        except Exception:  # never let one bad round stop the loop
            log.exception("%s failed", what)
        await asyncio.sleep(interval)


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

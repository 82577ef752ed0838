"""Which worker stored each Responses API response: the one that can continue it.

vLLM keeps stored responses in its serving process's memory (a dict per server), so a request
with ``previous_response_id``, and every call on a response id (retrieve, cancel, input items,
delete), must reach the worker that made it: any other answers 404. The router learns the
owner from the responses it forwards (the ``id`` of a non-streamed body, the
``response.created`` event of a stream) and keeps the newest ``capacity`` of them here.

With ``--processes`` or ``--state-url`` the replicas share the map through Redis
(:class:`~router.fleet.state_sync.StateSync`): a response learned on one replica is written
to the shared state at once, and an id this replica does not know is looked up there before
the router calls it unknown.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class SharedOwners(Protocol):
    """The shared side (StateSync): write an owner out, look one up."""

    def share_owner(self, response_id: str, url: str) -> None: ...

    async def owner_of(self, response_id: str) -> str | None: ...


class ResponseOwners:
    """Response id → the URL of the worker that stored it, newest ``capacity`` kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()
        self.shared: SharedOwners | None = None
        self.learned = 0  # responses whose owner was learned here
        self.lookups: dict[str, int] = {}  # result -> count: local, shared, unknown

    def __len__(self) -> int:
        return len(self._owners)

    def learn(self, response_id: str, url: str) -> None:
        """``url``'s worker stored ``response_id`` (and tell the other replicas)."""
        self._remember(response_id, url)
        self.learned += 1
        if self.shared is not None:
            self.shared.share_owner(response_id, url)

    async def owner(self, response_id: str) -> str | None:
        """The owner's URL: this replica's map, else the shared state; None if unknown."""
        url = self._owners.get(response_id)
        if url is not None:
            self._owners.move_to_end(response_id)
            self._count("local")
            return url
        if self.shared is not None:
            url = await self.shared.owner_of(response_id)
            if url is not None:
                self._remember(response_id, url)
                self._count("shared")
                return url
        self._count("unknown")
        return None

    def _remember(self, response_id: str, url: str) -> None:
        owners = self._owners
        owners[response_id] = url
        owners.move_to_end(response_id)
        while len(owners) > self.capacity:
            owners.popitem(last=False)

    def _count(self, result: str) -> None:
        self.lookups[result] = self.lookups.get(result, 0) + 1

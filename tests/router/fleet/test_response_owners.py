"""Who stored each Responses API response: the newest kept, look-ups counted, and the
shared side asked for an id this replica does not know."""

from __future__ import annotations

from router.fleet.response_owners import ResponseOwners


class Shared:
    """The shared side as StateSync offers it (its Redis side: test_state_sync.py)."""

    def __init__(self) -> None:
        self.written: dict[str, str] = {}

    def share_owner(self, response_id: str, url: str) -> None:
        self.written[response_id] = url

    async def owner_of(self, response_id: str) -> str | None:
        return self.written.get(response_id)


async def test_the_newest_are_kept_and_lookups_counted() -> None:
    owners = ResponseOwners(capacity=2)
    owners.learn("resp_1", "http://a")
    owners.learn("resp_2", "http://b")
    assert await owners.owner("resp_1") == "http://a"  # now the most recent
    owners.learn("resp_3", "http://c")
    assert len(owners) == 2
    assert await owners.owner("resp_2") is None  # the oldest went
    assert await owners.owner("resp_1") == "http://a"
    assert owners.lookups == {"local": 2, "unknown": 1} and owners.learned == 3


async def test_an_unknown_id_is_asked_of_the_shared_state() -> None:
    shared = Shared()
    here, there = ResponseOwners(10), ResponseOwners(10)
    here.shared = there.shared = shared
    there.learn("resp_x", "http://w1")
    assert shared.written == {"resp_x": "http://w1"}
    assert await here.owner("resp_x") == "http://w1"
    assert await here.owner("resp_x") == "http://w1"
    assert here.lookups == {"shared": 1, "local": 1}
    assert await here.owner("resp_y") is None and here.lookups["unknown"] == 1

"""Which request on a worker will compute each block: the first registered, until it is
removed; a lookup by the last block of an estimated hit."""

from __future__ import annotations

from router.core.prefix_owners import Claim, PrefixOwners, owner_key


def test_the_first_owner_of_a_block_answers_until_it_is_removed():
    owners = PrefixOwners()
    first = Claim(500, [1, 2, 3])
    second = Claim(100, [1, 2, 3, 4])  # shares 1-3: the first computes them
    owners.add("w", first)
    owners.add("w", second)
    assert owners.after("w", [1, 2, 3, 4, 5], hit_blocks=3) == 500
    assert owners.after("w", [1, 2, 3, 4, 5], hit_blocks=4) == 100  # block 4 is the second's
    assert owners.after("w", [1, 2, 3], hit_blocks=9) == 500  # a hit past the list: its end
    assert owners.after("w", [1, 2], hit_blocks=0) is None
    assert owners.after("v", [1, 2], hit_blocks=2) is None  # per worker
    assert owners.after("w", [], hit_blocks=1) is None
    owners.remove("w", first)
    assert owners.after("w", [1, 2, 3], hit_blocks=3) is None  # computed (or on its way)
    assert len(owners) == 1
    owners.remove("w", first)  # twice: nothing more
    owners.remove("w", second)
    assert len(owners) == 0 and owners.after("w", [1, 2, 3, 4], hit_blocks=4) is None


def test_the_highest_owner_key_over_registries():
    held, queued = PrefixOwners(), PrefixOwners()
    held.add("w", Claim(300, [1, 2]))
    queued.add("w", Claim(700, [1, 2]))
    assert owner_key((held, None, queued), "w", [1, 2, 3], 2) == 700
    assert owner_key((held,), "w", [1, 2, 3], 2) == 300
    assert owner_key((None,), "w", [1, 2, 3], 2) is None

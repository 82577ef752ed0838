import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from router.cache.block_hash import chain_ids, hash_blocks, token_bytes


def reference_hashes(tokens: list[int], block_size: int, root: int = 0) -> list[int]:
    """Per-block, per-token reference: obviously right, obviously slow."""
    out, parent = [], root
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        data = b"".join(t.to_bytes(4, "little") for t in block)
        parent = xxhash.xxh3_64_intdigest(data, seed=parent)
        out.append(parent)
    return out


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=200),
    st.integers(1, 40),
    st.integers(0, 2**64 - 1),
)
def test_matches_reference(tokens, block_size, root):
    assert hash_blocks(tokens, block_size, root) == reference_hashes(tokens, block_size, root)


def test_only_full_blocks_and_all_input_types_agree():
    tokens = list(range(1000, 1000 + 3 * 512 + 100))
    hashes = hash_blocks(tokens)
    assert len(hashes) == 3
    assert hash_blocks(np.array(tokens, dtype=np.int64)) == hashes
    assert hash_blocks(np.array(tokens, dtype=np.uint32)) == hashes
    assert hash_blocks(token_bytes(tokens)) == hashes
    assert hash_blocks(tokens[:511]) == []


def test_chaining_makes_hash_depend_on_whole_prefix():
    a = [1] * 512 + [2] * 512
    b = [3] * 512 + [2] * 512  # same second block, different first block
    assert hash_blocks(a)[1] != hash_blocks(b)[1]
    assert hash_blocks(a)[0] == hash_blocks(a + [9] * 512)[0]
    assert hash_blocks(a, root=7) != hash_blocks(a)


@pytest.mark.parametrize("bad", [[-1], [2**32], ["x"], [1.5]])
def test_rejects_ids_that_are_not_uint32(bad):
    with pytest.raises(ValueError):
        token_bytes(bad)


def test_rejects_bad_buffer_and_block_size():
    with pytest.raises(ValueError):
        token_bytes(b"\x00\x01\x02")
    with pytest.raises(ValueError):
        hash_blocks([1, 2], block_size=0)


def test_chain_ids_groups_and_chains():
    ids = list(range(20))
    keys = chain_ids(ids, ids_per_block=8)
    assert len(keys) == 2  # 16 of 20 ids form full groups
    other = chain_ids([99, *ids[1:]], ids_per_block=8)
    assert other[0] != keys[0] and other[1] != keys[1]  # a changed first id changes every key
    assert chain_ids(ids[:16], 8) == keys
    assert chain_ids(ids, 8, root=1) != keys
    assert len(chain_ids([5, 6, 7])) == 3

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from traces.trace.blocks import PrefixKeyer, block_keys, scope_root
from traces.trace.record import TraceFormatError


def reference_keys(ids: list[int], group: int, root: int) -> list[int]:
    """The documented scheme, written out independently of router.cache.block_hash."""
    keys, parent = [], root
    for i in range(0, len(ids) - group + 1, group):
        parent = xxhash.xxh3_64_intdigest(
            np.asarray(ids[i : i + group], dtype="<u8").tobytes(), seed=parent
        )
        keys.append(parent)
    return keys


def test_512_token_ids_pass_through_chained_all_kept() -> None:
    ids = [0, 5, 9]
    keys = block_keys(ids, 512, input_length=1100)  # 3 ids, the last a partial block: kept
    assert list(keys) == reference_keys(ids, 1, 0)
    assert len(set(keys)) == 3


def test_rechunk_64_token_ids_into_512_token_keys() -> None:
    ids = list(range(1, 18))  # 17 ids of 64 tokens: two full groups of 8
    keys = block_keys(ids, 64, input_length=17 * 64)
    assert list(keys) == reference_keys(ids[:16], 8, 0)


def test_only_whole_512_token_blocks_of_the_prompt_become_keys() -> None:
    ids = list(range(40))  # 40 ids of 16 tokens = one full group of 32 ...
    assert len(block_keys(ids, 16, input_length=640)) == 1
    assert block_keys(ids, 16, input_length=500) == ()  # ... but the prompt is shorter


def test_keys_are_prefix_chained() -> None:
    a = block_keys([1, 2, 3], 512, 1536)
    b = block_keys([1, 2, 4], 512, 1536)
    c = block_keys([9, 2, 3], 512, 1536)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(a) & set(c)  # same ids 2, 3 after a different first block: other keys


def test_scope_separates_equal_local_ids() -> None:
    ids = list(range(16))
    one = block_keys(ids, 64, 1024, scope_root("trace_0001.json"))
    two = block_keys(ids, 64, 1024, scope_root("trace_0002.json"))
    assert not set(one) & set(two)
    assert scope_root("") == 0


@pytest.mark.parametrize("size", [0, 48, 1024, -64])
def test_block_size_must_divide_512(size: int) -> None:
    with pytest.raises(TraceFormatError, match="must divide"):
        block_keys([1, 2], size, 1024)


def test_negative_ids_are_a_format_error() -> None:
    with pytest.raises(TraceFormatError, match="hash_ids"):
        block_keys([1, -2], 512, 1024)


@given(
    st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=40), min_size=1, max_size=8),
    st.sampled_from([512, 64, 16]),
)
def test_prefix_keyer_matches_block_keys(turns: list[list[int]], size: int) -> None:
    keyer = PrefixKeyer(size, root=7)
    for ids in turns:
        length = len(ids) * size
        assert keyer(ids, length) == block_keys(ids, size, length, root=7)

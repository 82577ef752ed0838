"""Token ids → chained block hashes, computed once per request at C speed.

Block ``i`` covers tokens ``[i*B, (i+1)*B)`` and the hash of block ``i-1``: we feed the parent
hash to xxh3_64 as its seed, so equal hashes mean equal prefixes up to and including that
block (as vLLM's prefix-cache block hashes do). Only full blocks are hashed; the partial tail
of a prompt is never cached by a block-hash worker, so it cannot be hit.

Tokens travel as ``bytes`` of little-endian uint32 (see :func:`token_bytes`): one conversion
per request, after which hashing and the radix tree work on zero-copy slices of one buffer.
A 32k-token prompt is 64 ``xxh3_64`` calls on 2 KiB memoryview slices, about 13 µs here.

Precomputed block ids (a trace's ``hash_ids``) are block keys already: every consumer of
blocks (the LRU shadow, the pickers) takes any ``int`` keys. :func:`chain_ids` turns ids that
are only locally unique, or finer than our block size, into prefix-chained keys.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence

import numpy as np
import xxhash

BLOCK_SIZE = 512
"""Tokens per block for the router's shadow (seed 002)."""

TOKEN_BYTES = 4
"""Each token id is one little-endian uint32 in a token buffer."""

_xxh3 = xxhash.xxh3_64_intdigest
_NATIVE_LE = sys.byteorder == "little" and array.array("I").itemsize == TOKEN_BYTES

TokenInput = bytes | bytearray | memoryview | np.ndarray | Sequence[int]


class TextBytes(bytes):
    """A token buffer that holds approximate tokens (4-byte groups of a text prompt's UTF-8),
    not token ids: hashes of it never equal a worker's token-id blocks, so consumers that need
    real ids (the KV-event index) skip it. Everything else treats it as ``bytes``."""

    __slots__ = ()


def token_bytes(tokens: TokenInput) -> bytes:
    """Pack token ids as little-endian uint32 bytes (no per-token Python loop).

    Accepts an already packed buffer (returned as ``bytes``), a numpy integer array, or a
    sequence of ints. Raises ``ValueError`` for ids outside ``[0, 2**32)``.
    """
    if isinstance(tokens, bytes):
        if len(tokens) % TOKEN_BYTES:
            raise ValueError("token buffer length must be a multiple of 4 bytes")
        return tokens
    if isinstance(tokens, bytearray | memoryview):
        return token_bytes(bytes(tokens))
    if isinstance(tokens, np.ndarray):
        if tokens.dtype != np.uint32:
            if tokens.size and (tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
                raise ValueError("token ids must be in [0, 2**32)")
            tokens = tokens.astype(np.uint32)
        return tokens.astype("<u4", copy=False).tobytes()
    if _NATIVE_LE:
        try:
            return array.array("I", tokens).tobytes()
        except (OverflowError, TypeError) as exc:
            raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
    return token_bytes(np.asarray(tokens, dtype=np.int64))


def num_tokens(buf: bytes) -> int:
    """Number of tokens in a packed token buffer."""
    return len(buf) // TOKEN_BYTES


def hash_blocks(tokens: TokenInput, block_size: int = BLOCK_SIZE, root: int = 0) -> list[int]:
    """Chained xxh3_64 hashes of every full ``block_size``-token block of ``tokens``.

    ``root`` seeds the first block: use it to keep caches apart that must not share blocks
    (a model name or LoRA adapter hashed to an int), as vLLM's extra keys do.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    return hash_bytes_blocks(token_bytes(tokens), block_size * TOKEN_BYTES, root)


def hash_bytes_blocks(data: bytes, block_bytes: int, root: int = 0) -> list[int]:
    """Chained hashes of every full ``block_bytes`` slice of raw bytes (e.g. UTF-8 text)."""
    if block_bytes <= 0:
        raise ValueError("block_bytes must be positive")
    buf = memoryview(data)
    out: list[int] = []
    parent = root
    for start in range(0, len(buf) - block_bytes + 1, block_bytes):
        parent = _xxh3(buf[start : start + block_bytes], parent)
        out.append(parent)
    return out


def chain_ids(ids: Sequence[int], ids_per_block: int = 1, root: int = 0) -> list[int]:
    """Prefix-chain precomputed block ids into block keys.

    ``ids_per_block`` groups finer ids into one key (eight 64-token ids per 512-token block);
    only full groups become keys. Ids are packed as uint64 and hashed with the parent key as
    seed, so two requests share key ``i`` only if they share ids ``0 .. (i+1)*ids_per_block``.
    """
    if ids_per_block <= 0:
        raise ValueError("ids_per_block must be positive")
    packed = np.asarray(ids, dtype="<u8").tobytes()
    return hash_bytes_blocks(packed, ids_per_block * 8, root)


KEY_TOKENS = 2
"""Pseudo-tokens per block key in :func:`keys_as_tokens` (a 64-bit key as two uint32)."""


def keys_as_tokens(keys: Sequence[int]) -> bytes:
    """Block keys as a token buffer, two uint32 pseudo-tokens per 64-bit key.

    Lets a :class:`~router.cache.radix_tree.RadixTree` with ``page_size=2`` cache and match whole
    blocks when only block keys are known (trace replay, the simulated worker).
    """
    return np.asarray(keys, dtype="<u8").tobytes()

"""Prompts rebuilt from a trace's block keys, so real caches see the trace's reuse.

Each full 512-token block key becomes one deterministic block of content: equal keys give
equal blocks, so two requests share exactly the prefix the trace says they share. The rest of
the prompt (a partial last block, or tokens the trace has no key for) is fresh content unique
to the request. ``salt`` changes every block: a replay against workers whose caches cannot be
reset stays cold for the previous run's prompts.

- ``tokens`` mode: token ids in ``[first_id, vocab_size)``; exact block boundaries on any
  worker (send them as a completions prompt).
- ``text`` mode: 2048 ASCII bytes per block (lowercase words), which is 512 "tokens" for the
  router's default text approximation (4 bytes per token); a real tokenizer sees the same
  shared prefixes, though not at the same block boundaries.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import xxhash

from traces.trace.record import BLOCK_TOKENS, TraceRequest

TEXT_BLOCK_BYTES = BLOCK_TOKENS * 4
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


def _seed(*parts: int) -> int:
    return xxhash.xxh3_64_intdigest(np.asarray(parts, dtype="<u8").tobytes())


@lru_cache(maxsize=65_536)
def _token_block(key: int, salt: int, vocab_size: int, first_id: int) -> tuple[int, ...]:
    rng = np.random.default_rng(_seed(key, salt))
    return tuple(rng.integers(first_id, vocab_size, BLOCK_TOKENS).tolist())


@lru_cache(maxsize=65_536)
def _text_block(key: int, salt: int) -> str:
    return _random_text(_seed(key, salt), TEXT_BLOCK_BYTES)


def _random_text(seed: int, nbytes: int) -> str:
    """Lowercase words separated by spaces, exactly ``nbytes`` ASCII bytes."""
    rng = np.random.default_rng(seed)
    chars = _LETTERS[rng.integers(0, 26, nbytes)]
    spaces = rng.integers(3, 9, nbytes // 3 + 1).cumsum()
    chars[spaces[spaces < nbytes]] = ord(" ")
    return chars.tobytes().decode("ascii")


def full_blocks(req: TraceRequest) -> int:
    """Keys that stand for whole 512-token blocks of the prompt."""
    return min(len(req.blocks), req.input_length // BLOCK_TOKENS)


def prompt_token_ids(
    req: TraceRequest, salt: int = 0, vocab_size: int = 32_000, first_id: int = 100
) -> list[int]:
    """``req.input_length`` token ids: one deterministic block per key, then fresh ids."""
    if vocab_size <= first_id:
        raise ValueError("vocab_size must exceed first_id")
    n = full_blocks(req)
    ids: list[int] = []
    for key in req.blocks[:n]:
        ids.extend(_token_block(key, salt, vocab_size, first_id))
    tail = req.input_length - len(ids)
    if tail > 0:
        rng = np.random.default_rng(_seed(0xF2E5, req.request_id, salt))
        ids.extend(rng.integers(first_id, vocab_size, tail).tolist())
    return ids


def prompt_text(req: TraceRequest, salt: int = 0) -> str:
    """About ``4 * input_length`` ASCII bytes: one deterministic block per key, then fresh."""
    n = full_blocks(req)
    parts = [_text_block(key, salt) for key in req.blocks[:n]]
    tail = 4 * req.input_length - TEXT_BLOCK_BYTES * n
    if tail > 0:
        parts.append(_random_text(_seed(0xF2E5, req.request_id, salt), tail))
    return "".join(parts)

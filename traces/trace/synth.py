"""Seeded synthetic multi-turn traces: shared system prompts, heavy-tailed sessions.

Model (all draws from one ``numpy.random.default_rng(seed)``, so a seed fixes the trace):

- Sessions start as a Poisson process of ``rate`` sessions per second; turn ``k+1`` arrives an
  exponential think time (mean ``think_time`` s) after turn ``k``.
- Turns per session follow a Zipf law truncated to ``1..max_turns``: P(n) ∝ n^-``turns_alpha``
  (alpha 2, max 64: about 61% single-turn sessions, p90 ≈ 6, a few dozen-turn sessions), the
  heavy tail that makes session-affinity routing hot-spot.
- Each session opens with one of ``system_prompts`` shared prompts of ``system_prompt_tokens``
  tokens (uniform choice). Turn ``k``'s prompt is turn ``k-1``'s prompt + its output + a new
  user message; user messages and outputs are log-normal (sigma 1) with the given means. A
  session ends early rather than exceed ``max_context`` tokens.
- ``blocks`` are sequential ids of the prompt's full 512-token blocks: a block fully inside a
  system prompt has that prompt's id, any later block an id unique to its session (the
  conversation is append-only, so block ``i`` of a session never changes). Ids are
  prefix-unique by construction; :func:`traces.trace.writer.write_jsonl` writes them as generic
  JSONL ``hash_ids`` that load back as chained keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.trace.record import BLOCK_TOKENS, TraceRequest, finalize


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """Knobs of the generator; the defaults give a small, 2-core-friendly trace."""

    sessions: int = 200
    rate: float = 1.0
    system_prompts: int = 4
    system_prompt_tokens: int = 2048
    turns_alpha: float = 2.0
    max_turns: int = 64
    user_tokens: float = 256.0
    output_tokens: float = 256.0
    think_time: float = 20.0
    max_context: int = 65536
    seed: int = 0

    def validate(self) -> None:
        if self.sessions < 0 or self.system_prompts < 0 or self.system_prompt_tokens < 0:
            raise ValueError("sessions, system prompts and their tokens must be >= 0")
        if self.rate <= 0 or self.think_time < 0:
            raise ValueError("rate must be > 0 and think_time >= 0")
        if self.max_turns < 1 or self.turns_alpha <= 0:
            raise ValueError("max_turns must be >= 1 and turns_alpha > 0")
        if self.user_tokens < 1 or self.output_tokens < 1:
            raise ValueError("user_tokens and output_tokens must be >= 1")
        if self.max_context <= self.system_prompt_tokens:
            raise ValueError("max_context must exceed system_prompt_tokens")


def synthesize(cfg: SynthConfig) -> list[TraceRequest]:
    """Generate the trace described by ``cfg``, in arrival order."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    n = cfg.sessions
    starts = np.cumsum(rng.exponential(1.0 / cfg.rate, n))
    sizes = np.arange(1, cfg.max_turns + 1, dtype=float)
    pmf = sizes**-cfg.turns_alpha
    turns = rng.choice(cfg.max_turns, size=n, p=pmf / pmf.sum()) + 1
    prompt_of = rng.integers(0, max(cfg.system_prompts, 1), size=n)
    system_tokens = cfg.system_prompt_tokens if cfg.system_prompts else 0
    system_blocks = system_tokens // BLOCK_TOKENS
    next_id = cfg.system_prompts * system_blocks  # ids below are the system prompts' blocks

    out: list[TraceRequest] = []
    for s in range(n):
        k = int(turns[s])
        users = _lognormal(rng, cfg.user_tokens, k)
        outputs = _lognormal(rng, cfg.output_tokens, k)
        gaps = rng.exponential(cfg.think_time, k) if cfg.think_time > 0 else np.zeros(k)
        gaps[0] = 0.0
        arrivals = starts[s] + np.cumsum(gaps)
        first = int(prompt_of[s]) * system_blocks
        ids = list(range(first, first + system_blocks))
        context = system_tokens
        for t in range(k):
            length = context + int(users[t])
            if length > cfg.max_context:
                break
            while len(ids) < length // BLOCK_TOKENS:
                ids.append(next_id)
                next_id += 1
            out.append(
                TraceRequest(
                    arrival=float(arrivals[t]),
                    session_id=str(s),
                    turn=t + 1,
                    input_length=length,
                    output_length=int(outputs[t]),
                    blocks=tuple(ids[: length // BLOCK_TOKENS]),
                )
            )
            context = length + int(outputs[t])
    return finalize(out)


def _lognormal(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    """Log-normal token counts (sigma 1) with the given mean, at least 1."""
    sigma = 1.0
    draws = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)
    return np.maximum(1, np.rint(draws)).astype(np.int64)

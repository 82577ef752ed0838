"""The rules every command's numbers are held to, in one place.

``serve`` and ``epp`` read their options through pydantic (router/config.py), the trace tools
through argparse; both check a number with the same :class:`Rule` and say what is wrong in
the same words, so a bad value gets the same one-line error and exit 2 from every command
(``cache-router simulate: error: argument --max-requests: must be >= 1, not -3``). A rule
also bounds each number from above: a value past what any fleet holds (a KV capacity of
10**23 tokens, a timeout of 10**300 s) would overflow JSON's int64, an event loop's timer
or a simulator's loop later, far from the flag that caused it.

Imports nothing of the project: every layer may use it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import NoReturn

MAX_TOKENS = 2**53
"""Most tokens a count may hold (a KV capacity, a prompt, a cap): past any fleet, exact as a
float and in JavaScript (the dashboard), and a sum over :data:`MAX_WORKERS` fits an int64."""
MAX_BYTES = 2**53
"""Most bytes a size may be (a body, a cache, a queue)."""
MAX_ITEMS = 2**53
"""Most of anything counted (requests, entries, attempts)."""
MAX_WORKERS = 1024
"""Most workers a command starts or simulates."""
MAX_SECONDS = 1e9
"""Longest duration (about 31 years): past any timeout, inside every event loop's timer."""
MAX_PORT = 65535
MAX_RATIO = 1e12
"""Largest rate, bandwidth, speedup or weight: far past any fleet, and products of two stay
finite (an int() of an infinity raises)."""


def _bound_text(value: float) -> str:
    """A bound as people read it: 2**53 rather than 9007199254740992."""
    if isinstance(value, int) and value >= 2**20 and value & (value - 1) == 0:
        return f"{value} (2**{value.bit_length() - 1})"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(value: object) -> str:
    """A refused value, bounded (a 4,000-digit number stays a short line)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)  # -1 as typed, not -1.0
    text = str(value)
    return text if len(text) <= 40 else text[:40] + "..."


@dataclass(frozen=True)
class Rule:
    """A number's type and range: ``low`` (exclusive when ``above``) to ``high``
    (inclusive), finite. One instance is an argparse ``type`` (text in) and a pydantic
    ``AfterValidator`` (:meth:`check`, number in); both raise with the same message."""

    kind: type[int] | type[float]
    low: float | None = None
    high: float | None = None
    above: bool = False  # low itself is refused (> low rather than >= low)

    def check(self, value: int | float) -> int | float:
        """``value`` if the rule holds, else ValueError saying why."""
        if isinstance(value, bool):
            raise ValueError(f"must be a number, not {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number, not {value!r}")
        if self.kind is int and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"must be an integer, not {value!r}")
            value = int(value)
        low, high = self.low, self.high
        if low is not None and (value <= low if self.above else value < low):
            sign = ">" if self.above else ">="
            raise ValueError(f"must be {sign} {_bound_text(low)}, not {_shown(value)}")
        if high is not None and value > high:
            raise ValueError(f"must be <= {_bound_text(high)}, not {_shown(value)}")
        return self.kind(value)

    def parse(self, text: str) -> int | float:
        """``text`` as the rule's number, else ValueError saying why."""
        try:
            value: int | float = self.kind(text.strip())
        except ValueError:
            noun = "an integer" if self.kind is int else "a number"
            raise ValueError(f"must be {noun}, not {_shown(repr(text))}") from None
        return self.check(value)

    def __call__(self, text: str) -> int | float:
        """argparse's ``type=``: a bad value is argparse's one-line error, exit 2."""
        try:
            return self.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def integer(low: int | None = None, high: int | None = None) -> Rule:
    return Rule(int, low, high)


def number(low: float | None = None, high: float | None = None, above: bool = False) -> Rule:
    return Rule(float, low, high, above)


# The rules the commands share; a flag with another meaning builds its own Rule.
COUNT = integer(1, MAX_ITEMS)  # requests, turns, attempts, entries: at least one
COUNT_OR_OFF = integer(0, MAX_ITEMS)  # 0: none, or no limit (each flag's help says)
WORKERS = integer(1, MAX_WORKERS)
WORKERS_OR_NONE = integer(0, MAX_WORKERS)
TOKENS = integer(1, MAX_TOKENS)
TOKENS_OR_OFF = integer(0, MAX_TOKENS)
BYTES = integer(1, MAX_BYTES)
BYTES_OR_OFF = integer(0, MAX_BYTES)
PORT = integer(0, MAX_PORT)  # 0: a free one
PORT_GIVEN = integer(1, MAX_PORT)
SEED = integer(0, 2**63 - 1)
SECONDS = number(0, MAX_SECONDS, above=True)
SECONDS_OR_OFF = number(0, MAX_SECONDS)
MILLISECONDS_OR_OFF = number(0, MAX_SECONDS * 1000)
POSITIVE = number(0, MAX_RATIO, above=True)  # a rate, a bandwidth, a speedup, a weight
FRACTION = number(0, 1)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: ``PROG: error: MESSAGE``, exit 2 (the usage
    of ``serve`` alone runs to dozens of lines, and hid the line that says what is wrong)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def refuse(command: str, problem: object) -> int:
    """Print ``cache-router COMMAND: error: PROBLEM`` on one line; the exit status 2."""
    import sys

    text = " ".join(str(problem).split())
    print(f"cache-router {command}: error: {text}", file=sys.stderr)
    return 2

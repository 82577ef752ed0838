"""``cache-router COMMAND`` imports only COMMAND's module (router/cli.py): ``serve`` and
``epp`` do not load the trace tools, and --help still lists every command."""

from __future__ import annotations

import subprocess
import sys

from router.cli import COMMANDS, build_parser

PROBE = (
    "import sys; from router.cli import build_parser; build_parser({argv!r}); "
    "print(sorted({{m.split('.')[0] for m in sys.modules}} & {{'traces'}}))"
)


def _loaded(argv: list[str]) -> str:
    code = PROBE.format(argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_serve_and_epp_do_not_import_traces() -> None:
    assert _loaded(["serve", "--worker", "http://127.0.0.1:1"]) == "[]"
    assert _loaded(["epp"]) == "[]"
    assert _loaded(["simulate"]) == "['traces']"


def test_help_lists_every_command() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)

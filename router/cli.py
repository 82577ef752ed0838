"""The `cache-router` command: one entry point, one sub-command per job.

Each sub-command lives in the module that owns it and registers itself through an
``add_parser(subparsers)`` function, so this file stays a list of modules; only the module
of the sub-command run is imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from router import __version__
from router.validation import Parser

COMMANDS: dict[str, str] = {
    "demo": "traces.commands.demo",
    "serve": "router.proxy.serve",
    "epp": "router.epp.server",
    "trace": "traces.commands.trace",
    "simulate": "traces.commands.simulate",
    "sim-worker": "traces.sim_worker.server",
    "replay": "traces.commands.sweep",
    "sweep": "traces.commands.sweep",
    "capacity": "traces.commands.capacity",
}
"""Each sub-command and the module that registers it (``add_parser``), in --help's order."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command's parser; when ``argv`` names a sub-command, only its module is imported
    (``cache-router serve`` does not load the trace tools), else every one (--help)."""
    # every sub-command's parser is a Parser too (argparse makes them of the root's class):
    # a bad option is one line, ``cache-router CMD: error: argument --FLAG: WHY``, exit 2
    parser = Parser(
        prog="cache-router",
        description="Cache-aware request router for LLM inference workers (vLLM, SGLang).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cache-router {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(_command_of(argv)):
        module.add_parser(sub)
    return parser


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The sub-command ``argv`` runs, when its first word is one."""
    first = next(iter(argv or ()), None)
    return first if first in COMMANDS else None


def _command_modules(command: str | None = None) -> list:
    """Modules that contribute sub-commands: ``command``'s, or all (imported lazily)."""
    import importlib

    names = [COMMANDS[command]] if command else list(dict.fromkeys(COMMANDS.values()))
    return [importlib.import_module(name) for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # serve --processes re-runs it
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

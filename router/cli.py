"""The `cache-router` command: one entry point, one sub-command per job.

Each sub-command lives in the module that owns it and registers itself through an
``add_parser(subparsers)`` function, so this file stays a list of imports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from router import __version__
from router.validation import Parser


def build_parser() -> argparse.ArgumentParser:
    # every sub-command's parser is a Parser too (argparse makes them of the root's class):
    # a bad option is one line, ``cache-router CMD: error: argument --FLAG: WHY``, exit 2
    parser = Parser(
        prog="cache-router",
        description="Cache-aware request router for LLM inference workers (vLLM, SGLang).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cache-router {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.add_parser(sub)
    return parser


def _command_modules() -> list:
    """Modules that contribute sub-commands (imported lazily so --help stays fast)."""
    import importlib

    names = [
        "traces.demo",
        "router.proxy.serve",
        "router.epp.server",
        "traces.cli",
        "traces.simulate",
        "traces.sim_worker.server",
        "traces.sweep",
        "traces.capacity_cmd",
    ]
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:  # a sub-command not built yet
            if exc.name != name:
                raise
    return modules


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # serve --processes re-runs it
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

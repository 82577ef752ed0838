"""``cache-router serve``: run the proxy in front of vLLM / SGLang workers.

    cache-router serve --worker http://10.0.0.5:8000 http://10.0.0.6:8000 --policy unified

Every option of :class:`router.config.Settings` is a flag here, generated from the model so
``--help`` shows each one with its default and its environment variable. Priority: flags >
environment (``CACHE_ROUTER_<NAME>``) > ``--config FILE.yaml`` > defaults.
"""

from __future__ import annotations

import argparse
import sys

from router.config import Settings
from router.service.command import (
    add_settings_arguments,
    process_sockets,
    raise_fd_limit,
    settings_from_args,
    setup_logging,
    tune_gc,
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve",
        help="run the cache-aware proxy in front of vLLM / SGLang workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_arguments(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from router.service.uvicorn_support import problem
    from router.validation import refuse

    unsupported = problem()
    if unsupported is not None:
        return refuse("serve", unsupported)
    try:
        settings = settings_from_args(args)
    except (ValueError, OSError) as exc:
        return refuse("serve", exc)
    if not settings.roles():
        print(
            "cache-router serve: no workers yet (add some with --worker URL or POST /workers)",
            file=sys.stderr,
        )
    if settings.process_count() > 1:
        from router.service.supervisor import main_processes

        return main_processes(settings, getattr(args, "argv", None) or sys.argv[1:])
    run(settings)
    return 0


def run(settings: Settings) -> None:
    """Serve ``settings`` with uvicorn (uvloop + httptools when installed) until stopped.

    SIGTERM / SIGINT drain in-flight requests up to ``shutdown_timeout_s``, then this
    returns, so the process exits 0 (:mod:`router.service.server`).
    """
    from router.proxy.app import create_app
    from router.service.server import build_config, serve

    setup_logging(settings)
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        loop = "asyncio"
    app = create_app(settings)
    config = build_config(app, settings, loop=loop)
    sockets = process_sockets(settings, config)
    raise_fd_limit(settings)
    tune_gc()
    serve(app, config, sockets)

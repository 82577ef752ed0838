"""The command-line side every front end shares: a flag for every option of
:class:`router.config.Settings` (generated from the model, so ``--help`` shows each one with
its default and its environment variable), and the process setup (logging, open files,
garbage collection, the sockets of one of several ``--processes``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import ValidationError

from router.config import ENV_PREFIX, Settings, field_rule, load_settings

# Flags whose name or shape differs from the field's.
_FLAG_NAMES = {
    "workers": "--worker",
    "prefill_workers": "--prefill",
    "decode_workers": "--decode",
    "bootstrap_ports": "--bootstrap-port",
    "api_keys": "--api-key",
    "picker_params": "--picker-param",
    "worker_kv_capacity_tokens": "--worker-kv-capacity",
    "worker_cpu_kv_capacity_tokens": "--worker-cpu-kv-capacity",
    "worker_models": "--worker-models",
    "flow_objectives": "--flow-objective",
    "flow_weights": "--flow-weight",
}
_METAVARS = {
    "workers": "URL",
    "prefill_workers": "URL [BOOTSTRAP_PORT]",
    "decode_workers": "URL",
    "bootstrap_ports": "URL=PORT",
    "api_keys": "KEY",
    "picker_params": "NAME=VALUE",
    "worker_kv_capacity_tokens": "URL=TOKENS",
    "worker_cpu_kv_capacity_tokens": "URL=TOKENS",
    "worker_kv_load_gbps": "URL=GBPS",
    "worker_models": "URL=BASE[,ADAPTER...]",
    "discover": "URI",
    "flow_objectives": "NAME=PRIORITY",
    "flow_weights": "FLOW=WEIGHT",
}

_KEY_VALUE_FIELDS = (
    "picker_params",
    "worker_kv_capacity_tokens",
    "worker_cpu_kv_capacity_tokens",
    "worker_kv_load_gbps",
    "worker_models",
    "bootstrap_ports",
    "flow_objectives",
    "flow_weights",
)


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list or any(
        get_origin(a) is list for a in get_args(annotation)
    )


def _key_value(text: str) -> tuple[str, Any]:
    """``name=value`` with the value read as YAML (3 → int, 2.5 → float, true → bool)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), yaml.safe_load(value)


def add_settings_arguments(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """``--config`` and a flag for every field of :class:`Settings` but ``skip`` (the
    ``epp`` command shares them)."""
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of options (default: none)")
    for name, info in Settings.model_fields.items():
        if name in skip:
            continue
        flag = flag_of(name)
        default = info.get_default(call_default_factory=True)
        env = ENV_PREFIX + name.upper()
        shown = "none" if default in (None, [], {}) else default
        text = f"{info.description} (default: {shown}; env {env})"
        kw: dict[str, Any] = {"dest": name, "default": None, "help": text}
        if name in _KEY_VALUE_FIELDS:
            p.add_argument(flag, action="append", type=_key_value, metavar=_METAVARS[name], **kw)
        elif _is_list(info.annotation):
            p.add_argument(flag, action="extend", nargs="+", metavar=_METAVARS[name], **kw)
        elif info.annotation is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif get_origin(info.annotation) is Literal:
            p.add_argument(flag, choices=get_args(info.annotation), **kw)
        else:
            kind = field_rule(name) or str  # a number: the rule Settings checks it with
            p.add_argument(flag, type=kind, metavar=name.split("_")[-1].upper(), **kw)


def flag_of(name: str) -> str:
    """The flag of the Settings field ``name``."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def settings_problem(exc: ValidationError) -> str:
    """What is wrong with the options, on one line in argparse's words (``argument
    --flow-weight: gold: must be > 0, not 0``) rather than pydantic's several lines and
    URL; a value from the environment or ``--config`` is named by its flag too."""
    problems = []
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error["loc"]]
        text = error["msg"].removeprefix("Value error, ")
        if loc and loc[0] in Settings.model_fields:
            text = ": ".join([f"argument {flag_of(loc[0])}", *loc[1:], text])
        problems.append(text)
    return "; ".join(problems)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags (unset flags leave env / file / defaults in charge);
    ValueError with :func:`settings_problem`'s one line when they do not hold."""
    values = {name: getattr(args, name, None) for name in Settings.model_fields}
    for name in _KEY_VALUE_FIELDS:
        if values[name] is not None:
            values[name] = dict(values[name])
    try:
        return load_settings(getattr(args, "config", None), **values)
    except ValidationError as exc:
        raise ValueError(settings_problem(exc)) from None


def process_sockets(settings: Settings, config) -> list | None:
    """The listening sockets of one of several processes (``--processes``: the shared port
    with SO_REUSEPORT, and the private unix socket its siblings gather /metrics over); None
    for a process on its own (uvicorn binds)."""
    if not (settings.reuse_port or settings.process_socket):
        return None
    from router.service.supervisor import listening_socket, unix_socket

    sockets = [
        listening_socket(settings.host, settings.port, config.backlog)
        if settings.reuse_port
        else config.bind_socket()
    ]
    if settings.process_socket:
        sockets.append(unix_socket(Path(settings.process_socket), config.backlog))
    return sockets


def setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def raise_fd_limit(settings: Settings) -> None:
    """Room for ``max_connections`` client sockets, each with a worker connection.

    A soft ``ulimit -n`` of 1024 (a common default) would make accept() fail long before
    ``max_connections``; the soft limit is raised toward the hard one, with a warning when
    even that is short.
    """
    import resource

    wanted = 2 * (settings.max_connections or 4096) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        logging.getLogger("cache_router").warning(
            "open files limit %d < %d: lower --max-connections or raise ulimit -n", target, wanted
        )


def tune_gc() -> None:
    """Fewer, cheaper garbage collections for a long-running proxy.

    The shadows hold many long-lived objects (radix nodes, LRU entries) that every full
    collection walks, stalling the event loop for tens of ms; refcounting frees nearly all
    of the hot path's garbage anyway. Freezing the startup heap and a larger generation-0
    threshold cut the p99 latency at concurrency 32 from ~25-45 ms to ~10-13 ms in
    bench/proxy/proxy_peer.sh, at the same throughput (bench/RESULTS.md).
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)

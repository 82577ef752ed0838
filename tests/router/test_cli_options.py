"""Every command's numeric options, found in the parsers themselves, tried with negative,
zero, NaN, infinite and huge values: each is refused with exit 2 and one line naming the
flag, or accepted by the parser and by what the command checks before it starts (Settings,
the simulator's and the sim worker's configs, the capacity grid); never a traceback, never
exit 1. In-process: no server starts (the commands check everything before they start)."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from router.cli import build_parser, main
from router.config import ENV_PREFIX, Settings, field_rule
from router.service.command import settings_from_args

VALUES = ("-3", "-1", "0", "nan", "inf", "-inf", "1e30", "1e308", "99999999999999999999999")
"""Negative, zero, NaN, infinite and huge: each tried on every numeric option."""
# A flag whose meaning differs between commands, so a value one accepts the other may
# refuse: serve's shadow may be any size, a sim worker's KV is whole 512-token blocks;
# `trace synth --max-turns` generates turns, the others cap them.
DIFFERS = {"--kv-capacity-tokens", "--max-turns"}


@pytest.fixture(autouse=True)
def _no_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdicts are the flags' alone: no CACHE_ROUTER_* from the shell running pytest."""
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator:
    """(command path, its parser) for every leaf sub-command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _commands(child, (*path, name))


def _numeric(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(flag, key) of every numeric option: a typed flag, or a NAME=VALUE flag of a
    Settings mapping of numbers (key: the NAME its values are tried under)."""
    for action in parser._actions:
        if not action.option_strings:
            continue
        flag = action.option_strings[-1]
        if action.type in (int, float) or hasattr(action.type, "check"):
            yield flag, ""
        elif action.dest in Settings.model_fields and field_rule(action.dest) is not None:
            yield flag, "http://127.0.0.1:1=" if "worker" in action.dest else "k="


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Placeholders for the required arguments (never read: nothing runs)."""
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            if action.dest not in ("help",):
                argv.append("x")
        elif action.required:
            argv += [action.option_strings[0], "x"]
    return argv


def _settings(args: argparse.Namespace) -> None:
    settings_from_args(args)


def _simulate(args: argparse.Namespace) -> None:
    from traces.commands.options import config_from_args

    config_from_args(args)


def _capacity(args: argparse.Namespace) -> None:
    from traces.commands.options import grid_from_args

    _simulate(args)
    for ceiling in (float("inf"), 3.0):  # no ceiling known / the trace's load ceiling
        grid_from_args(args, SimpleNamespace(load_ceiling=ceiling))


def _sim_worker(args: argparse.Namespace) -> None:
    from traces.sim_worker.server import config_from_args

    config_from_args(args)


def _synth(args: argparse.Namespace) -> None:
    from traces.commands.trace import synth_config

    synth_config(args)


CHECKS: dict[tuple[str, ...], Callable[[argparse.Namespace], None]] = {
    ("serve",): _settings,
    ("epp",): _settings,
    ("simulate",): _simulate,
    ("capacity",): _capacity,
    ("sim-worker",): _sim_worker,
    ("trace", "synth"): _synth,
}
"""What each command checks after parsing and before it starts anything (ValueError: the
command prints it on one line and exits 2)."""


def _try(parser, command, argv, capsys) -> tuple[str, str]:
    """('accepted', '') or ('refused', the error line)."""
    try:
        args = parser.parse_args([*command, *argv])
    except SystemExit as exc:
        err = capsys.readouterr().err
        assert exc.code == 2, (command, argv, exc.code, err)
        return "refused", err
    check = CHECKS.get(command)
    if check is not None:
        try:
            check(args)
        except ValueError as exc:  # printed as `cache-router CMD: error: ...`, exit 2
            return "refused", f"cache-router {' '.join(command)}: error: {exc}\n"
    return "accepted", ""


def test_every_numeric_option_refuses_bad_values_on_one_line_or_accepts(capsys) -> None:
    parser = build_parser()
    tried: Counter[str] = Counter()
    verdicts: dict[tuple[str, str], dict[tuple[str, ...], str]] = {}
    for command, sub in _commands(parser):
        base = _required(sub)
        for flag, key in _numeric(sub):
            for value in VALUES:
                verdict, err = _try(parser, command, [*base, flag, key + value], capsys)
                tried[" ".join(command)] += 1
                if verdict == "refused":
                    prog = f"cache-router {' '.join(command)}: error: "
                    assert err.count("\n") == 1 and err.startswith(prog), err
                    assert re.match(rf"argument {re.escape(flag)}: ", err[len(prog) :]) or (
                        command in CHECKS  # a check of several options together
                    ), err
                    assert "Traceback" not in err and "pydantic" not in err, err
                    text = err[len(prog) :]
                else:
                    text = "accepted"
                verdicts.setdefault((flag, value), {})[command] = text
    # every command with numbers was walked, and none of its numbers is unchecked
    assert {"serve", "epp", "simulate", "capacity", "sim-worker", "replay", "sweep"} <= set(tried)
    assert {"trace synth", "trace cap"} <= set(tried)
    # the same flag and value: the same verdict and words from every command that has it
    for (flag, value), by_command in verdicts.items():
        if flag not in DIFFERS:
            assert len(set(by_command.values())) == 1, (flag, value, by_command)
    refused = {(flag, value) for (flag, value), v in verdicts.items() if "accepted" not in v}
    for value in ("nan", "inf", "1e308", "99999999999999999999999"):
        # no number of any command takes these
        assert not [f for (f, v), c in verdicts.items() if v == value and "accepted" in c.values()]
    assert ("--max-requests", "-3") in refused and ("--grid-factor", "0") in refused


def test_no_command_reads_a_number_without_a_rule() -> None:
    for command, sub in _commands(build_parser()):
        for action in sub._actions:
            assert action.type not in (int, float), (command, action.option_strings)
    for name, info in Settings.model_fields.items():  # serve's numbers: a rule each
        assert info.annotation not in (int, float) or field_rule(name) is not None, name


def test_simulate_shares_serves_flow_rules() -> None:
    """simulate refuses what serve refuses, by serve's own rules (not a copy)."""
    parser = build_parser()
    for name in ("flow_target_ttft_s", "flow_queue_ttl_s", "flow_queue_max"):
        flag = "--" + name.replace("_", "-")
        kinds = {
            command[0]: action.type
            for command, sub in _commands(parser)
            for action in sub._actions
            if flag in action.option_strings
        }
        assert kinds["simulate"] is kinds["serve"] is field_rule(name), (flag, kinds)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--max-requests", "-3"],  # was trace[:-3]: the last 3 dropped, exit 0
        ["capacity", "--max-requests", "-3"],
        ["capacity", "--grid-factor", "0"],  # was ZeroDivisionError before the factor check
        ["simulate", "--flow-control", "--flow-queue-ttl-s", "-1"],  # serve refuses these
        ["simulate", "--flow-control", "--flow-target-ttft-s", "0"],
        ["simulate", "--flow-control", "--flow-queue-max", "-1"],
        ["sim-worker", "--kv-capacity-tokens", "99999999999999999999999"],
        ["sim-worker", "--cpu-kv-capacity-tokens", "99999999999999999999999"],
        ["serve", "--kv-capacity-tokens", "99999999999999999999999"],
        ["serve", "--cpu-kv-capacity-tokens", "99999999999999999999999"],
    ],
)
def test_the_reported_options_are_refused_with_exit_2(argv, capsys) -> None:
    """Refused while parsing (or by the command's own check before it starts)."""
    command, flag = argv[0], argv[-2]
    sub = dict(_commands(build_parser()))[(command,)]
    verdict, err = _try(build_parser(), (command,), [*_required(sub), *argv[1:]], capsys)
    assert verdict == "refused" and err.count("\n") == 1, err
    assert err.startswith(f"cache-router {command}: error: argument {flag}: must be"), err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_flow_weight_must_be_positive_and_finite(value: str) -> None:
    args = build_parser().parse_args(["serve", "--flow-weight", f"gold={value}"])
    with pytest.raises(ValueError, match=r"^argument --flow-weight: gold: must be .*, not"):
        settings_from_args(args)


def test_serve_and_epp_print_a_settings_error_on_one_line(monkeypatch, capsys) -> None:
    """A value from the environment (or --config) is checked by pydantic: one line in
    argparse's words, exit 2, where it was pydantic's four lines with a URL."""
    monkeypatch.setenv(ENV_PREFIX + "FLOW_QUEUE_TTL_S", "-1")
    for command in ("serve", "epp"):
        assert main([command]) == 2
        err = capsys.readouterr().err
        why = "argument --flow-queue-ttl-s: must be > 0, not -1"
        assert err == f"cache-router {command}: error: {why}\n"


def test_a_commands_own_checks_are_one_line_exit_2(tmp_path, capsys) -> None:
    """What only the command can check (options together, the trace's file) stops it with
    the same one line and exit 2, before anything starts: no traceback."""
    absent = str(tmp_path / "absent.jsonl")
    sample = Path(__file__).parents[2] / "traces" / "data" / "conversation_sample.jsonl"
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(sample.read_text().splitlines(keepends=True)[:5]))
    for argv, why in [
        (["sweep", "--trace", str(trace)], "give --worker URL ... or --sim-workers N"),
        (["sweep", "--trace", absent, "--sim-workers", "1"], "no such file"),
        (["replay", "--trace", absent, "--url", "http://127.0.0.1:1"], "no such file"),
        (["simulate", "--trace", absent], "no such file"),
        (["simulate", "--trace", absent, "--prefill-workers", "2"], "no such file"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"cache-router {argv[0]}: error: ") and err.count("\n") == 1, err
        assert why in err, err
    with pytest.raises(SystemExit) as exc:  # an SLO's seconds: the rule of every duration
        main(["capacity", "--trace", absent, "--slo", "ttft_p90=1e400"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "cache-router capacity: error: argument --slo: bad SLO 'ttft_p90=1e400': seconds must "
        "be a finite number, not inf\n"
    )


def test_an_unknown_cost_profile_is_one_line_exit_2(tmp_path, capsys) -> None:
    """``--cost-profile``: a shipped name or a profile file; anything else is refused by
    serve (its settings) and simulate (its parser) alike, naming what would do."""
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for value, why in (("h300", "unknown GPU profile 'h300'"), (str(broken), "cannot read")):
        assert main(["serve", "--cost-profile", value]) == 2
        err = capsys.readouterr().err
        assert err.startswith("cache-router serve: error: ") and err.count("\n") == 1, err
        assert why in err, err
        with pytest.raises(SystemExit) as exc:
            main(["simulate", "--trace", str(broken), "--cost-profile", value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("cache-router simulate: error: argument --cost-profile: ")
        assert why in err and err.count("\n") == 1, err

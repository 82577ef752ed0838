"""bench/tiers/live_tiers.py: its sim workers, router and simulator read one worker model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("tiers/live_tiers")


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_default_is_the_measured_profile_at_the_benchs_capacities(bench) -> None:
    args = bench.parse_args([])
    sim = bench.model_argv(args.model)
    assert _flag(sim, "--gpu-profile") == "h100-llama8b"
    assert _flag(sim, "--kv-capacity-tokens") == "262144"
    assert _flag(sim, "--cpu-kv-capacity-tokens") == "1048576"
    router = bench.router_args(bench.CONFIGS[1], ["http://127.0.0.1:1"], args, 2)
    assert _flag(router, "--cost-profile") == "h100-llama8b"
    assert "--kv-load-gbps" not in router  # a profile loads at its measured rate


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["--kv-load-gbps", "40"], "--kv-load-gbps", "40.0"),
        (["--gpu-profile", "flat", "--kv-load-gbps", "40"], "--kv-load-gbps", "40.0"),
        (["--prefill-tokens-per-s", "30000"], "--prefill-tokens-per-s", "30000.0"),
    ],
)
def test_a_flat_model_flag_runs_workers_simulator_and_router_flat(bench, argv, flag, value) -> None:
    args = bench.parse_args(argv)
    # alone, a flat-model flag means the flat model; the simulator runs args.model itself
    assert args.model.profile is None
    sim = bench.model_argv(args.model)
    assert _flag(sim, "--gpu-profile") == "flat"
    assert _flag(sim, flag) == value
    router = bench.router_args(bench.CONFIGS[1], ["http://127.0.0.1:1"], args, 2)
    assert _flag(router, "--cost-profile") == "flat"  # the router learns the rate online
    assert _flag(router, "--kv-load-gbps") == repr(args.model.kv_load_gbps)


def test_a_flat_model_flag_beside_a_named_profile_is_refused(bench, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--gpu-profile", "h100-llama8b", "--kv-load-gbps", "40"])
    assert exit_info.value.code == 2
    assert "--kv-load-gbps" in capsys.readouterr().err

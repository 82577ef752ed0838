"""Settings: defaults, YAML < environment < command line, validation, generated --help."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from router.cache.cost_profile import resolve
from router.cli import build_parser
from router.config import Settings, load_settings
from router.service.command import settings_from_args


def test_defaults_need_nothing():
    s = load_settings()
    assert s.workers == [] and s.policy == "ttft" and s.shadow == "blocks"
    assert s.tokenizer == "approx" and s.session_header == "X-Session-ID"
    assert s.kv_capacity_tokens // s.block_size == 1953


def test_yaml_then_env_then_flags(tmp_path, monkeypatch):
    config = tmp_path / "router.yaml"
    config.write_text(
        "worker: [10.0.0.1:8000, 'http://10.0.0.2:8000/']\npolicy: sticky\nport: 9000\n"
        "picker-params: {max_sessions: 10}\nkv_capacity_tokens: 4096\n"
    )
    s = load_settings(config)
    assert s.workers == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert (s.policy, s.port, s.picker_params) == ("sticky", 9000, {"max_sessions": 10})
    monkeypatch.setenv("CACHE_ROUTER_PORT", "9100")
    monkeypatch.setenv("CACHE_ROUTER_WORKERS", "a:1, b:2")
    s = load_settings(config)
    assert s.port == 9100 and s.workers == ["http://a:1", "http://b:2"]
    s = load_settings(config, port=9200, policy=None)
    assert s.port == 9200 and s.policy == "sticky"  # None = flag not given


def test_invalid_values_are_rejected_with_the_valid_ones():
    with pytest.raises(ValidationError, match="choose one of"):
        load_settings(policy="nope")
    with pytest.raises(ValidationError, match="unknown parameter"):
        load_settings(policy="lmetric", picker_params={"bogus": 1})
    with pytest.raises(ValidationError):
        load_settings(shadow="tree")
    with pytest.raises(ValidationError, match="http"):
        load_settings(workers=["ftp://x"])
    with pytest.raises(ValidationError, match="radix_eviction"):
        load_settings(radix_eviction="random")
    with pytest.raises(ValidationError, match="existing path"):
        load_settings(tokenizer="/no/such/model")


def test_serve_flags_cover_every_setting_and_help_shows_defaults(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in Settings.model_fields:
        assert f"env CACHE_ROUTER_{name.upper()}" in text
    assert "--worker URL" in text and "(default: ttft;" in text
    assert "{blocks,radix}" in text


def test_serve_flags_parse_into_settings():
    args = build_parser().parse_args(
        [
            "serve",
            "--worker", "http://a:1", "http://b:2",
            "--worker", "c:3",
            "--policy", "unified",
            "--picker-param", "overload_factor=3.5",
            "--worker-kv-capacity", "http://a:1=2048",
            "--no-stream-usage",
            "--api-key", "k1", "k2",
        ]
    )  # fmt: skip
    s = settings_from_args(args)
    assert s.workers == ["http://a:1", "http://b:2", "http://c:3"]
    assert s.picker_params == {"overload_factor": 3.5}
    assert s.capacity_for("http://a:1") == 2048 and s.capacity_for("http://b:2") == 1_000_000
    assert s.stream_usage is False
    assert [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]
    assert "k1" not in repr(s) and "k2" not in s.model_dump_json()  # keys are secrets


def test_roles_of_a_disaggregated_fleet_parse_as_sglang_router_takes_them():
    args = build_parser().parse_args(
        [
            "serve",
            "--worker", "agg:1",
            "--prefill", "http://p:1", "9001", "p:2",
            "--prefill", "p:3", "--decode", "d:1", "d:2",
            "--bootstrap-port", "http://p:2=9002",
            "--pd-protocol", "sglang",
        ]
    )  # fmt: skip
    s = settings_from_args(args)
    assert s.roles() == [
        ("http://agg:1", "both"),
        ("http://p:1", "prefill"),
        ("http://p:2", "prefill"),
        ("http://p:3", "prefill"),
        ("http://d:1", "decode"),
        ("http://d:2", "decode"),
    ]
    assert [s.bootstrap_port(f"http://p:{i}") for i in (1, 2, 3)] == [9001, 9002, 8998]
    assert s.pd_protocol == "sglang" and s.decode_policy == "decode_load"
    with pytest.raises(ValueError, match="one role"):
        load_settings(prefill_workers=["x:1"], decode_workers=["http://x:1"])
    with pytest.raises(ValueError, match="follows no URL"):
        load_settings(prefill_workers=["9000", "x:1"])
    with pytest.raises(ValueError, match="unknown picker"):
        load_settings(decode_policy="nope")


def test_per_worker_cpu_tier_and_bandwidth() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--worker", "a:1", "b:2",
            "--cpu-kv-capacity-tokens", "4096",
            "--worker-cpu-kv-capacity", "a:1=0",
            "--worker-kv-load-gbps", "http://b:2=50",
        ]
    )  # fmt: skip
    s = settings_from_args(args)
    assert s.cpu_capacity_for("http://a:1") == 0 and s.cpu_capacity_for("http://b:2") == 4096
    # not told a bandwidth: the cost profile's (h100-llama8b) rate for whole-block loads
    h100 = resolve("h100-llama8b")
    assert s.kv_load_s_per_token("http://a:1") == pytest.approx(h100.load_s(4096) / 4096)
    assert 131_072 / 50e9 < s.kv_load_s_per_token("http://a:1") < 131_072 / 45e9
    assert s.kv_load_s_per_token("http://b:2") == pytest.approx(131_072 / 50e9)
    flat = Settings(cost_profile="flat")
    assert flat.kv_load_s_per_token("http://a:1") == pytest.approx(131_072 / 20e9)
    # in the workers' time, as the cost model's terms: sim workers 10x faster load 10x faster
    scaled = Settings(kv_load_gbps=25, cost_time_scale=10)
    assert scaled.kv_load_s_per_token("http://a:1") == pytest.approx(131_072 / 25e9 / 10)
    with pytest.raises(ValueError, match="must be >= 0, not -1"):
        Settings(worker_cpu_kv_capacity_tokens={"http://a:1": -1})
    with pytest.raises(ValueError, match="must be > 0, not 0"):
        Settings(worker_kv_load_gbps={"http://a:1": 0})


def test_the_dispatch_hold_is_on_by_default_except_where_the_engines_order_themselves(
    monkeypatch,
):
    from router.config import DISPATCH_HOLD_TOKENS

    assert load_settings().hold_tokens() == DISPATCH_HOLD_TOKENS
    assert load_settings(engine_priority=True).hold_tokens() == 0
    assert load_settings(engine_priority=True, dispatch_hold_tokens=4096).hold_tokens() == 4096
    assert load_settings(dispatch_hold_tokens=0).hold_tokens() == 0
    monkeypatch.setenv("CACHE_ROUTER_DISPATCH_HOLD_TOKENS", "2048")  # given, from anywhere
    assert load_settings(engine_priority=True).hold_tokens() == 2048

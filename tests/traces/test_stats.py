from collections.abc import Callable

import pytest

from traces.trace.formats import load_trace
from traces.trace.record import TraceRequest
from traces.trace.stats import distribution, format_stats, hit_ceiling, trace_stats


def req(blocks: tuple[int, ...], length: int, session: str = "s") -> TraceRequest:
    return TraceRequest(0.0, session, 1, length, 1, blocks)


def test_hit_ceiling_counts_leading_seen_blocks_only() -> None:
    requests = [
        req((1, 2, 3), 1200),  # cold: 0 hits
        req((1, 2, 4), 1100),  # 2 leading hits
        req((9, 2, 3), 1500),  # block 2, 3 were seen but block 9 was not: 0
        req((1, 2, 3), 1200),  # 3 hits, capped at 1200 tokens
    ]
    c = hit_ceiling(requests)
    assert (c.hit_blocks, c.total_blocks) == (5, 12)
    assert (c.hit_tokens, c.total_tokens) == (1024 + 1200, 5000)
    assert c.block_ratio == 5 / 12 and c.token_ratio == 2224 / 5000


def test_no_blocks_no_ceiling() -> None:
    c = hit_ceiling([req((), 100)])
    assert c.block_ratio is None and c.token_ratio is None


def test_distribution_is_nearest_rank() -> None:
    d = distribution(list(range(1, 101)))
    assert d == {"mean": 50.5, "p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert distribution([1, 1, 1, 43]) == {"mean": 11.5, "p50": 1, "p90": 43, "p99": 43, "max": 43}
    assert distribution([]) == {}


def test_mooncake_conversation_reference_figures(conversation: list[TraceRequest]) -> None:
    s = trace_stats(conversation)
    assert s["requests"] == 12_031
    assert s["span_s"] == 3536.999
    assert round(s["hit_ceiling"], 3) == 0.366  # the team's reference figure
    assert (s["hit_blocks"], s["blocks"]) == (105_710, 288_500)
    assert round(s["hit_ceiling_tokens"], 3) == 0.374
    assert s["sessions"] == 7_373
    assert s["multi_turn_sessions"] == 2_259
    t = s["turns_per_session"]
    assert (t["p50"], t["p90"], t["p99"], t["max"]) == (1, 3, 8, 43)
    assert s["input_length"]["max"] == 126_195
    text = format_stats(s)
    assert "36.6% of 288,500 blocks" in text and "12,031" in text


def test_other_real_traces(shared: Callable) -> None:
    weka = trace_stats(load_trace(shared("weka_kv_cache_tester")))
    assert (weka["requests"], weka["sessions"]) == (3_256, 53)
    assert weka["hit_ceiling"] == pytest.approx(0.95, abs=0.005)
    azure = trace_stats(load_trace(shared("AzureLLMInferenceTrace_code.csv")))
    assert azure["hit_ceiling"] is None and azure["sessions"] == 8_819
    assert "n/a (no block keys)" in format_stats(azure)
    synthetic = trace_stats(load_trace(shared("synthetic_trace.jsonl")))
    assert synthetic["hit_ceiling"] == pytest.approx(0.640, abs=0.0005)

"""The simulator-only oracle: LMetric on the worker models' truth, and the x-oracle report."""

from __future__ import annotations

from pathlib import Path

import pytest

import traces
from router.config import Settings
from traces.commands.options import make_sim_picker, parse_policies
from traces.commands.run_simulate import run_policies
from traces.reports.results import markdown_table, results_document
from traces.sim.config import SimConfig
from traces.sim.oracle import OraclePicker, TruthView
from traces.sim.simulator import make_worker_states
from traces.sim.worker_model import SimRequest, WorkerModel
from traces.trace.formats import load_trace

CONVERSATION = Path(traces.__file__).parent / "data" / "conversation_sample.jsonl"


def test_truth_view_counts_queued_blocks_and_their_prefill():
    config = SimConfig(workers=1)
    state = make_worker_states(config)[0]
    model = WorkerModel(config.worker)
    view = TruthView(state, model)
    first = SimRequest((1, 2, 3), 1536, 4)
    model.submit(first, 0.0)
    view.queue(first)
    # not admitted yet: the model's cache is empty, but the queued request's blocks count
    assert view.estimate_cache_hit((1, 2, 9)) == 1024
    assert view.pending_prefill_tokens == 1536
    second = SimRequest((1, 2, 3, 4), 2048, 4)
    model.submit(second, 0.0)
    view.queue(second)  # shares 3 blocks with the first: 512 uncached
    assert view.pending_prefill_tokens == 1536 + 512
    assert view.num_requests == 2
    model.advance(0.0)  # both admitted: now the cache and the running prefill tell
    assert model.num_waiting == 0
    assert view.estimate_cache_hit((1, 2, 3, 4, 5)) == 2048
    assert view.pending_prefill_tokens == 1536 + 512


def test_oracle_is_offline_only():
    assert parse_policies("oracle,ttft", offline=True) == ["oracle", "ttft"]
    with pytest.raises(ValueError, match="unknown policies"):
        parse_policies("oracle")  # sweep and serve cannot run it
    assert isinstance(make_sim_picker("oracle"), OraclePicker)
    with pytest.raises(ValueError, match="unknown picker 'oracle'"):
        Settings(policy="oracle")


def test_reports_gain_x_oracle_columns_and_ttft_stays_near_the_oracle():
    trace = load_trace(CONVERSATION)
    runs = run_policies(trace, ["ttft", "oracle", "lmetric"], SimConfig(workers=4))
    doc = results_document({"name": "sample"}, 4, 0.0, runs)
    oracle, ttft = doc["policies"]["oracle"], doc["policies"]["ttft"]
    assert oracle["ttft_p90_x_oracle"] == 1.0
    assert ttft["ttft_p90_x_oracle"] == pytest.approx(ttft["ttft_p90"] / oracle["ttft_p90"])
    # the bar's shape on the bundled sample: ttft's p90 within 5% of the oracle's
    assert ttft["ttft_p90_x_oracle"] <= 1.05
    assert markdown_table(doc).splitlines()[0].count("x oracle") == 3
    without = results_document({"name": "sample"}, 4, 0.0, runs[:1])
    assert "x oracle" not in markdown_table(without)
    assert "ttft_p90_x_oracle" not in without["policies"]["ttft"]

"""bench/pickers/retention_what_if.py: what keeping returning sessions' blocks would buy."""

from __future__ import annotations

import pytest

from traces.trace.record import TraceRequest


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("pickers/retention_what_if")


def test_kept_blocks_go_after_every_plain_one(bench) -> None:
    cache = bench.KeptLRU(capacity_blocks=4)
    cache.insert([1, 2], keep=True)
    cache.insert([3, 4], keep=False)
    cache.insert([5], keep=False)  # over capacity: the oldest plain block goes, not 1
    assert cache.prefix([1, 2]) == 2
    assert cache.prefix([3]) == 0 and cache.prefix([4]) == 1
    # a plain LRU would have evicted block 1 (the oldest)
    plain = bench.KeptLRU(capacity_blocks=4)
    for blocks in ([1, 2], [3, 4], [5]):
        plain.insert(blocks, keep=False)
    assert plain.prefix([1, 2]) == 0


def test_kept_share_is_bounded(bench) -> None:
    cache = bench.KeptLRU(capacity_blocks=10)
    cache.insert(list(range(9)), keep=True)  # 9 kept > 80% of 10: the oldest one turns plain
    assert len(cache.kept) == 8 and list(cache.plain) == [0]
    cache.insert([100, 101], keep=False)  # over capacity: the plain ones go first, 0 oldest
    assert cache.prefix([0]) == 0 and cache.prefix([1]) == 1


def _req(i: int, t: float, session: str, turn: int, blocks: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(t, session, turn, 512 * len(blocks), 1, blocks, request_id=i)


def test_foresight_keeps_the_session_that_returns(bench) -> None:
    # one worker of 4 blocks: session a's first turn, then two one-off prompts that push it
    # out of a plain LRU, then a's second turn
    trace = [
        _req(0, 0.0, "a", 1, (1, 2)),
        _req(1, 1.0, "b", 1, (10, 11)),
        _req(2, 2.0, "c", 1, (20, 21)),
        _req(3, 3.0, "a", 2, (1, 2, 3)),
    ]
    assert bench.comes_back(trace) == {0}
    lru = bench.route(trace, 1, 4, lambda r: False)
    kept = bench.route(trace, 1, 4, lambda r: r.request_id in {0})
    assert list(lru) == [0, 0, 0, 0]
    assert list(kept) == [0, 0, 0, 2]
    assert bench.hit_rate(trace, kept) == pytest.approx(100 * 1024 / (512 * 9))


def test_learned_rule_labels_from_what_the_router_saw(bench) -> None:
    # first turns of 1,024 tokens (one class); a and b come back, c is last
    trace = [
        _req(0, 0.0, "a", 1, (1, 2)),
        _req(1, 1.0, "a", 2, (1, 2, 3)),
        _req(2, 2.0, "b", 1, (4, 5)),
        _req(3, 3.0, "b", 2, (4, 5, 6)),
        _req(4, 4.0, "c", 1, (7, 8)),
    ]
    keep = bench.learned(label_after=100.0, threshold=0.3)
    decisions = [keep(r) for r in trace]
    # a's first turn reads the 1/5 prior (< 0.3); once a returns the class reads 2/6 and b's
    # first turn is kept; once b returns, 3/7, and c's is kept
    assert decisions[0] is False
    assert decisions[2] is True and decisions[4] is True
    # a label of "did not come back" after label_after seconds pulls the rate down
    keep = bench.learned(label_after=0.5, threshold=0.3)
    assert [keep(r) for r in trace][4] is False


def test_main_with_its_defaults_prints_every_row(bench, data, capsys) -> None:
    assert bench.main(["--trace", str(data / "mooncake_conversation_head200.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "8 workers x 1,000,000 tokens" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 2 + 3 + 3  # header, lru and turn >= 2, 3 label times, the rest
    hits = {r.split(" | ")[0][2:]: float(r.rstrip(" |").split(" | ")[1]) for r in rows[1:]}
    assert hits["foresight"] <= hits["Belady's pooled ceiling"] + 1e-9

"""Analysis: Belady is optimal, replay equals the loader, the command runs."""

from __future__ import annotations

import functools
import itertools
import json

import dgl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgraph
from hmgraph.analysis import reuse_filtered, trace_stats
from hmgraph.cache.plan import replay
from hmgraph.cache.policies import BeladyPolicy, make_policy
from hmgraph.cli import main


def brute_force_hits(trace, num_rows, capacity) -> int:
    """The most hits any cache of `capacity` rows can get (prefill free)."""
    batches = [frozenset(t.tolist()) for t in trace]

    @functools.cache
    def best(index, held):
        if index == len(batches):
            return 0
        batch = batches[index]
        hits = len(held & batch)
        pool = sorted(held | batch)
        return hits + max(
            best(index + 1, frozenset(keep))
            for size in range(min(capacity, len(pool)) + 1)
            for keep in itertools.combinations(pool, size))

    return max(best(0, frozenset(start))
               for size in range(capacity + 1)
               for start in itertools.combinations(range(num_rows), size))


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.sets(st.integers(0, 5), min_size=1, max_size=4),
                        min_size=1, max_size=5),
       capacity=st.integers(0, 3))
def test_belady_equals_brute_force(batches, capacity):
    trace = [torch.tensor(sorted(b), dtype=torch.int64) for b in batches]
    opt = BeladyPolicy(6, capacity)
    opt.set_trace(trace)
    requested = sum(len(b) for b in batches)
    hits = round(replay(opt, trace) * requested)
    assert hits == brute_force_hits(trace, 6, capacity)


@pytest.mark.parametrize("policy", ["lru", "hmgraph"])
def test_replay_equals_what_the_loader_counts(tiny, policy):
    row_bytes = tiny.feat_dim * 4
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"],
        dgl.dataloading.NeighborSampler([4, 3]), batch_size=100,
        shuffle=True, cache=policy, device_budget_bytes=0,
        host_budget_bytes=1500 * row_bytes, prefetch=2, window=4,
        profile_batches=4)
    loader.trace = []
    for _ in loader:
        pass
    counted = loader.stats.cache.hits.get("host", 0)
    plan = loader.plan
    if policy == "hmgraph":
        fresh = make_policy("hmgraph", tiny.num_nodes, plan.host_rows,
                            hotness=loader.profile.counts,
                            static_rows=plan.static_rows, window=4)
    else:
        fresh = make_policy("lru", tiny.num_nodes, plan.host_rows)
    requested = sum(t.numel() for t in loader.trace)
    assert requested == loader.stats.cache.rows_requested
    assert round(replay(fresh, loader.trace) * requested) == counted
    loader.close()


def test_reuse_filter_and_stats():
    trace = [torch.tensor(t) for t in ([1, 2, 3], [2, 3, 4], [1, 4, 5])]
    rest, reused = reuse_filtered(trace, 1)
    assert reused == 3 and [r.tolist() for r in rest] == [[1, 2, 3], [4],
                                                          [1, 5]]
    rest, reused = reuse_filtered(trace, 2)
    assert reused == 4 and rest[2].tolist() == [5]
    hops = torch.zeros(2, 6, dtype=torch.int64)
    stats = trace_stats(trace, hops, torch.arange(6), 6)
    assert stats["accesses"] == 9 and stats["rows_touched"] == 5
    assert stats["adjacent_overlap"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    # Distances to the next use: 2->1, 3->1, 1->2, 4->1.
    assert stats["reuse_distance"]["counts"][:2] == [3, 1]
    assert stats["reuse_distance"]["never"] == 5


def test_analyze_command(data_root, tiny, tmp_path, capsys):
    code = main(["analyze", "--dataset", "synth-tiny", "--root",
                 str(data_root), "--batch-size", "256", "--budgets",
                 "2,10,40", "--profile-batches", "3", "--out",
                 str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "analyze-synth-tiny.json").read_text())
    opt = result["hit_rate"]["belady"]
    for name, row in result["hit_rate"].items():
        if "reuse" not in name:
            for budget, rate in row.items():
                assert rate <= opt[budget] + 1e-9, (name, budget)
    assert set(result["hit_rate"]) >= {"degree", "presample", "lru",
                                       "clock", "layer-aware",
                                       "hmgraph-w0", "hmgraph-w16",
                                       "hmgraph+reuse2", "belady"}
    for suffix in ("hit-rate.png", "tiers.png", "frequency-cdf.png"):
        assert (tmp_path / f"analyze-synth-tiny-{suffix}").stat().st_size
    assert "Gap to OPT" in (tmp_path / "analyze-synth-tiny.md").read_text()
    assert "| belady |" in capsys.readouterr().out


def test_analyze_rejects_bad_budgets(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--budgets", "5,0"])
    assert "invalid budgets '5,0'" in capsys.readouterr().err

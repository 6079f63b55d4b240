"""Analysis: Belady is optimal, replay equals the loader, the command runs,
misses are costed in the storage blocks they read."""

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
from hmgraph.analysis import (
    AnalysisConfig,
    PageView,
    analyze,
    reuse_filtered,
    summary_markdown,
    trace_stats,
)
from hmgraph.cache.plan import replay
from hmgraph.cache.policies import BeladyPolicy, make_policy
from hmgraph.cli import main
from hmgraph.samplers.presample import Profile, presample


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
    sampler = dgl.dataloading.NeighborSampler([4, 3])
    profile = presample(tiny.graph, sampler, tiny.split["train"], 100, 4)
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"], sampler, batch_size=100,
        shuffle=True, cache=policy, device_budget_bytes=0,
        host_budget_bytes=1500 * row_bytes, prefetch=2, window=4,
        profile=profile)
    loader.trace = []
    for _ in loader:
        pass
    counted = loader.stats.cache.hits.get("host", 0)
    plan = loader.plan["_N"]
    if policy == "hmgraph":
        fresh = make_policy("hmgraph", tiny.num_nodes, plan.host_rows,
                            hotness=profile.counts,
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
    for suffix in ("hit-rate.png", "tiers.png", "frequency-cdf.png",
                   "storage-bytes.png"):
        assert (tmp_path / f"analyze-synth-tiny-{suffix}").stat().st_size
    markdown = (tmp_path / "analyze-synth-tiny.md").read_text()
    assert "Gap to OPT" in markdown and "Storage reads per epoch" in markdown
    assert "| belady |" in capsys.readouterr().out
    view = result["page_view"]
    assert view["row_bytes"] == tiny.feat_dim * 4
    assert {r["block_bytes"] for r in result["bytes"]} == {
        4096, view["disk_block_bytes"]}
    assert len(result["bytes"]) == len(result["hit_rate"]) * 3 * len(
        {(r["layout"], r["block_bytes"]) for r in result["no_cache_bytes"]})


def test_analyze_cluster_trace_has_its_own_files(data_root, tmp_path):
    code = main(["analyze", "--dataset", "synth-tiny", "--root",
                 str(data_root), "--batch-size", "256", "--budgets", "5,20",
                 "--profile-batches", "2", "--sampler", "cluster",
                 "--clusters", "8", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads(
        (tmp_path / "analyze-synth-tiny-cluster.json").read_text())
    assert result["config"]["sampler"] == "cluster"
    assert result["commit"]["sha"]
    assert not (tmp_path / "analyze-synth-tiny.json").exists()
    assert (tmp_path / "analyze-synth-tiny-cluster-hit-rate.png").exists()


def test_analyze_rejects_bad_budgets(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--budgets", "5,0"])
    assert "invalid budgets '5,0'" in capsys.readouterr().err


def blocks_by_hand(ids, row_bytes, block_bytes, data_offset=4096):
    """Blocks and runs of adjacent blocks holding rows ``ids``, by sets."""
    blocks = sorted({block for i in ids
                     for block in range((data_offset + i * row_bytes)
                                        // block_bytes,
                                        (data_offset + (i + 1) * row_bytes
                                         - 1) // block_bytes + 1)})
    runs = sum(1 for a, b in zip([None, *blocks], blocks, strict=False)
               if a is None or b > a + 1)
    return len(blocks), runs


def test_page_view_cost_by_hand():
    # Rows of 1000 B from byte 4096. 4 KiB pages: rows 0, 1 in page 1,
    # row 5 in page 2, row 20 in pages 5-6: 4 pages in 2 runs. 512 B
    # blocks: rows 0-1 in 8-11, row 5 in 17-19, row 20 in 47-49.
    counts = torch.zeros(32, dtype=torch.int64)
    counts[torch.tensor([20, 5, 1, 0])] = torch.tensor([4, 3, 2, 1])
    view = PageView(1000, counts, (4096, 512))
    cost = view.cost(torch.tensor([0, 1, 5, 20]))
    assert cost[0].tolist() == [[4, 2], [10, 3]]
    # Hot-first: the four rows become rows 0-3, bytes 4096-8095.
    assert cost[1].tolist() == [[1, 1], [8, 1]]
    assert view.cost(torch.zeros(0, dtype=torch.int64)).sum() == 0


def test_page_view_rejects_bad_sizes():
    with pytest.raises(ValueError, match="row_bytes"):
        PageView(0, torch.zeros(4))
    with pytest.raises(ValueError, match="block sizes"):
        PageView(8, torch.zeros(4), (0,))


@settings(max_examples=60, deadline=None)
@given(rows=st.sets(st.integers(0, 199), max_size=40),
       row_bytes=st.sampled_from([4, 100, 512, 1000, 4096, 5000]),
       block_bytes=st.sampled_from([512, 4096]),
       seed=st.integers(0, 10))
def test_page_view_cost_equals_block_sets(rows, row_bytes, block_bytes,
                                          seed):
    counts = torch.randint(0, 5, (200,),
                           generator=torch.Generator().manual_seed(seed))
    view = PageView(row_bytes, counts, (block_bytes,))
    ids = torch.tensor(sorted(rows), dtype=torch.int64)
    cost = view.cost(ids)
    assert tuple(cost[0, 0]) == blocks_by_hand(ids.tolist(), row_bytes,
                                               block_bytes)
    order = torch.argsort(counts, descending=True, stable=True).tolist()
    hot = [order.index(i) for i in ids.tolist()]
    assert tuple(cost[1, 0]) == blocks_by_hand(hot, row_bytes, block_bytes)


def scattered_trace(num_rows=256, batches=6, seed=0):
    """Batches drawn from every 8th row (each in its own 4 KiB page at
    512 B rows), and a profile in which exactly those rows are hot."""
    generator = torch.Generator().manual_seed(seed)
    hot = torch.arange(0, num_rows, 8)
    trace = [hot[torch.randperm(hot.numel(), generator=generator)[:12]]
             .sort().values for _ in range(batches)]
    counts = torch.zeros(num_rows, dtype=torch.int64)
    counts[hot] = 1  # equally hot: hot-first keeps their order
    profile = Profile(counts=counts,
                      hop_counts=counts.unsqueeze(0).repeat(2, 1),
                      trace=trace)
    return trace, profile


def run_analyze(trace, profile, num_rows, budgets, **kwargs):
    config = AnalysisConfig(budgets=budgets, profile_batches=len(trace),
                            windows=(0, 4))
    return analyze(trace, profile.hop_counts, torch.arange(num_rows),
                   profile, num_rows, config, **kwargs)


def test_analyze_bytes_view():
    trace, profile = scattered_trace()
    result = run_analyze(trace, profile, 256, (0.0, 0.05, 0.2),
                         row_bytes=512, disk_block_bytes=512)
    assert result["hit_rate"] == run_analyze(
        trace, profile, 256, (0.0, 0.05, 0.2))["hit_rate"]
    none = {(r["layout"], r["block_bytes"]): r
            for r in result["no_cache_bytes"]}
    # A page per accessed row in file order; hot-first packs 8 in a page.
    accesses = sum(t.numel() for t in trace)
    assert none["file", 4096]["bytes"] == accesses * 4096
    assert none["file", 512]["bytes"] == accesses * 512
    # Hot-first, row 8 k becomes row k: 8 rows of 512 B a page.
    hot_pages = sum(len({int(i) // 8 // 8 for i in t}) for t in trace)
    assert none["hot-first", 4096]["bytes"] == hot_pages * 4096
    assert none["hot-first", 4096]["bytes"] < none["file", 4096]["bytes"]
    records = result["bytes"]
    assert len(records) == len(result["hit_rate"]) * 3 * 2 * 2
    for r in records:
        reference = none[r["layout"], r["block_bytes"]]
        # Misses are a subset of the batch, so are their blocks (not so
        # their requests: a hit inside a run splits it).
        assert r["bytes"] <= reference["bytes"], r
        assert 0.0 <= r["vs_no_cache"] <= 1.0, r
        assert r["bytes"] % r["block_bytes"] == 0
        if r["policy"] == "belady" and r["bytes"]:
            assert r["vs_belady"] == 1.0
        if r["budget"] == 0.0 and "reuse" not in r["policy"]:
            # No capacity: every policy misses every row.
            assert r["bytes"] == reference["bytes"], r
    markdown = summary_markdown(result)
    table = markdown[markdown.index("| policy | budget |"):].splitlines()
    assert len(table) == 2 + len(result["hit_rate"]) * 3
    assert {line.count("|") for line in table} == {11}
    assert "| lru | 5% |" in markdown


def test_analyze_without_row_bytes_has_no_bytes_view():
    trace, profile = scattered_trace(batches=3)
    result = run_analyze(trace, profile, 256, (0.1,))
    assert "bytes" not in result
    assert "Storage reads" not in summary_markdown(result)

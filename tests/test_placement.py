"""Placement and staging priced on the profile for a file read through
gaps: static rows held as whole spans (`hmgraph.cache.placement`), window
read planning replayed (`hmgraph.cache.staging_model`)."""

import logging

import dgl
import numpy as np
import pytest
import torch

import hmgraph
from hmgraph.cache.costs import KernelCosts, staging_verdict, static_verdict
from hmgraph.cache.disk import DiskModel
from hmgraph.cache.format import write_feature_file
from hmgraph.cache.placement import choose_span_rows, read_seconds, span_score
from hmgraph.cache.staging_model import StagedReads, staged_reads
from hmgraph.cache.storage import StorageFeature

#: 4,000 reads/s and 400 MB/s: a gap under 100 KB is read through.
MODEL = DiskModel(block_bytes=512, iops=4_000.0, bandwidth=400e6,
                  queue_depth=4)


def _top(score: torch.Tensor, k: int) -> list[int]:
    """The ``k`` rows a static placement holds by ``score``."""
    return torch.argsort(score, descending=True, stable=True)[:k].tolist()


def test_span_score_holds_the_first_rows_then_the_densest_spans():
    #        span 0        span 1        span 2
    score = torch.tensor([0, 9, 0, 0, 2, 2, 2, 2, 1, 1, 1, 8])
    spans = span_score(score, 2, 4)
    # Rows 1 and 11 by hotness; then span 1 (mean 2), then span 2 (mean
    # 1 without row 11), then span 0 (mean 0 without row 1).
    assert _top(spans, 2) == [1, 11]
    assert _top(spans, 6) == [1, 11, 4, 5, 6, 7]
    assert _top(spans, 12) == [1, 11, 4, 5, 6, 7, 8, 9, 10, 0, 2, 3]
    # No rows first: the spans alone, equal spans in file order.
    assert _top(span_score(torch.ones(6), 0, 2), 6) == list(range(6))
    assert _top(span_score(score, 0, 4), 4) == [8, 9, 10, 11]
    with pytest.raises(ValueError, match="span_rows must be positive, got 0"):
        span_score(score, 0, 0)


def _storage(path, rows):
    write_feature_file(path, rows)
    return StorageFeature(path, disk=MODEL)


def _dense_trace(n, batches, share, seed=0):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(np.flatnonzero(rng.random(n) < share))
            for _ in range(batches)]


def test_dense_batches_hold_spans(tmp_path):
    """Batches asking for 80% of 400 B rows: the hottest rows lie in
    gaps read through, spans of them are not read."""
    n = 20_000
    source = _storage(tmp_path / "f.bin", np.zeros((n, 100), np.float32))
    trace = _dense_trace(n, 8, 0.8)
    span, seconds = choose_span_rows(source, trace, 0, n // 4)
    gap_rows = -(-source.max_gap_bytes // 400)
    assert span in {m * gap_rows for m in (2, 8, 32)}
    assert seconds[span] < 0.9 * seconds[0]
    # What was priced is what the tier would read: the hottest rows save
    # nothing (every gap they leave is read through).
    nothing = read_seconds(source, trace[4:], np.zeros(n, dtype=bool))
    assert seconds[0] == pytest.approx(nothing, rel=0.01)
    # Spans held by the first rows are kept out of what the rest takes.
    assert choose_span_rows(source, trace, n // 4, n // 4) == (0, {})
    source.close()


def test_sparse_batches_hold_the_hottest_rows(tmp_path):
    """4 KiB rows, each batch a few hot rows and a few cold ones far
    apart: spans would hold cold rows, the hottest rows save reads."""
    n = 4_000
    source = _storage(tmp_path / "f.bin", np.zeros((n, 1024), np.float32))
    rng = np.random.default_rng(1)
    hot = rng.choice(n, 200, replace=False)
    trace = [torch.from_numpy(np.unique(np.concatenate(
        [hot, rng.choice(n, 20, replace=False)]))) for _ in range(8)]
    span, seconds = choose_span_rows(source, trace, 0, 200)
    assert span == 0 and seconds[0] < min(seconds.values()) + 1e-12
    # No disk model (rows in memory) or no profile: nothing to choose.
    assert choose_span_rows(hmgraph.cache.feature.TensorFeature(
        torch.zeros(n, 4)), trace, 0, 200) == (0, {})
    assert choose_span_rows(source, trace[:1], 0, 200) == (0, {})
    source.close()


def test_loader_holds_spans_and_returns_the_file_rows(tmp_path, caplog):
    """A dense workload through `hmgraph.DataLoader`: the plan holds its
    static rows in spans, said in one log line, and every batch's rows
    equal the file's."""
    n = 6_000
    dgl.seed(0)
    graph = dgl.rand_graph(n, 120_000)
    rows = np.random.default_rng(2).standard_normal((n, 100)).astype(
        np.float32)
    source = _storage(tmp_path / "f.bin", rows)
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        loader = hmgraph.DataLoader(
            graph, torch.arange(n), dgl.dataloading.NeighborSampler([10, 10]),
            batch_size=256, shuffle=True, features=source, cache="hmgraph",
            device_budget_bytes=0, host_budget_bytes=n * 400 // 4,
            prefetch=0, seed=0)
    try:
        plan = next(iter(loader.plan.values()))
        # Every row the replay keeps is static, with no window: the plan
        # is presample's, whose bookkeeping leaves room for more rows.
        assert plan.policy == "presample" and plan.span_rows > 0
        assert plan.held_rows > 0
        assert "hmgraph with every row static and no window: presample's " \
            f"plan, {plan.held_rows} rows held against " in caplog.text
        assert "static rows in spans of" in caplog.text
        assert f"spans of {plan.span_rows}" in plan.describe()
        for batch in loader:
            assert torch.equal(batch.x, torch.from_numpy(
                rows[batch.input_nodes.numpy()]))
    finally:
        loader.close()
        source.close()


class _File:
    """What the staging replay reads of a storage tier: 8-byte rows (64
    a block of 512 B), no gap read through, 1,000 reads/s and 1 MB/s."""

    num_rows = 1024
    geometry = (8, 0, 512)
    max_gap_blocks = 0
    disk = DiskModel(iops=1000.0, bandwidth=1e6, queue_depth=1,
                     block_bytes=512)


def test_staging_replay_brings_along_what_the_runs_cover():
    misses = [np.array(ids) for ids in ([0, 128], [1, 129], [2, 300])]
    block = 512 / 1e6
    # Batch 0 reads blocks 0 and 2; rows 1, 129 (batch 1) and 2 (batch
    # 2) lie on them and come along; 300 (block 4) does not. Batch 1 is
    # served whole, batch 2 reads block 4 alone.
    staged = staged_reads(_File(), misses, 2, 10)
    assert staged.seconds == pytest.approx(
        (2 / 1000 + 2 * block + 0 + 1 / 1000 + block) / 3)
    assert staged.staged == pytest.approx(3 / 3)
    assert staged.served == pytest.approx(3 / 3)
    # No room: every batch reads its own blocks.
    off = staged_reads(_File(), misses, 2, 0)
    assert off.seconds == pytest.approx(3 * (2 / 1000 + 2 * block) / 3)
    assert off.staged == off.served == 0
    # Room for one row: the soonest needed (batch 1's row 1) comes along.
    one = staged_reads(_File(), misses, 2, 1)
    assert one.staged == pytest.approx(1 / 3)
    assert one.served == pytest.approx(1 / 3)
    # A window of one batch: batch 2's row 2 is not brought by batch 0.
    near = staged_reads(_File(), misses, 1, 10)
    assert near.staged == pytest.approx(2 / 3)


def test_staging_verdict_weighs_the_reads_against_its_work():
    costs = KernelCosts(scan=10e-9, stamp=5e-9, sort_pass=2e-9,
                        copy_row=40e-9, row_bytes=400)
    verdict = staging_verdict(4, 1000.0, 500, 0.010,
                              StagedReads(0.006, 200.0, 150.0), costs)
    assert verdict.saves == pytest.approx(0.004)
    assert verdict.costs == pytest.approx(4 * 1000 * 15e-9
                                          + 2 * 200 * 40e-9)
    assert verdict.pays and "200 rows a batch brought along into 500 " \
        "host rows" in verdict.describe("staging=0.5")
    # The host rows it takes from the cache read more than it spares.
    worse = staging_verdict(4, 1000.0, 500, 0.010,
                            StagedReads(0.011, 200.0, 150.0), costs)
    assert not worse.pays
    assert worse.describe("staging=0.5").startswith(
        "window read planning off: saves -1.00 ms")


def test_static_verdict_weighs_the_dynamic_region_against_its_work():
    costs = KernelCosts(scan=10e-9, stamp=5e-9, sort_pass=2e-9,
                        copy_row=40e-9, row_bytes=400)
    # Reads of 10 ms all static, 6 ms with the window's region and
    # staging: 4 ms saved against the window's marks and staged copies.
    kept = static_verdict(4, 1000.0, StagedReads(0.006, 200.0, 150.0),
                          0.010, 448, costs)
    assert kept.saves == pytest.approx(0.004)
    assert kept.costs == pytest.approx(4 * 1000 * 15e-9 + 2 * 200 * 40e-9)
    assert kept.pays and "every row static (in spans of 448)" in \
        kept.describe("window=4")
    # Spans read within 0.1 ms of the region's: its work does not pay.
    off = static_verdict(4, 100_000.0, StagedReads(0.0099, 200.0, 150.0),
                         0.010, 0, costs)
    assert not off.pays
    line = off.describe("window=4")
    assert line.startswith("the dynamic region off: saves 0.10 ms")
    assert "(by hotness)" in line and line.endswith("window=4 forces it")


@pytest.mark.parametrize("batch_size", [8, 512], ids=["sparse", "dense"])
def test_the_dynamic_region_follows_its_verdict(data_root, batch_size,
                                                caplog):
    """synth-tiny from the disk: where ``hmgraph``'s plan keeps a dynamic
    region, it is priced against every row static and said in one log
    line; off, the plan is presample's, in spans where they pay. Rows
    equal the file's either way, and an explicit window keeps the
    region without pricing it."""
    from hmgraph import datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    sampler = dgl.dataloading.NeighborSampler([10, 10])
    options = dict(batch_size=batch_size, cache="hmgraph", seed=0,
                   host_budget_bytes=data.feature_bytes // 5,
                   profile_batches=8, features=data.feature_path)
    seeds = data.split["train"][:8 * batch_size]
    rows = datasets.load("synth-tiny", data_root).features
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        loader = hmgraph.DataLoader(data.graph, seeds, sampler, **options)
    said = [r.getMessage() for r in caplog.records]
    verdicts = [s for s in said if s.startswith("the dynamic region")]
    plan = loader.plan["_N"]
    static = any(s.startswith("hmgraph with every row static")
                 for s in said)
    assert len(verdicts) <= 1 and (verdicts or static), said
    if verdicts and verdicts[0].startswith("the dynamic region on"):
        assert plan.policy == "hmgraph" and not static
    else:
        assert plan.policy == "presample" and plan.window == 0 and static
        assert loader.window == 0
    try:
        for batch in loader:
            assert torch.equal(batch.x, rows[batch.input_nodes])
    finally:
        loader.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        forced = hmgraph.DataLoader(data.graph, seeds, sampler, window=4,
                                    **options)
    forced.close()
    assert forced.plan["_N"].policy == "hmgraph"
    assert forced.plan["_N"].window == 4
    assert "the dynamic region" not in caplog.text


def test_a_static_plan_with_staging_keeps_the_window_it_stages_for(
        data_root):
    """``presample`` with a staging area and the window left to the
    planner: the plan carries the window staging was planned with, the
    loader looks that far ahead, and the staging area serves rows (at
    the window's default of 0 it held them and served none)."""
    from hmgraph import datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    rows = datasets.load("synth-tiny", data_root).features
    sampler = dgl.dataloading.NeighborSampler([10, 10])
    seeds = data.split["train"][:8 * 64]
    loader = hmgraph.DataLoader(
        data.graph, seeds, sampler, batch_size=64, cache="presample",
        seed=0, host_budget_bytes=data.feature_bytes // 5, staging=0.5,
        profile_batches=8, features=data.feature_path)
    try:
        plan = loader.plan["_N"]
        assert plan.policy == "presample" and plan.staging_rows > 0
        assert plan.window == 4 and loader.window == 4
        for batch in loader:
            assert torch.equal(batch.x, rows[batch.input_nodes])
        assert loader.stats.hit_rate("staged") > 0
    finally:
        loader.close()

"""The shared bench harness (`hmgraph.benchmark`, `bench/common.py`)."""

import json
import re

import numpy as np
import pytest
from benchscripts import load_bench

from hmgraph import benchmark
from hmgraph.args import budget_text, name_list

common = load_bench("common")


def test_amortized_adds_construction_once_over_the_epochs():
    assert benchmark.amortized(10.0, 2.0, 1.0, 10) == pytest.approx(3.0)
    assert benchmark.amortized(0.0, 2.0, 4.0, 5) == pytest.approx(0.5)
    assert benchmark.amortized(1.0, 2.0, None) is None


def test_targets_are_judged_and_tabled_once():
    rows = [common.target(1, "a", 0.5, "<=", 0.7),
            common.target(2, "b", 2.0, ">=", 3, note="built in 4 s"),
            common.target(3, "c", None, "<=", 1)]
    assert [t["verdict"] for t in rows] == ["PASS", "MISS", "not run"]
    table = common.targets_table(rows).splitlines()
    assert table[0] == "| # | target | value | limit | verdict |"
    assert table[3] == "| 2 | b (built in 4 s) | 2.00 | >= 3 | **MISS** |"
    assert table[4].endswith("| - | <= 1 | **not run** |")


def test_markdown_table_formats_and_aligns():
    table = benchmark.markdown_table(
        ["name", "x", "n"], [["a", 0.43812, 12345], ["b", None, 1234.5]])
    assert table.splitlines()[1] == "|---|---:|---:|"
    assert "| a | 0.438 | 12,345 |" in table
    assert "| b | - | 1,234 |" in table


def test_markdown_table_takes_an_alignment():
    # A column of "-" would read as numbers: the caller says which is which.
    rows = [["a", "-", "1.0"]]
    table = benchmark.markdown_table(["name", "hits", "s"], rows, "llr")
    assert table.splitlines()[1] == "|---|---|---:|"
    assert benchmark.markdown_table(["name", "hits", "s"], rows) \
        .splitlines()[1] == "|---|---:|---:|"
    for bad in ("lr", "lrx"):
        with pytest.raises(ValueError, match="one of 'l' or 'r'"):
            benchmark.markdown_table(["name", "hits", "s"], rows, bad)


def test_results_name_their_commit(tmp_path):
    path = benchmark.write_results({"rows": [1]}, "# Title\n\nbody\n",
                                   tmp_path / "sub" / "r.json")
    result = json.loads(path.read_text())
    sha = result["commit"]["sha"]
    assert sha is None or re.fullmatch(r"[0-9a-f]{40}", sha)
    lines = path.with_suffix(".md").read_text().splitlines()
    assert lines[0] == "# Title" and lines[-1] == "body"
    assert (sha or "unknown") in lines[2]
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json",
                                                             "r.md"]


def test_a_result_of_parts_names_each_commit_once():
    a = {"sha": "a" * 40, "dirty": False}
    b = {"sha": "b" * 40, "dirty": True}
    assert benchmark.merged_commit([a, a]) == a
    # A part that recorded no commit is not claimed for ``a``.
    assert benchmark.merged_commit([a, None, a]) == {
        "sha": None, "dirty": None, "merged": [a]}
    assert benchmark.merged_commit([b, a, None, b]) == {
        "sha": None, "dirty": None, "merged": [b, a]}
    assert benchmark.merged_commit([None]) == benchmark.commit()


def test_name_list_refuses_unknown_and_repeated():
    parse = name_list(("a", "b"))
    assert parse("b,a") == ["b", "a"]
    for text in ("a,c", "a,a", ""):
        with pytest.raises(Exception, match="distinct names"):
            parse(text)
    assert budget_text("5%") == "5%"
    with pytest.raises(Exception, match="invalid budget '5 apples'"):
        budget_text("5 apples")


def test_dgl_epoch_drops_the_memmap_once_before_the_epoch(tiny):
    import dgl

    sampler = dgl.dataloading.NeighborSampler([5, 5])
    rows = benchmark.open_memmap(tiny.feature_path)
    model, optimizer = benchmark.new_model(tiny, 16, 2, 0)
    seeds = tiny.split["train"]
    cold = benchmark.dgl_epoch(tiny.graph, seeds, sampler, rows,
                               tiny.labels, model, optimizer,
                               batch_size=256, max_batches=2,
                               cold=tiny.feature_path, progress_bar=False)
    warm = benchmark.dgl_epoch(tiny.graph, seeds, sampler, tiny.features,
                               tiny.labels, batch_size=256,
                               progress_bar=False)
    assert cold["batches"] == 2 and warm["batches"] == warm[
        "epoch_batches"] == -(-seeds.numel() // 256)
    assert cold["seconds"]["drop"] > 0 and warm["seconds"]["drop"] == 0
    assert warm["mean_loss"] == 0 and cold["mean_loss"] > 0
    row_bytes = tiny.feat_dim * 4
    assert cold["input_bytes"] == cold["input_rows"] * row_bytes


def test_isolated_reports_failures_and_its_own_peak():
    with pytest.raises(benchmark.ConfigurationFailed,
                       match="configuration int failed: ValueError"):
        benchmark.isolated(int, "x")
    # The parent's peak is not the child's (as ru_maxrss would have it).
    ballast = np.ones(768 << 17)  # 768 MiB, touched
    child = benchmark.isolated(benchmark.peak_rss_bytes)
    assert benchmark.peak_rss_bytes() > ballast.nbytes > child

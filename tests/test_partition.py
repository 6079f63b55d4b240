"""hmgraph.partition: assignments, DGL's format, statistics, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from hmgraph.cli import main
from hmgraph.partition import (
    METHODS,
    assign,
    assign_and_count,
    edge_cut,
    read_partition_info,
)
from hmgraph.partition.methods import ldg_assign, replicas_from

FANOUTS = "10,5"


@pytest.fixture(scope="module")
def partitions(data_root, tmp_path_factory):
    """synth-tiny in 2 parts with every method, written by the CLI."""
    out = tmp_path_factory.mktemp("parts")
    folders = {}
    for method in METHODS:
        folder = out / method
        code = main(["partition", "--dataset", "synth-tiny", "--root",
                     str(data_root), "--parts", "2", "--method", method,
                     "--out", str(folder), "--fanouts", FANOUTS,
                     "--batch-size", "64", "--no-progress"])
        assert code == 0
        folders[method] = folder
    return folders


@pytest.mark.parametrize("method", METHODS)
def test_dgl_loads_every_part_and_rows_round_trip(partitions, tiny, method):
    import dgl
    from dgl.distributed import load_partition

    from hmgraph.cache.format import open_feature_file

    info = read_partition_info(partitions[method])
    _, rows = open_feature_file(tiny.feature_path)
    orig = np.load(partitions[method] / "orig_nids.npy")
    num_nodes = tiny.graph.num_nodes()
    assert sorted(orig.tolist()) == list(range(num_nodes))
    owner = np.full(num_nodes, -1)
    for part in range(2):
        graph, node_feats, _, gpb, name, ntypes, _ = load_partition(
            info["config"], part)
        assert name == "synth_tiny" and ntypes == ["_N"]
        inner = graph.ndata["inner_node"].bool()
        new_ids = graph.ndata[dgl.NID][inner].numpy()
        # Every vertex owned by exactly one part.
        assert (owner[new_ids] == -1).all()
        owner[new_ids] = part
        assert (gpb.nid2partid(torch.from_numpy(new_ids)) == part).all()
        # Features and labels of the owned vertices, by original id.
        np.testing.assert_array_equal(node_feats["_N/feat"].numpy(),
                                      rows[orig[new_ids]])
        np.testing.assert_array_equal(node_feats["_N/label"].numpy(),
                                      tiny.labels[orig[new_ids]].numpy())
        train = node_feats["_N/train_mask"].bool().numpy()
        assert set(orig[new_ids][train]) <= set(
            tiny.split["train"].tolist())
        # hmgraph's local store: owned + replicated rows, bit for bit.
        local = np.load(partitions[method] / f"part{part}" /
                        "local_ids.npy")
        assert set(new_ids) <= set(local)
        _, local_rows = open_feature_file(
            partitions[method] / f"part{part}" / "feat.bin")
        np.testing.assert_array_equal(np.asarray(local_rows),
                                      rows[orig[local]])
    assert (owner >= 0).all()
    assert info["replication_factor"] <= 1.5 + 1e-9
    if method in ("random", "metis"):
        assert info["replication_factor"] == 1.0


def test_self_dependence_halves_metis_remote_bytes(partitions):
    stats = {m: read_partition_info(partitions[m])["stats"]
             for m in METHODS}
    metis = stats["metis"]
    own = stats["self-dependence"]
    assert own["replication_factor"] <= 1.5
    assert own["remote_bytes"] <= 0.5 * metis["remote_bytes"]
    # METIS cuts far fewer edges than random assignment.
    assert metis["edge_cut"] < 0.5 * stats["random"]["edge_cut"]
    for method in METHODS:
        s = stats[method]
        assert s["remote_rows"] == sum(p["remote_rows"] for p in s["parts"])
        assert 0 < s["remote_rows"] < s["rows_read"]


def test_hierarchy_fits_hot_rows_to_each_machines_budget(data_root,
                                                         tmp_path):
    fills = {}
    for method in ("self-dependence", "hierarchy"):
        out = tmp_path / method
        assert main(["partition", "--dataset", "synth-tiny", "--root",
                     str(data_root), "--parts", "2", "--method", method,
                     "--out", str(out), "--fanouts", FANOUTS,
                     "--machine-budgets", "600KB,200KB",
                     "--no-progress"]) == 0
        info = read_partition_info(out)
        assert info["machine_budgets"] == [600_000, 200_000]
        fills[method] = [p["hot_fill"] for p in info["stats"]["parts"]]
    assert info["settings"]["hot_rows"] == 800_000 // 400
    # Equal parts overflow the small machine; hierarchy comes far closer
    # to filling both (hot rows follow training vertices, so it cannot
    # also keep those even: the docstring of hmgraph.partition.methods).
    assert fills["self-dependence"][1] > 1.5
    worst = max(abs(f - 1.0) for f in fills["hierarchy"])
    assert worst < 0.5 * max(abs(f - 1.0) for f in fills["self-dependence"])


def test_partition_replaces_an_old_folder_atomically(data_root, tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert main(["partition", "--dataset", "synth-tiny", "--root",
                 str(data_root), "--parts", "2", "--method", "random",
                 "--out", str(out), "--no-stats", "--no-progress"]) == 0
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "synth_tiny.json").read_text())["num_parts"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_assign_and_count_is_assign_then_the_epoch_counts(tiny):
    """The same assignment as `assign` with the same seed, its statistics
    (or none, with ``count=False``) and the seconds of each step."""
    train = tiny.split["train"]
    kwargs = dict(train_ids=train, fanouts=[5, 5], batch_size=128,
                  row_bytes=64, budgets=[6400, 6400], seed=3)
    alone = assign(tiny.graph, 2, "random", train_ids=train, seed=3)
    assignment, stats, seconds = assign_and_count(tiny.graph, 2, "random",
                                                  **kwargs)
    assert torch.equal(assignment.parts, alone.parts)
    assert stats["edge_cut"] == edge_cut(tiny.graph, alone.parts)
    assert len(stats["parts"]) == 2
    assert sum(p["train"] for p in stats["parts"]) == train.numel()
    assert set(seconds) == {"assign_seconds", "stats_seconds"}
    _, stats, _ = assign_and_count(tiny.graph, 2, "random", count=False,
                                   **kwargs)
    assert stats == {}


def test_ldg_keeps_connected_items_together_within_capacity():
    # Two cliques of 4 items, no edges between them; capacity 4 per bin.
    rows, cols = [], []
    for group in (range(4), range(4, 8)):
        for a in group:
            for b in group:
                if a != b:
                    rows.append(a)
                    cols.append(b)
    affinity = sp.coo_matrix((np.ones(len(rows)), (rows, cols)),
                             shape=(8, 8))
    bins = ldg_assign(np.ones((8, 1)), affinity, np.full((2, 1), 4.0))
    assert len(set(bins[:4])) == 1 and len(set(bins[4:])) == 1
    assert bins[0] != bins[4]


def test_replicas_are_the_most_read_vertices_owned_elsewhere():
    counts = torch.tensor([9, 0, 5, 7, 1, 3])
    owned = torch.tensor([True, False, False, False, False, False])
    assert replicas_from(counts, owned, 2).tolist() == [2, 3]
    # Never more than the vertices actually read.
    assert replicas_from(counts, owned, 10).tolist() == [2, 3, 4, 5]


def test_bad_input_is_one_clear_error(tiny, data_root, tmp_path, capsys):
    train = tiny.split["train"]
    with pytest.raises(ValueError, match="unknown partition method 'kway'"
                       ".*available: random, metis"):
        assign(tiny.graph, 2, "kway", train_ids=train)
    with pytest.raises(ValueError, match="num_parts=20000 is more than"):
        assign(tiny.graph, 20000, "random", train_ids=train)
    with pytest.raises(ValueError, match="training split is empty"):
        assign(tiny.graph, 2, "metis", train_ids=train[:0])
    code = main(["partition", "--dataset", "synth-tiny", "--root",
                 str(data_root), "--parts", "2", "--method", "hierarchy",
                 "--out", str(tmp_path / "x"), "--machine-budgets", "1MB"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hmgraph partition: error: --machine-budgets "
                              "lists 1 machines for --parts 2")
    assert not (tmp_path / "x").exists()


def test_partition_feature_serves_local_and_remote_rows_exactly(
        partitions, tiny):
    """A trainer's bottom tier: its store's rows locally, others remotely.

    The remote side is the whole feature matrix in reshuffled order (what
    the servers hold together); `DistTensor` indexes the same way.
    """
    from contract import check_feature_contract

    from hmgraph.cache.format import open_feature_file
    from hmgraph.cache.plan import CachePlan, build_cache
    from hmgraph.distributed.feature import PartitionFeature

    folder = partitions["self-dependence"]
    _, rows = open_feature_file(tiny.feature_path)
    orig = np.load(folder / "orig_nids.npy")
    reshuffled = np.asarray(rows)[orig]
    remote = torch.from_numpy(reshuffled)
    local = set(np.load(folder / "part0" / "local_ids.npy").tolist())
    feature = PartitionFeature(folder / "part0", remote)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, len(reshuffled), 3000)
    ids[:3] = [0, len(reshuffled) - 1, 0]
    check_feature_contract(feature, reshuffled, ids)
    expected_local = sum(int(i) in local for i in ids)
    assert feature.stats.local_rows == expected_local
    assert feature.stats.remote_rows == len(ids) - expected_local
    assert feature.stats.remote_bytes == 400 * feature.stats.remote_rows
    check_feature_contract(feature, reshuffled, ids[:0])
    # The coordinated cache on top returns the same rows.
    plan = CachePlan(policy="lru", num_rows=len(reshuffled), row_bytes=400,
                     device_rows=200, host_rows=800)
    cache = build_cache(feature, plan)
    for _ in range(2):
        check_feature_contract(cache, reshuffled, ids)
    feature.close()

"""Datasets: synthetic round trip through ogb, Planetoid, feature files."""

from __future__ import annotations

import gzip
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from readonly import read_only_copy, tree_state

from hmgraph import datasets
from hmgraph.cache.format import open_feature_file
from hmgraph.datasets.synthetic import SPECS, generate, make_synthetic


def test_synthetic_round_trip_through_ogb(tiny):
    """What ogb's saver wrote and its DGL reader read is what we made."""
    spec = SPECS["synth-tiny"]
    made = generate(spec)
    graph = tiny.graph
    assert graph.num_nodes() == spec.num_nodes
    # Every undirected edge, in both directions.
    src, dst = graph.edges()
    got = set(zip(src.tolist(), dst.tolist(), strict=True))
    a, b = made["edge_index"]
    want = {*zip(a.tolist(), b.tolist(), strict=True),
            *zip(b.tolist(), a.tolist(), strict=True)}
    assert got == want
    assert graph.num_edges() == 2 * made["edge_index"].shape[1]
    np.testing.assert_array_equal(tiny.features.numpy(), made["node_feat"])
    np.testing.assert_array_equal(tiny.labels.numpy(), made["label"])
    for part in ("train", "valid", "test"):
        np.testing.assert_array_equal(tiny.split[part].numpy(),
                                      made[part])
    assert tiny.num_classes == spec.num_classes
    assert tiny.evaluator.eval_metric == "acc"


def test_synthetic_shape(tiny):
    """Power-law degrees, labels tied to communities, a real split."""
    degrees = tiny.graph.in_degrees().float()
    spec = SPECS["synth-tiny"]
    assert abs(degrees.mean().item() - spec.avg_degree) < 0.5
    assert degrees.max() > 10 * degrees.mean()  # heavy tail: hubs
    split = tiny.split
    ids = torch.cat([split["train"], split["valid"], split["test"]])
    assert ids.unique().numel() == ids.numel() == spec.num_nodes
    # Neighbours mostly share a label (what a GNN exploits).
    src, dst = tiny.graph.edges()
    same = (tiny.labels[src] == tiny.labels[dst]).float().mean()
    assert same > 0.5


def test_generation_is_seeded():
    spec = SPECS["synth-tiny"]
    first, second = generate(spec), generate(spec)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


def test_generated_dataset_is_reused(data_root):
    folder = data_root / "synth_tiny"
    stamp = (folder / "raw" / "data.npz").stat().st_mtime_ns
    assert make_synthetic("synth-tiny", data_root) == folder
    assert (folder / "raw" / "data.npz").stat().st_mtime_ns == stamp


def test_feature_file_equals_features(tiny):
    manifest, rows = open_feature_file(tiny.feature_path, verify=True)
    assert manifest.shape == tuple(tiny.features.shape)
    assert manifest.dtype == "float32"
    np.testing.assert_array_equal(rows, tiny.features.numpy())


def test_planetoid_cora(shared_data, tmp_path, monkeypatch):
    """Cora from a folder without write bits: hmgraph's files go to its
    cache, and the folder is left exactly as it was."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HMGRAPH_CACHE", str(cache))
    with read_only_copy(shared_data / "Cora",
                        tmp_path / "data" / "Cora") as folder:
        before = tree_state(folder)
        cora = datasets.load("cora", folder.parent)
        assert tree_state(folder) == before
    assert cora.num_nodes == 2708
    assert cora.graph.num_edges() == 10556
    assert cora.feat_dim == 1433 and cora.num_classes == 7
    assert [cora.split[k].numel() for k in ("train", "valid", "test")] == [
        140, 500, 1000]
    assert torch.equal(cora.split["train"], torch.arange(140))
    counts = torch.bincount(cora.labels, minlength=7).tolist()
    assert counts == [351, 217, 418, 818, 426, 298, 180]
    # Rows are normalised; the feature file holds exactly them.
    sums = cora.features.sum(1)
    assert torch.allclose(sums[sums > 0], torch.ones(1))
    _, rows = open_feature_file(cora.feature_path, verify=True)
    np.testing.assert_array_equal(rows, cora.features.numpy())
    # The feature file went to the cache instead, in a folder named by
    # the source's content.
    assert cora.feature_path.parent.parent == cache / "cora"


def test_planetoid_writable_copy_keeps_files_beside_it(shared_data, tmp_path,
                                                       monkeypatch):
    """The other side of `test_planetoid_cora`: a folder with write bits
    gets hmgraph's files beside the data, and the cache stays empty."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HMGRAPH_CACHE", str(cache))
    folder = tmp_path / "data" / "Cora"
    shutil.copytree(shared_data / "Cora", folder,
                    copy_function=shutil.copyfile)
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    cora = datasets.load("cora", folder.parent)
    assert cora.feature_path.parent == folder / "hmgraph"
    assert not cache.exists()


#: A column order for Cora's 1433 features: a copy that differs from the
#: original in content only.
COLUMNS = np.random.default_rng(0).permutation(1433)


def _cora_copy(shared_data, folder: Path) -> Path:
    """A writable copy of Cora's Planetoid files in ``folder``."""
    shutil.copytree(shared_data / "Cora", folder,
                    copy_function=shutil.copyfile)
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def _permute_columns(folder: Path, columns: np.ndarray) -> None:
    """Rewrite Cora's feature matrices with their columns in ``columns``
    order (Python pickles, as the Planetoid files are)."""
    for part in ("x", "allx", "tx"):
        path = folder / f"ind.cora.{part}"
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # scipy
            matrix = pickle.load(f, encoding="latin1")
        path.write_bytes(pickle.dumps(matrix[:, columns], protocol=2))


def test_read_only_copies_that_differ_keep_their_own_features(
        shared_data, tmp_path, monkeypatch):
    """Two read-only copies of Cora, the second with its feature columns
    permuted, share one cache: each trains on its own rows."""
    monkeypatch.setenv("HMGRAPH_CACHE", str(tmp_path / "cache"))
    first = _cora_copy(shared_data, tmp_path / "a" / "Cora")
    second = _cora_copy(shared_data, tmp_path / "b" / "Cora")
    _permute_columns(second, COLUMNS)
    with read_only_copy(first, tmp_path / "ro-a" / "Cora") as a, \
            read_only_copy(second, tmp_path / "ro-b" / "Cora") as b:
        loads = [(a, datasets.load("cora", a.parent, features_on="disk")),
                 (b, datasets.load("cora", b.parent, features_on="disk")),
                 (a, datasets.load("cora", a.parent, features_on="disk"))]
    rows = {folder: np.asarray(data.features) for folder, data in loads}
    np.testing.assert_array_equal(rows[b], rows[a][:, COLUMNS])
    assert loads[0][1].feature_path == loads[2][1].feature_path
    assert loads[0][1].feature_path != loads[1][1].feature_path
    for folder, data in loads:
        _, stored = open_feature_file(data.feature_path, verify=True)
        np.testing.assert_array_equal(stored, rows[folder])


def test_feature_file_follows_its_source_changed_in_place(shared_data,
                                                         tmp_path):
    """A writable copy whose files change: the feature file beside it is
    checked against the rows read from them and written again."""
    folder = _cora_copy(shared_data, tmp_path / "data" / "Cora")
    before = np.asarray(datasets.load("cora", folder.parent,
                                      features_on="disk").features)
    _permute_columns(folder, COLUMNS)
    after = datasets.load("cora", folder.parent, features_on="disk")
    np.testing.assert_array_equal(np.asarray(after.features),
                                  before[:, COLUMNS])
    memory = datasets.load("cora", folder.parent)
    np.testing.assert_array_equal(memory.features.numpy(),
                                  before[:, COLUMNS])


def test_read_only_ogbg_copies_are_cached_per_content(shared_data, tmp_path,
                                                      monkeypatch):
    """Two read-only copies of ogbg_molbace that differ in one file get
    one cached (writable) copy each, holding that copy's files."""
    from hmgraph.datasets.graphprop import _writable_copy

    if not (shared_data / "ogbg_molbace").is_dir():
        pytest.skip(f"ogbg_molbace not in {shared_data}")
    monkeypatch.setenv("HMGRAPH_CACHE", str(tmp_path / "cache"))
    other = tmp_path / "other" / "ogbg_molbace"
    shutil.copytree(shared_data / "ogbg_molbace", other,
                    copy_function=shutil.copyfile)
    labels = other / "raw" / "graph-label.csv.gz"
    labels.chmod(0o644)
    with gzip.open(labels, "rt") as f:
        flipped = "".join(f"{1 - int(line)}\n" for line in f)
    with gzip.open(labels, "wt") as f:
        f.write(flipped)
    with read_only_copy(shared_data / "ogbg_molbace",
                        tmp_path / "ro-a" / "ogbg_molbace") as a, \
            read_only_copy(other, tmp_path / "ro-b" / "ogbg_molbace") as b:
        copies = {a: _writable_copy(a), b: _writable_copy(b)}
        assert copies[a] != copies[b]
        assert _writable_copy(a) == copies[a]
        for source, copy in copies.items():
            assert copy.name == "ogbg_molbace"
            for path in source.rglob("*.csv.gz"):
                target = copy / path.relative_to(source)
                assert target.read_bytes() == path.read_bytes(), target


def test_planetoid_citeseer(shared_data):
    citeseer = datasets.load("citeseer", shared_data)
    assert citeseer.num_nodes == 3327 and citeseer.num_classes == 6
    assert citeseer.split["test"].numel() == 1000


ERRORS = {
    "unknown-name": ("cora2", "unknown dataset 'cora2'; known: synth-tiny"),
    "pubmed-missing": ("pubmed", "pubmed not found under"),
}


@pytest.mark.parametrize("name,match", ERRORS.values(), ids=ERRORS.keys())
def test_load_errors(tmp_path, name, match):
    with pytest.raises(datasets.DatasetError, match=match):
        datasets.load(name, tmp_path)


def test_missing_root(tmp_path):
    with pytest.raises(datasets.DatasetError, match="does not exist"):
        datasets.load("synth-tiny", tmp_path / "nope")


def test_ogb_dataset_without_copy_or_network(tmp_path, monkeypatch):
    """No local copy and no download: one line saying where and how."""
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network here")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(datasets.DatasetError) as info:
        datasets.load("ogbn-arxiv", tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "ogbn-arxiv is not under" in message
    assert str(tmp_path / "ogbn_arxiv") in message
    assert "copy its folder ogbn_arxiv/" in message


def test_accuracy_evaluator():
    evaluator = datasets.AccuracyEvaluator("x")
    y = torch.tensor([[0], [1], [2], [2]])
    p = torch.tensor([[0], [1], [1], [2]])
    assert evaluator.eval({"y_true": y, "y_pred": p}) == {"acc": 0.75}
    empty = torch.zeros(0, 1)
    assert evaluator.eval({"y_true": empty, "y_pred": empty}) == {"acc": 0.0}

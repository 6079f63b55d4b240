"""Hot-first layout: permutation, composed renumbering, training."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dgl
import numpy as np
import pytest
import torch

import hmgraph
from hmgraph.cache.format import open_feature_file
from hmgraph.datasets.renumbered import permuted, renumbered, to_original
from hmgraph.samplers.cluster import metis_clusters
from hmgraph.samplers.renumber import hot_first_permutation
from hmgraph.train import TrainConfig, resolve_layout, train

COUNTS = torch.tensor([1, 5, 0, 5, 3, 3])
CLUSTERS = torch.tensor([1, 1, 0, 0, 1, 0])


def test_hot_first_orders_by_count_ties_by_id():
    perm, inverse = hot_first_permutation(COUNTS)
    assert perm.tolist() == [1, 3, 4, 5, 0, 2]
    assert inverse.tolist() == [4, 0, 5, 1, 2, 3]


def test_hot_first_inside_clusters():
    perm, inverse = hot_first_permutation(COUNTS, CLUSTERS)
    # Cluster 0 (nodes 2, 3, 5) first, then cluster 1 (0, 1, 4), each
    # hottest first.
    assert perm.tolist() == [3, 5, 2, 1, 4, 0]
    assert inverse.tolist() == [5, 3, 2, 0, 4, 1]


SIZES = [1, 1000, 100_000]


@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
def test_perm_and_inverse_agree(n):
    generator = torch.Generator().manual_seed(n)
    counts = torch.randint(0, 10, (n,), generator=generator)
    clusters = torch.randint(0, 7, (n,), generator=generator)
    for parts in (None, clusters):
        perm, inverse = hot_first_permutation(counts, parts)
        assert torch.equal(perm[inverse], torch.arange(n))
        assert torch.equal(inverse[perm], torch.arange(n))
        keys = (np.arange(n), -counts.numpy())  # last key sorts first
        if parts is not None:
            keys += (parts.numpy(),)
        np.testing.assert_array_equal(perm.numpy(), np.lexsort(keys))


def test_hot_first_refuses_bad_shapes():
    with pytest.raises(ValueError, match="one value per node"):
        hot_first_permutation(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="clusters has 2 entries"):
        hot_first_permutation(COUNTS, torch.zeros(2))


def _check_rows(original, new):
    """Row ``i`` of ``new``'s file is row ``perm[i]`` of the original."""
    _, old_rows = open_feature_file(original.feature_path)
    _, new_rows = open_feature_file(new.feature_path, verify=True)
    perm = new.info["perm"]
    np.testing.assert_array_equal(new_rows, old_rows[perm.numpy()])
    assert torch.equal(new.labels, original.labels[perm])
    for part in ("train", "valid", "test"):
        assert torch.equal(perm[new.split[part]], original.split[part])
    values = torch.arange(new.num_nodes) * 10  # per original node
    assert torch.equal(to_original(new, values[perm]), values)


def test_permuted_composes_with_cluster_renumbering(tiny, tmp_path):
    clusters = metis_clusters(tiny.graph, 8, tmp_path / "metis-8.npy")
    metis = renumbered(tiny, clusters, "test-layout-8")
    counts = torch.arange(tiny.num_nodes) % 17  # hotness, in metis ids
    hot, _ = hot_first_permutation(counts, clusters[metis.info["perm"]])
    both = permuted(metis, hot, "test-hot-first")
    assert torch.equal(both.info["perm"], metis.info["perm"][hot])
    _check_rows(tiny, both)
    # Clusters are still id ranges, hottest first inside each.
    parts = clusters[both.info["perm"]]
    assert bool((parts[1:] >= parts[:-1]).all())
    same = parts[1:] == parts[:-1]
    hotness = counts[hot]
    assert bool((hotness[1:][same] <= hotness[:-1][same]).all())
    # Same edges under the new names.
    src, dst = both.graph.edges()
    perm = both.info["perm"]
    old = set(zip(*(t.tolist() for t in tiny.graph.edges()), strict=True))
    assert set(zip(perm[src].tolist(), perm[dst].tolist(),
                   strict=True)) == old
    # The stored permutation is the composed one: a second call reuses the
    # file, another permutation rewrites it.
    stored = np.load(both.info["folder"] / "perm.npy")
    np.testing.assert_array_equal(stored, perm.numpy())
    assert not both.info["reused"]
    assert permuted(metis, hot, "test-hot-first").info["reused"]
    other = permuted(metis, hot.flip(0), "test-hot-first")
    assert not other.info["reused"]
    _check_rows(tiny, other)


def test_permuted_refuses_a_non_permutation(tiny):
    with pytest.raises(ValueError, match="must be a permutation"):
        permuted(tiny, torch.zeros(tiny.num_nodes, dtype=torch.long), "bad")
    with pytest.raises(ValueError, match="must be a permutation"):
        permuted(tiny, torch.arange(3), "bad")


def _config(tmp_path, **overrides) -> TrainConfig:
    settings = dict(dataset="synth-tiny", fanouts=[5, 5], batch_size=256,
                    hidden=64, lr=0.01, epochs=2, features_on="disk",
                    cache="hmgraph", device_budget="5%", host_budget="20%",
                    eval="layerwise", out=str(tmp_path / "out"),
                    progress=False)
    settings.update(overrides)
    return TrainConfig(**settings)


RESOLVED = [
    ({}, "hot-first"),
    ({"features_on": "memory"}, "file"),
    ({"cache": "lru"}, "file"),
    ({"cache": None}, "file"),
    ({"cache": "presample", "layout": "file"}, "file"),
    ({"features_on": "memory", "layout": "hot-first"}, "hot-first"),
]


@pytest.mark.parametrize("overrides,name", RESOLVED,
                         ids=[name for _, name in RESOLVED])
def test_resolve_layout(tmp_path, overrides, name):
    assert resolve_layout(_config(tmp_path, **overrides)) == name


def test_unknown_layout_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown layout 'cold'; available"):
        train(_config(tmp_path, layout="cold"))


def test_train_hot_first_on_disk(tiny, data_root, tmp_path):
    from hmgraph import datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    scores = {}
    for layout in ("file", "hot-first"):
        result = train(_config(tmp_path / layout, layout=layout),
                       dataset=data)
        assert result["layout"]["name"] == layout
        assert result["layout"]["seconds"] >= 0.0
        saved = json.loads((tmp_path / layout / "out" / "result.json")
                           .read_text())
        assert saved["layout"] == result["layout"]
        scores[layout] = result["summary"]["test_mean"]
    layout = result["layout"]
    folder = Path(layout["path"]).parent  # named by what it derives from
    assert folder.parent == data.feature_path.parent
    assert folder.name.startswith("renumbered-hot-first-")
    assert Path(layout["path"]).name == data.feature_path.name
    assert (folder / "perm.npy").is_file()
    _, rows = open_feature_file(layout["path"], verify=True)
    perm = np.load(folder / "perm.npy")
    np.testing.assert_array_equal(rows, data.features[perm])
    chance = 1.0 / data.num_classes
    assert scores["hot-first"] > 2 * chance, scores
    assert abs(scores["hot-first"] - scores["file"]) < 0.1, scores
    # The same settings profile the same batches: the file is reused.
    again = train(_config(tmp_path / "again", layout="hot-first"),
                  dataset=data)
    assert again["layout"]["reused"]


def test_train_hot_first_with_cluster_renumbering(data_root, tmp_path):
    from hmgraph import datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    result = train(_config(tmp_path, sampler="cluster", renumber=True,
                           clusters=8, epochs=1, layout="auto"),
                   dataset=data)
    layout = result["layout"]
    assert layout["name"] == "hot-first"
    folder = Path(layout["path"]).parent
    assert folder.parent == data.feature_path.parent
    assert folder.name.startswith("renumbered-metis-8-hot-first-")
    assert Path(layout["path"]).name == data.feature_path.name
    perm = torch.from_numpy(np.load(folder / "perm.npy"))
    # Clusters stay id ranges in the final order.
    clusters = metis_clusters(data.graph, 8,
                              data.feature_path.parent / "metis-8.npy")
    parts = clusters[perm]
    assert bool((parts[1:] >= parts[:-1]).all())
    _, rows = open_feature_file(layout["path"], verify=True)
    np.testing.assert_array_equal(rows, data.features[perm.numpy()])
    assert result["summary"]["test_mean"] > 2.0 / data.num_classes


def test_profile_renamed_follows_the_permutation():
    from hmgraph.samplers.presample import Profile

    profile = Profile(torch.tensor([3, 0, 1, 2]),
                      torch.tensor([[1, 0, 0, 0], [2, 0, 1, 2]]),
                      [torch.tensor([0, 2]), torch.tensor([0, 3])])
    perm = torch.tensor([0, 3, 2, 1])  # new -> old
    renamed = profile.renamed(perm)
    assert renamed.counts.tolist() == [3, 2, 1, 0]
    assert renamed.hop_counts.tolist() == [[1, 0, 0, 0], [2, 2, 1, 0]]
    assert [t.tolist() for t in renamed.trace] == [[0, 2], [0, 1]]


def test_hot_first_training_profiles_once(tiny, tmp_path, monkeypatch):
    """The loader plans from the layout's profile instead of its own."""
    import importlib

    presample_module = importlib.import_module("hmgraph.samplers.presample")
    calls = []
    real = presample_module.presample

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(presample_module, "presample", counting)
    # hmgraph.layout binds the name at import; the loader imports it late.
    monkeypatch.setattr(importlib.import_module("hmgraph.layout"),
                        "presample", counting)
    result = train(_config(tmp_path, layout="hot-first"), dataset=tiny)
    assert result["layout"]["name"] == "hot-first"
    assert len(calls) == 1
    with pytest.raises(ValueError, match="profile counts 3 rows"):
        hmgraph.DataLoader(
            tiny.graph, tiny.split["train"],
            dgl.dataloading.NeighborSampler([2]),
            features=tiny.feature_path, cache="presample",
            profile=presample_module.Profile(
                torch.zeros(3, dtype=torch.int64),
                torch.zeros((2, 3), dtype=torch.int64), []))


def test_derived_file_corrupt_missing_or_stale(tiny, tmp_path):
    """The rewritten file carries what it was derived from and its own
    checksum: corrupt rows are refused in one line, a missing file or a
    changed source is rebuilt."""
    import shutil

    from hmgraph.cache.format import FeatureFileError, read_manifest
    from hmgraph.datasets.renumbered import DERIVED_RECORD

    folder = tmp_path / "data"
    folder.mkdir()
    for path in tiny.feature_path.parent.glob(tiny.feature_path.name + "*"):
        shutil.copy(path, folder / path.name)
    source = dataclasses.replace(tiny, feature_path=folder /
                                 tiny.feature_path.name)
    perm = torch.randperm(tiny.num_nodes,
                          generator=torch.Generator().manual_seed(0))
    first = permuted(source, perm, "t")
    target = first.feature_path
    assert (target.parent / DERIVED_RECORD).is_file()
    assert permuted(source, perm, "t").info["reused"]
    # 16 KiB of NaN in the rows: refused, in one line.
    offset = read_manifest(target).data_offset
    with open(target, "r+b") as f:
        f.seek(offset + 4096)
        f.write(np.full(4096, np.nan, dtype=np.float32).tobytes())
    with pytest.raises(FeatureFileError, match="fails its checksum") as info:
        permuted(source, perm, "t")
    assert "\n" not in str(info.value)
    # Without verification it is trusted, as the source file is.
    assert permuted(source, perm, "t", verify=False).info["reused"]
    # Deleted while its record stays: rebuilt, rows exact again.
    target.unlink()
    again = permuted(source, perm, "t")
    assert not again.info["reused"]
    _, rows = open_feature_file(again.feature_path, verify=True)
    _, old = open_feature_file(source.feature_path)
    assert np.array_equal(np.asarray(rows), np.asarray(old)[perm.numpy()])
    # The source changed (another checksum): the derived file is stale.
    record = json.loads((target.parent / DERIVED_RECORD).read_text())
    record["source_checksum"] = "crc32:00000000"
    (target.parent / DERIVED_RECORD).write_text(json.dumps(record))
    assert not permuted(source, perm, "t").info["reused"]

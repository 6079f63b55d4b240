"""Files in a dataset folder are data, and must be the dataset's own.

Each payload test plants a pickle whose ``__reduce__`` writes a marker
file where a dataset format holds a pickle: a split (``split_dict.pt``,
read for synthetic, ogbn and ogbg sets alike) and a Planetoid file. Each is
refused with one line naming the file, and the marker is never written.
The genuine files of each format still load. A feature file swapped into
a generated set is refused too.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hmgraph import datasets
from hmgraph.cli import main
from hmgraph.datasets.ogb_stream import read_split
from hmgraph.datasets.pickles import UnsafePickleError, load_torch


class Payload:
    """Unpickles as a call that writes ``marker``: what a crafted file is."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.fixture()
def marker(tmp_path) -> Path:
    path = tmp_path / "PAYLOAD-RAN"
    yield path
    assert not path.exists(), "the payload ran"


def refused(call, path: Path) -> str:
    """The one-line message ``call`` refuses ``path`` with."""
    with pytest.raises(UnsafePickleError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert "nothing in it was run" in message
    return message


def writable_copy(source: Path, target: Path) -> Path:
    """``source`` copied to ``target``, writable (no read-only cache)."""
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o700 if path.is_dir()
                   else 0o600)
    return target


def test_payload_in_a_synthetic_split_is_refused_by_train(
        data_root, tmp_path, marker, capsys):
    # synth-tiny's split is ogb's split_dict.pt (ogb.io.DatasetSaver),
    # which ogb's get_idx_split would torch.load without restriction.
    root = tmp_path / "root"
    writable_copy(data_root / "synth_tiny", root / "synth_tiny")
    split = root / "synth_tiny" / "split" / "random" / "split_dict.pt"
    torch.save({"train": Payload(marker)}, split)
    code = main(["train", "--dataset", "synth-tiny", "--root", str(root),
                 "--epochs", "1", "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"hmgraph train: error: {split} cannot be read as a split file (it "
        f"names __builtin__.exec, which this format never holds); nothing "
        f"in it was run: replace it with the dataset's original file")


def test_genuine_synthetic_split_still_loads(tiny):
    # ogb writes numpy arrays, which torch 2.2's weights_only refuses.
    split = tiny.info["folder"] / "split" / "random" / "split_dict.pt"
    saved = load_torch(split, "split file")
    assert isinstance(saved["train"], np.ndarray)
    for part in ("train", "valid", "test"):
        assert np.array_equal(saved[part], tiny.split[part].numpy())


def _streamed(root: Path, split) -> Path:
    """A tiny ogbn-papers100M folder in OGB's binary layout."""
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    (folder / "split" / "time").mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(folder / "raw" / "data.npz",
             edge_index=rng.integers(0, 50, (2, 200)),
             num_nodes_list=np.array([50]),
             node_feat=rng.standard_normal((50, 8), dtype=np.float32))
    np.savez(folder / "raw" / "node-label.npz",
             node_label=rng.integers(0, 3, (50, 1)).astype(np.float32))
    torch.save(split, folder / "split" / "time" / "split_dict.pt")
    return folder


def test_payload_in_a_streamed_split_dict_is_refused(tmp_path, marker):
    folder = _streamed(tmp_path, {"train": Payload(marker)})
    refused(lambda: read_split(folder),
            folder / "split" / "time" / "split_dict.pt")


def test_streamed_split_of_arrays_or_tensors_loads(tmp_path):
    ids = {"train": np.arange(10), "valid": np.arange(10, 15),
           "test": np.arange(15, 20)}
    got = read_split(_streamed(tmp_path / "a", ids))
    assert all(np.array_equal(got[k], v) for k, v in ids.items())
    tensors = {k: torch.from_numpy(v) for k, v in ids.items()}
    got = read_split(_streamed(tmp_path / "b", tensors))
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


def test_payload_in_an_ogbg_split_is_refused(shared_data, tmp_path, marker,
                                             monkeypatch):
    from hmgraph.datasets.graphprop import load_ogbg

    monkeypatch.setenv("HMGRAPH_CACHE", str(tmp_path / "cache"))
    folder = writable_copy(shared_data / "ogbg_molbace",
                           tmp_path / "ogbg_molbace")
    split = folder / "split" / "scaffold" / "split_dict.pt"
    torch.save({"train": Payload(marker)}, split)
    refused(lambda: load_ogbg("ogbg-molbace", tmp_path), split)


def test_payload_in_a_planetoid_file_is_refused(shared_data, tmp_path,
                                                marker):
    folder = writable_copy(shared_data / "Cora", tmp_path / "Cora")
    x = folder / "ind.cora.x"
    with open(x, "wb") as f:  # as the GCN files: protocol 2
        pickle.dump(Payload(marker), f, protocol=2)
    message = refused(lambda: datasets.load("cora", tmp_path), x)
    assert "Planetoid file" in message


TORCH_FILES = {
    "payload-in-zip": lambda p, m: torch.save({"x": Payload(m)}, p),
    "payload-legacy": lambda p, m: torch.save(
        {"x": Payload(m)}, p, _use_new_zipfile_serialization=False),
    "payload-plain-pickle": lambda p, m: p.write_bytes(
        pickle.dumps(Payload(m))),
    "empty": lambda p, m: p.write_bytes(b""),
    "junk": lambda p, m: p.write_bytes(b"hello world" * 10),
    "torchscript": lambda p, m: torch.jit.save(
        torch.jit.script(torch.nn.Linear(2, 2)), str(p)),
}


@pytest.mark.parametrize("make", TORCH_FILES.values(), ids=TORCH_FILES.keys())
def test_load_torch_refuses_in_one_line(tmp_path, marker, make):
    path = tmp_path / "split_dict.pt"
    make(path, marker)
    refused(lambda: load_torch(path, "split file"), path)


def test_load_torch_reads_tensors_and_arrays(tmp_path):
    saved = {"tensor": torch.arange(5), "array": np.arange(3),
             "scalar": np.int64(7), "nested": [torch.ones(2)]}
    for legacy in (False, True):
        path = tmp_path / f"legacy-{legacy}.pt"
        torch.save(saved, path, _use_new_zipfile_serialization=not legacy)
        loaded = load_torch(path, "split file")
        assert torch.equal(loaded["tensor"], saved["tensor"])
        assert np.array_equal(loaded["array"], saved["array"])
        assert loaded["scalar"] == 7
        assert torch.equal(loaded["nested"][0], torch.ones(2))


def test_a_feature_file_swapped_into_a_synthetic_set_is_refused(
        data_root, tmp_path):
    # Another set's rows of the same shape: the checksum generation
    # recorded in hmgraph-meta.json names the file that belongs here.
    from hmgraph.cache.format import FeatureFileError, write_feature_file
    from hmgraph.datasets.synthetic import feature_path

    folder = writable_copy(data_root / "synth_tiny",
                           tmp_path / "synth_tiny")
    path = feature_path(folder)
    recorded = datasets.load("synth-tiny", tmp_path, features_on="disk")
    rows = np.zeros((recorded.num_nodes, 100), np.float32)
    swapped = write_feature_file(path, rows).checksum
    with pytest.raises(FeatureFileError) as info:
        datasets.load("synth-tiny", tmp_path, features_on="disk")
    assert str(info.value) == (
        f"feature file {path} is not the one generated for this dataset: "
        f"its checksum {swapped} is not the crc32:0a1f11db recorded in "
        f"{folder / 'hmgraph-meta.json'}; delete {folder} to generate it "
        f"again")

"""OGB node datasets too large for memory, read from OGB's raw files.

``DglNodePropPredDataset`` loads a dataset's whole feature matrix (57 GB
for ogbn-papers100M) before anything else can run. For OGB's binary
datasets this module reads the same raw files (``raw/data.npz``,
``raw/node-label.npz``, ``split/<kind>/``) without that step:

* node features are streamed out of ``data.npz`` chunk by chunk (the
  zip member is decompressed on the fly) into hmgraph's feature file, so
  memory holds one chunk;
* the graph (edge list), labels and split are read whole: they are what
  training keeps in memory anyway. The built graph is cached beside the
  feature file (``graph.dgl``, written atomically) for the next load.

The folder is OGB's own layout under ``root`` (``ogbn_papers100M/``), as
ogb downloads and extracts it.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from hmgraph.cache.format import FeatureFileWriter, atomic_path
from hmgraph.datasets.pickles import load_torch

log = logging.getLogger(__name__)

__all__ = ["STREAMED", "npz_member", "read_raw_graph", "read_split",
           "stream_features"]

#: OGB node datasets read through this module (binary raw files).
STREAMED = ("ogbn-papers100M",)
_CHUNK_BYTES = 64 << 20
_GRAPH_FILE = "graph.dgl"


class npz_member:
    """One array of an ``.npz`` file, read in row chunks.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file (compressed or not).
    key : str
        The array's name, e.g. ``"node_feat"``.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype
    """

    def __init__(self, path, key: str):
        self.path = Path(path)
        self.key = key
        with zipfile.ZipFile(self.path) as archive:
            names = archive.namelist()
            if f"{key}.npy" not in names:
                raise KeyError(
                    f"{self.path} has no array {key!r}; it has "
                    f"{', '.join(n[:-4] for n in names)}"
                )
            with archive.open(f"{key}.npy") as f:
                self.shape, self.dtype, _ = self._header(f)

    @staticmethod
    def _header(f):
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) \
            else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if fortran:
            raise ValueError("Fortran-ordered arrays cannot be streamed")
        return tuple(shape), np.dtype(dtype), version

    def chunks(self, chunk_bytes: int | None = None):
        """Yield the array's rows in order, about ``chunk_bytes`` at once
        (default 64 MiB)."""
        chunk_bytes = chunk_bytes or _CHUNK_BYTES
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * \
            self.dtype.itemsize
        rows_per_chunk = max(1, chunk_bytes // max(row_bytes, 1))
        with zipfile.ZipFile(self.path) as archive, \
                archive.open(f"{self.key}.npy") as f:
            self._header(f)
            left = self.shape[0]
            while left:
                take = min(rows_per_chunk, left)
                raw = f.read(take * row_bytes)
                if len(raw) != take * row_bytes:
                    raise ValueError(
                        f"{self.path}:{self.key} ends after "
                        f"{self.shape[0] - left} of {self.shape[0]} rows"
                    )
                yield np.frombuffer(raw, self.dtype).reshape(
                    (take, *self.shape[1:]))
                left -= take


def stream_features(raw_dir: Path, target: Path,
                    progress: bool = False) -> Path:
    """Convert ``raw_dir/data.npz``'s ``node_feat`` into a feature file.

    One chunk in memory at a time; the file appears under ``target`` only
    once complete (`FeatureFileWriter`).
    """
    member = npz_member(raw_dir / "data.npz", "node_feat")
    log.info("converting %s node features %s %s into %s", raw_dir,
             member.dtype, member.shape, target)
    with FeatureFileWriter(target, member.shape, member.dtype) as out, \
            tqdm(total=member.shape[0], unit="row", desc="features",
                 disable=not progress, leave=False) as bar:
        for rows in member.chunks():
            out.write(rows)
            bar.update(len(rows))
    return target


def read_raw_graph(folder: Path, cache: Path, bidirected: bool):
    """The graph, labels and split of an OGB binary node dataset.

    Returns
    -------
    (dgl.DGLGraph, numpy.ndarray, dict)
        The graph (both directions of every edge if ``bidirected``), raw
        labels (N, 1) and the split as id arrays.
    """
    import dgl  # lazy: 4 s to import, for this graph alone

    raw = folder / "raw"
    graph_file = cache / _GRAPH_FILE
    if graph_file.is_file():
        graph = dgl.load_graphs(str(graph_file))[0][0]
    else:
        with np.load(raw / "data.npz") as data:
            edge_index = data["edge_index"]
            num_nodes = int(data["num_nodes_list"].sum())
        graph = dgl.graph((torch.from_numpy(edge_index[0]),
                           torch.from_numpy(edge_index[1])),
                          num_nodes=num_nodes)
        del edge_index
        if bidirected:
            graph = dgl.to_bidirected(graph)
        cache.mkdir(parents=True, exist_ok=True)
        with atomic_path(graph_file) as tmp:
            dgl.save_graphs(str(tmp), [graph])
    with np.load(raw / "node-label.npz") as data:
        labels = data["node_label"]
    return graph, labels, read_split(folder)


def read_split(folder: Path) -> dict:
    """The split of an OGB node dataset in ``folder``, as id arrays.

    ``split/<kind>/split_dict.pt`` where there is one, read without
    running code from it (`hmgraph.datasets.pickles.load_torch`), else
    ``split/<kind>/{train,valid,test}.csv.gz``.
    """
    import pandas as pd  # lazy: 0.2 s to import, for the split's CSV

    kind = folder / "split" / _split_kind(folder)
    if (kind / "split_dict.pt").is_file():
        return load_torch(kind / "split_dict.pt", "split file")
    return {part: pd.read_csv(kind / f"{part}.csv.gz", compression="gzip",
                              header=None).values.T[0]
            for part in ("train", "valid", "test")}


def _split_kind(folder: Path) -> str:
    kinds = sorted(p.name for p in (folder / "split").iterdir()
                   if p.is_dir())
    if not kinds:
        raise FileNotFoundError(f"{folder / 'split'} holds no split folder")
    return kinds[0]

"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the GCN files.

Reads ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`` (Yang et al.,
2016; the files of ``kimiyoung/planetoid`` and ``tkipf/gcn``) with the
standard public split: train = the rows of ``x`` (140 on Cora), validation
= the next 500 ids, test = the ids in ``test.index``. Features are
row-normalised as in DGL's ``CoraGraphDataset``; the graph is symmetric
without self-loops.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from hmgraph.datasets.pickles import NUMPY_ARRAYS, load_pickle

__all__ = ["PLANETOID", "find_planetoid", "read_planetoid"]

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
#: All the files name (Python 2 pickles): numpy arrays, scipy CSR matrices
#: and, for the graph, a defaultdict of lists. Nothing else is unpickled.
_GLOBALS = NUMPY_ARRAYS | {
    ("scipy.sparse.csr", "csr_matrix"),
    ("scipy.sparse._csr", "csr_matrix"),
    ("collections", "defaultdict"),
    ("__builtin__", "list"),
    ("builtins", "list"),
}


def find_planetoid(name: str, root: str | Path) -> Path | None:
    """The folder under ``root`` that holds ``ind.<name>.*``, if any."""
    root = Path(root)
    for folder in (root / PLANETOID[name], root / PLANETOID[name] / "raw",
                   root / name, root):
        if (folder / f"ind.{name}.graph").is_file():
            return folder
    return None


def read_planetoid(name: str, folder: str | Path) -> dict:
    """Read one Planetoid dataset.

    Parameters
    ----------
    name : str
        ``"cora"``, ``"citeseer"`` or ``"pubmed"``.
    folder : str or pathlib.Path
        Folder holding the ``ind.<name>.*`` files.

    Returns
    -------
    dict
        ``src``, ``dst`` (int64 edge ends, both directions), ``feat``
        (float32, row-normalised), ``label`` (int64), ``num_classes``,
        ``train``, ``valid``, ``test`` (int64 ids).

    Raises
    ------
    hmgraph.datasets.pickles.UnsafePickleError
        A file names anything but numpy arrays, CSR matrices and lists
        (a crafted pickle): refused before it can run.
    """
    parts, test_index = _read_parts(name, Path(folder))
    test_sorted = np.sort(test_index)

    tx, ty = parts["tx"], parts["ty"]
    if name == "citeseer":
        # Some CiteSeer test ids have no rows: pad with zeros (as GCN does).
        full = np.arange(test_sorted[0], test_sorted[-1] + 1)
        tx_ext = sp.lil_matrix((full.size, tx.shape[1]))
        tx_ext[test_sorted - test_sorted[0], :] = tx
        ty_ext = np.zeros((full.size, ty.shape[1]))
        ty_ext[test_sorted - test_sorted[0], :] = ty
        tx, ty = tx_ext, ty_ext

    feat = sp.vstack((parts["allx"], tx)).tolil()
    feat[test_index, :] = feat[test_sorted, :]
    feat = np.asarray(feat.todense(), dtype=np.float32)
    row_sum = feat.sum(axis=1, keepdims=True)
    feat = feat / np.where(row_sum == 0, 1.0, row_sum)

    onehot = np.vstack((parts["ally"], ty))
    onehot[test_index, :] = onehot[test_sorted, :]
    label = onehot.argmax(axis=1).astype(np.int64)

    num_nodes = feat.shape[0]
    pairs = _edges(name, parts["graph"], num_nodes)
    num_train = len(parts["y"])
    return {
        "src": pairs[0],
        "dst": pairs[1],
        "num_nodes": num_nodes,
        "feat": torch.from_numpy(np.ascontiguousarray(feat)),
        "label": torch.from_numpy(label),
        "num_classes": int(onehot.shape[1]),
        "train": torch.arange(num_train),
        "valid": torch.arange(num_train, num_train + 500),
        "test": torch.from_numpy(test_sorted),
    }


def _read_parts(name: str, folder: Path) -> tuple[dict, np.ndarray]:
    """The ``ind.<name>.*`` pickles and the test ids, in file order.

    Raises
    ------
    FileNotFoundError
        A file is missing; the message names every file needed.
    """
    parts = {}
    for part in _PARTS:
        path = folder / f"ind.{name}.{part}"
        if not path.is_file():
            raise FileNotFoundError(
                f"Planetoid file {path} is missing; {name} needs "
                f"ind.{name}.{{{','.join(_PARTS)},test.index}}"
            )
        parts[part] = load_pickle(path, _GLOBALS, "Planetoid file",
                                  encoding="latin1")
    index_path = folder / f"ind.{name}.test.index"
    test_index = np.loadtxt(index_path, dtype=np.int64).reshape(-1)
    return parts, test_index


def _edges(name: str, adjacency: dict, num_nodes: int) -> np.ndarray:
    """The (2, E) edges of ``adjacency``, both directions, no self-loops.

    Sorted by source, then destination; each pair once.

    Raises
    ------
    ValueError
        The adjacency names a node beyond the ``num_nodes`` feature rows.
    """
    src = np.fromiter(
        (u for u, vs in adjacency.items() for _ in vs), dtype=np.int64
    )
    dst = np.fromiter(
        (v for vs in adjacency.values() for v in vs), dtype=np.int64
    )
    if src.size and max(src.max(), dst.max()) >= num_nodes:
        raise ValueError(
            f"ind.{name}.graph names node {max(src.max(), dst.max())}, but "
            f"there are {num_nodes} feature rows"
        )
    keep = src != dst
    return np.unique(np.stack([
        np.concatenate([src[keep], dst[keep]]),
        np.concatenate([dst[keep], src[keep]]),
    ]), axis=1)

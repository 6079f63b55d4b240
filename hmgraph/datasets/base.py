"""The node dataset every loader returns, and its node-feature file."""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.format import (
    FeatureManifest,
    open_feature_file,
    read_manifest,
    verify_feature_file,
    write_feature_file,
)
from hmgraph.datasets.locking import exclusive_lock

log = logging.getLogger(__name__)

__all__ = ["AccuracyEvaluator", "NodeDataset", "attach_feature_file",
           "graph_bytes", "read_feature_rows", "rows_checksum"]

FEATURE_FILE = "node-feat.bin"


class AccuracyEvaluator:
    """Accuracy with the interface of `ogb.nodeproppred.Evaluator`.

    Used for datasets that OGB's evaluator does not know (synthetic graphs,
    Planetoid). ``eval({"y_true": ..., "y_pred": ...})`` takes arrays or
    tensors of shape (num_nodes, 1) and returns ``{"acc": float}``.
    """

    eval_metric = "acc"
    num_tasks = 1

    def __init__(self, name: str):
        self.name = name

    def eval(self, input_dict: dict) -> dict:
        """See `ogb.nodeproppred.Evaluator.eval`."""
        y_true = torch.as_tensor(input_dict["y_true"]).reshape(-1)
        y_pred = torch.as_tensor(input_dict["y_pred"]).reshape(-1)
        if y_true.shape != y_pred.shape:
            raise ValueError(
                f"y_true has shape {tuple(y_true.shape)} but y_pred has "
                f"{tuple(y_pred.shape)}"
            )
        if y_true.numel() == 0:
            return {"acc": 0.0}
        return {"acc": float((y_true == y_pred).double().mean())}


@dataclass
class NodeDataset:
    """A node-classification dataset, ready for training.

    Attributes
    ----------
    name : str
        Dataset name, e.g. ``"ogbn-arxiv"`` or ``"synth-small"``.
    graph : dgl.DGLGraph
        Homogeneous graph on the CPU with ``ndata["label"]``; with
        features in memory also ``ndata["feat"]`` (float rows). With
        features on disk the graph holds no feature rows at all.
    labels : torch.Tensor
        int64, shape (num_nodes,); -1 where a node has no label.
    split : dict of str to torch.Tensor
        ``"train"``, ``"valid"``, ``"test"``: int64 node ids (CPU).
    num_classes : int
        Number of classes.
    evaluator : object
        ``ogb.nodeproppred.Evaluator`` for OGB datasets, else an
        `AccuracyEvaluator`; both have ``eval`` and ``eval_metric``.
    feature_path : pathlib.Path
        The node-feature file (see `hmgraph.cache.format`), rows in node-id
        order, data start aligned to 4096 bytes for ``O_DIRECT``.
    features_on : str
        ``"memory"`` (rows also in ``graph.ndata["feat"]``) or ``"disk"``
        (rows only in the feature file).
    """

    name: str
    graph: object
    labels: torch.Tensor
    split: dict[str, torch.Tensor]
    num_classes: int
    evaluator: object
    feature_path: Path
    info: dict = field(default_factory=dict)
    features_on: str = "memory"

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.graph.num_nodes()

    @property
    def features(self):
        """Node features, shape (num_nodes, feat_dim), CPU.

        With features in memory, the tensor ``graph.ndata["feat"]``; with
        features on disk, a read-only ``numpy.memmap`` of the feature file
        (nothing is copied; prefer reading rows through
        `hmgraph.cache.StorageFeature`, which bypasses the page cache).
        """
        if self.features_on == "disk":
            return open_feature_file(self.feature_path)[1]
        return self.graph.ndata["feat"]

    @property
    def manifest(self) -> FeatureManifest:
        """The manifest of the feature file."""
        return read_manifest(self.feature_path)

    @property
    def feat_dim(self) -> int:
        """Width of one feature row."""
        return int(np.prod(self.manifest.row_shape, dtype=np.int64))

    @property
    def feature_bytes(self) -> int:
        """Bytes of all feature rows (the feature file without padding)."""
        return self.manifest.data_bytes

    @property
    def graph_bytes(self) -> int:
        """Bytes of the graph's structure and node data in memory."""
        return graph_bytes(self.graph)

    def evaluate(self, logits: torch.Tensor, split: str) -> float:
        """The evaluator's metric of ``logits`` on one split.

        Parameters
        ----------
        logits : torch.Tensor
            Shape (num_nodes, num_classes), rows in node-id order.
        split : str
            ``"train"``, ``"valid"`` or ``"test"``.
        """
        return self.score(logits[self.split[split]], split)

    def score(self, logits: torch.Tensor, split: str) -> float:
        """The evaluator's metric of one split's own ``logits``.

        Parameters
        ----------
        logits : torch.Tensor
            Shape (len(split[split]), num_classes): row ``i`` for node
            ``split[split][i]``.
        split : str
            ``"train"``, ``"valid"`` or ``"test"``.
        """
        ids = self.split[split]
        if logits.shape[0] != ids.numel():
            raise ValueError(
                f"{logits.shape[0]} rows of logits for the {ids.numel()} "
                f"nodes of the {split} split"
            )
        y_pred = logits.argmax(dim=-1, keepdim=True).cpu()
        y_true = self.labels[ids].reshape(-1, 1)
        result = self.evaluator.eval({"y_true": y_true, "y_pred": y_pred})
        return float(result[self.evaluator.eval_metric])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v.numel()}" for k, v in self.split.items())
        return (
            f"NodeDataset({self.name!r}, num_nodes={self.num_nodes}, "
            f"num_edges={self.graph.num_edges()}, feat_dim={self.feat_dim}, "
            f"num_classes={self.num_classes}, {sizes})"
        )


def attach_feature_file(
    features: torch.Tensor, folder: str | os.PathLike, verify: bool = True
) -> Path:
    """Make sure ``folder`` holds the feature file of ``features``.

    The file is checked against its source, the rows in memory: its
    manifest must name their shape, dtype and checksum (CRC-32 of the row
    bytes). A missing file, or one written from other rows (the dataset's
    files changed since), is written (atomically, one process at a time
    under ``folder/.lock``; others wait and find it written). An existing
    file that is damaged (truncated, a bad header, with ``verify`` rows
    that fail the checksum) is refused in one line.

    Returns
    -------
    pathlib.Path
        Path of the feature file.
    """
    path = Path(folder) / FEATURE_FILE
    rows = features.numpy()
    source = (tuple(rows.shape), rows.dtype.name, rows_checksum(rows))
    if _written_from(path, source):
        if verify:
            verify_feature_file(path)
        return path
    with exclusive_lock(Path(folder) / ".lock", path):
        if not _written_from(path, source):  # nor by another run meanwhile
            log.info("writing feature file %s", path)
            write_feature_file(path, rows)
    return path


def _written_from(path: Path, source: tuple) -> bool:
    """Whether ``path`` exists and its manifest names ``source`` (shape,
    dtype, checksum); a damaged file raises `FeatureFileError`."""
    if not os.path.lexists(path):
        return False
    manifest = read_manifest(path)
    if (manifest.shape, manifest.dtype, manifest.checksum) == source:
        return True
    log.info("%s holds %s rows of shape %s (%s), not the dataset's %s %s "
             "(%s): its files changed; rewriting it", path, manifest.dtype,
             manifest.shape, manifest.checksum, source[1], source[0],
             source[2])
    return False


def rows_checksum(rows: np.ndarray) -> str:
    """The checksum a feature file of ``rows`` carries (``crc32:...``).

    Computed 64 MB of rows at a time, so a strided array is copied one
    piece at a time, never whole.
    """
    rows = np.asarray(rows)
    row_bytes = max(1, rows[:1].nbytes)
    step = max(1, (64 << 20) // row_bytes)
    crc = 0
    for start in range(0, len(rows), step):
        part = np.ascontiguousarray(rows[start:start + step])
        crc = zlib.crc32(part.reshape(-1).view(np.uint8), crc)
    return f"crc32:{crc:08x}"


def as_labels(raw) -> torch.Tensor:
    """Labels as int64 of shape (num_nodes,), -1 for missing (NaN)."""
    labels = torch.as_tensor(np.asarray(raw)).reshape(-1)
    if labels.is_floating_point():
        missing = torch.isnan(labels)
        labels = torch.where(missing, torch.full_like(labels, -1), labels)
    return labels.long()


def read_feature_rows(path: str | os.PathLike) -> torch.Tensor:
    """All rows of a feature file, read into one new CPU tensor.

    Plain reads (no memmap left behind); for features in memory.
    """
    manifest = read_manifest(path)
    rows = np.fromfile(path, dtype=np.dtype(manifest.dtype),
                       count=int(np.prod(manifest.shape, dtype=np.int64)),
                       offset=manifest.data_offset)
    return torch.from_numpy(rows.reshape(manifest.shape))


def graph_bytes(graph) -> int:
    """Bytes a DGL graph holds: its materialised formats and node data.

    Counts COO (source and destination ids) and every CSR / CSC already
    built (index pointers and indices, plus edge ids), at the graph's id
    width, and every ``ndata`` / ``edata`` tensor.
    """
    width = 8 if graph.idtype == torch.int64 else 4
    n, m = graph.num_nodes(), graph.num_edges()
    created = graph.formats()["created"]
    total = 0
    for fmt in created:
        total += 2 * m * width if fmt == "coo" else (n + 1 + 2 * m) * width
    for frame in (graph.ndata, graph.edata):
        for value in frame.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return int(total)

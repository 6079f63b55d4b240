"""Graph-classification datasets: the TU text format, and their container.

A TU dataset ``NAME`` is a folder of comma-separated text files (node ids
are 1-based and run over all graphs):

``NAME_A.txt``
    one ``row, col`` line per directed edge (required);
``NAME_graph_indicator.txt``
    line ``i``: the graph id (1-based) of node ``i`` (required);
``NAME_graph_labels.txt``
    line ``g``: the class label of graph ``g`` (required);
``NAME_node_labels.txt``, ``NAME_node_attributes.txt``
    one line per node (optional).

`read_tu` validates every file and raises `TUFormatError` with one line
``path:line: what is wrong`` for the first problem it finds (a missing
file, a value that is not a number, a node id out of range, an edge
joining two graphs, a graph indicator that is not sorted or skips a graph,
label counts that disagree).

What the reader makes of the files:

- Graph labels are remapped to ``0 .. C-1`` in the sorted order of the
  original values (MUTAG's -1/1 become 0/1, ENZYMES' 1..6 become 0..5).
- Node features: each node-label column one-hot (its distinct values in
  sorted order), then the node attributes, standardised per column over
  all nodes (mean 0, std 1; label-free, so no fold leaks into another);
  a dataset with neither gets a one-hot of the node degree, capped at
  `DEGREE_CAP`.
- Edges are made symmetric, duplicates and self-loops are dropped (the
  GNN layers add the node's own term themselves).

Examples
--------
>>> data = read_tu("../shared/data/MUTAG")  # doctest: +SKIP
>>> data.num_graphs, data.num_classes, data.feat_dim  # doctest: +SKIP
(188, 2, 7)
>>> graph, feat, labels = data.batch(torch.arange(4))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hmgraph.datasets import DatasetError

__all__ = ["DEGREE_CAP", "GraphDataset", "TUFormatError", "read_tu"]

# Degrees above this share the last one-hot column (datasets without node
# labels or attributes only).
DEGREE_CAP = 64


class TUFormatError(DatasetError):
    """A malformed TU file; the message is ``path:line: what is wrong``."""


@dataclass
class GraphDataset:
    """A set of graphs with one label (or one row of task labels) each,
    stored flat.

    Graph ``g`` owns nodes ``node_ptr[g]:node_ptr[g + 1]`` of ``features``
    and edges ``edge_ptr[g]:edge_ptr[g + 1]`` of ``src`` / ``dst``, whose
    ids are local to the graph (0-based). All tensors are on the CPU.

    Attributes
    ----------
    name : str
        Dataset name, e.g. ``"MUTAG"`` or ``"ogbg-molbace"``.
    node_ptr, edge_ptr : torch.Tensor
        int64, shape ``(num_graphs + 1,)``.
    src, dst : torch.Tensor
        int64 local node ids, shape ``(total edges,)``; every undirected
        edge appears in both directions.
    features : torch.Tensor
        float32, shape ``(total nodes, feat_dim)``.
    labels : torch.Tensor
        ``task == "multiclass"`` (TU): int64 classes in ``0 .. num_classes
        - 1``, shape ``(num_graphs,)``. Otherwise (OGB): float32, shape
        ``(num_graphs, num_classes)``, one column per task, NaN where a
        graph has no label for the task.
    num_classes : int
        Number of classes (multiclass), else of tasks: the model's output
        width either way.
    task : str
        ``"multiclass"`` (one softmax over classes), ``"binary"`` (one
        logit per task) or ``"regression"`` (one value per task).
    metric : str
        ``"acc"`` (TU) or the OGB evaluator's (``"rocauc"``, ``"rmse"``).
    evaluator : object or None
        ``ogb.graphproppred.Evaluator`` for OGB datasets, else None.
    split : dict of str to torch.Tensor or None
        An official ``train`` / ``valid`` / ``test`` split of graph ids
        (OGB), else None (cross-validation folds are made by the caller).
    info : dict
        Where the data came from and raw counts (``folder``,
        ``edge_lines``, ``label_values``, ...).
    """

    name: str
    node_ptr: torch.Tensor
    edge_ptr: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    task: str = "multiclass"
    metric: str = "acc"
    evaluator: object = None
    split: dict | None = None
    info: dict = field(default_factory=dict)

    @property
    def num_graphs(self) -> int:
        """Number of graphs."""
        return int(self.labels.numel())

    @property
    def feat_dim(self) -> int:
        """Width of one node-feature row."""
        return int(self.features.shape[1])

    @property
    def num_nodes(self) -> torch.Tensor:
        """Nodes per graph, int64, shape ``(num_graphs,)``."""
        return self.node_ptr.diff()

    @property
    def num_edges(self) -> torch.Tensor:
        """Directed edges per graph, int64, shape ``(num_graphs,)``."""
        return self.edge_ptr.diff()

    @property
    def max_nodes(self) -> int:
        """Nodes of the largest graph."""
        return int(self.num_nodes.max()) if self.num_graphs else 0

    def graph(self, index: int):
        """Graph ``index`` as a DGL graph with ``ndata["feat"]`` (CPU)."""
        import dgl

        if not 0 <= index < self.num_graphs:
            raise ValueError(
                f"graph index must be in [0, {self.num_graphs}); got "
                f"{index!r}"
            )
        lo, hi = int(self.edge_ptr[index]), int(self.edge_ptr[index + 1])
        first, last = int(self.node_ptr[index]), int(self.node_ptr[index + 1])
        graph = dgl.graph((self.src[lo:hi], self.dst[lo:hi]),
                          num_nodes=last - first)
        graph.ndata["feat"] = self.features[first:last]
        return graph

    def batch(self, ids) -> tuple:
        """The graphs ``ids`` as one batched DGL graph.

        Equal to ``dgl.batch([self.graph(i) for i in ids])`` (same node and
        edge order, same ``batch_num_nodes`` / ``batch_num_edges``), built
        from the flat arrays in one pass, about ten times faster.

        Parameters
        ----------
        ids : sequence of int or torch.Tensor
            Graph ids, in the order wanted in the batch.

        Returns
        -------
        tuple
            ``(graph, features, labels)``: the batched ``dgl.DGLGraph``
            (without ndata), node features of shape ``(graph.num_nodes(),
            feat_dim)`` and labels of shape ``(len(ids),)``; all on the CPU.
        """
        import dgl

        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_graphs):
            raise ValueError(
                f"graph ids must be in [0, {self.num_graphs}); got "
                f"{int(ids.min())}..{int(ids.max())}"
            )
        sizes, edges = self.num_nodes[ids], self.num_edges[ids]
        node_rows = _ranges(self.node_ptr[ids], sizes)
        edge_rows = _ranges(self.edge_ptr[ids], edges)
        offsets = sizes.cumsum(0) - sizes
        shift = torch.repeat_interleave(offsets, edges)
        src = self.src[edge_rows] + shift
        dst = self.dst[edge_rows] + shift
        graph = dgl.graph((src, dst), num_nodes=int(sizes.sum()))
        graph.set_batch_num_nodes(sizes)
        graph.set_batch_num_edges(edges)
        return graph, self.features[node_rows], self.labels[ids]

    @classmethod
    def from_edges(cls, name, src, dst, num_nodes, features, labels,
                   num_classes, **kwargs) -> GraphDataset:
        """Build from global edge ids over graph-contiguous nodes.

        Edges are made symmetric; duplicates and self-loops are dropped.

        Parameters
        ----------
        name : str
            Dataset name.
        src, dst : array-like
            Global 0-based node ids of the edges; both ends of an edge in
            the same graph.
        num_nodes : array-like
            Nodes per graph; graph ``g`` owns the next ``num_nodes[g]``
            node ids.
        features : array-like
            Node features, ``(sum(num_nodes), feat_dim)``, cast to float32.
        labels : array-like
            Classes ``0 .. num_classes - 1``, one per graph (cast to
            int64); with ``task`` other than ``"multiclass"`` in kwargs,
            ``(num_graphs, num_tasks)`` values (cast to float32).
        num_classes : int
            Number of classes (or of tasks).
        **kwargs
            Other `GraphDataset` fields (``task``, ``metric``, ``split``,
            ...).
        """
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        num_nodes = np.asarray(num_nodes, np.int64)
        node_ptr = np.concatenate([[0], np.cumsum(num_nodes)])
        total = max(int(node_ptr[-1]), 1)
        keep = src != dst
        key = np.unique(np.concatenate([src[keep] * total + dst[keep],
                                        dst[keep] * total + src[keep]]))
        src, dst = key // total, key % total
        graph_of = np.repeat(np.arange(num_nodes.size), num_nodes)
        graph_of_edge = graph_of[src]
        edge_ptr = np.concatenate([[0], np.cumsum(np.bincount(
            graph_of_edge, minlength=num_nodes.size))])
        local = node_ptr[graph_of_edge]
        return cls(
            name=name,
            node_ptr=torch.from_numpy(node_ptr.astype(np.int64)),
            edge_ptr=torch.from_numpy(edge_ptr.astype(np.int64)),
            src=torch.from_numpy(src - local),
            dst=torch.from_numpy(dst - local),
            features=torch.as_tensor(np.asarray(features, np.float32)),
            labels=torch.as_tensor(np.asarray(
                labels, np.int64 if kwargs.get("task", "multiclass")
                == "multiclass" else np.float32)),
            num_classes=int(num_classes), **kwargs,
        )

    def __repr__(self):
        return (
            f"GraphDataset({self.name}: {self.num_graphs} graphs, "
            f"{int(self.node_ptr[-1])} nodes, {self.src.numel()} directed "
            f"edges, {self.feat_dim} features, {self.num_classes} classes)"
        )


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Concatenated ``arange(s, s + n)`` for each start and length."""
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    firsts = lengths.cumsum(0) - lengths
    base = torch.repeat_interleave(starts - firsts, lengths)
    return base + torch.arange(total)


def read_tu(folder: str | os.PathLike, name: str | None = None,
            standardize: bool = True) -> GraphDataset:
    """Read a TU dataset folder.

    Parameters
    ----------
    folder : str or os.PathLike
        The folder holding ``NAME_A.txt`` and the other files.
    name : str, optional
        The file prefix; default: the folder's name.
    standardize : bool, optional
        Standardise node attributes per column. Default: ``True``.

    Returns
    -------
    GraphDataset
        Features as described in the module docstring; ``info`` holds
        ``folder``, ``edge_lines`` (lines of ``NAME_A.txt``),
        ``label_values`` (original label of each class), ``node_labels``
        and ``node_attributes`` (columns used).

    Raises
    ------
    TUFormatError
        A missing or malformed file, naming the file and line.
    """
    folder = Path(folder)
    name = name or folder.name
    if not folder.is_dir():
        raise TUFormatError(f"{folder}: TU dataset folder not found")

    def path(kind):
        return folder / f"{name}_{kind}.txt"

    # (1) Graph membership: sorted, starting at 1, no graph skipped.
    indicator = _read_table(path("graph_indicator"), np.int64, 1)[:, 0]
    num_nodes = indicator.size
    _check_indicator(path("graph_indicator"), indicator)
    num_graphs = int(indicator[-1]) if num_nodes else 0
    # (2) One label per graph, remapped to 0 .. C-1.
    raw_labels = _read_table(path("graph_labels"), np.int64, 1)[:, 0]
    if raw_labels.size != num_graphs:
        raise TUFormatError(
            f"{path('graph_labels')}:{min(raw_labels.size, num_graphs) + 1}: "
            f"{raw_labels.size} labels, but {path('graph_indicator').name} "
            f"has {num_graphs} graphs"
        )
    label_values, labels = np.unique(raw_labels, return_inverse=True)
    # (3) Edges: ids in range, within one graph.
    edges = _read_table(path("A"), np.int64, 2)
    _check_edges(path("A"), edges, indicator)
    # (4) Node features, then the flat dataset.
    features, info = _node_features(path, num_nodes, edges - 1, standardize)
    info.update(folder=str(folder), edge_lines=int(edges.shape[0]),
                label_values=label_values.tolist())
    return GraphDataset.from_edges(
        name, edges[:, 0] - 1, edges[:, 1] - 1,
        np.bincount(indicator - 1, minlength=num_graphs), features,
        labels, num_classes=int(label_values.size), info=info,
    )


def _node_features(path, num_nodes, edges, standardize):
    """One-hot node labels, then standardised attributes; else degrees."""
    parts, info = [], {"node_labels": 0, "node_attributes": 0}
    if path("node_labels").is_file():
        table = _read_table(path("node_labels"), np.int64, None)
        _check_rows(path("node_labels"), table, num_nodes)
        for column in table.T:
            _, index = np.unique(column, return_inverse=True)
            parts.append(np.eye(int(index.max()) + 1,
                                dtype=np.float32)[index])
        info["node_labels"] = table.shape[1]
    if path("node_attributes").is_file():
        table = _read_table(path("node_attributes"), np.float64, None)
        _check_rows(path("node_attributes"), table, num_nodes)
        if standardize and num_nodes:
            std = table.std(axis=0)
            table = (table - table.mean(axis=0)) / np.where(std > 0, std, 1)
        parts.append(table.astype(np.float32))
        info["node_attributes"] = table.shape[1]
    if not parts:
        # Distinct neighbours (IMDB lists every edge twice per direction).
        src, dst = edges[:, 0], edges[:, 1]
        keep = src != dst
        key = np.unique(np.concatenate([src[keep] * num_nodes + dst[keep],
                                        dst[keep] * num_nodes + src[keep]]))
        degree = np.bincount(key // max(num_nodes, 1), minlength=num_nodes)
        cap = min(int(degree.max()) if num_nodes else 0, DEGREE_CAP)
        parts.append(np.eye(cap + 1, dtype=np.float32)[
            np.minimum(degree, cap)])
        info["degree_one_hot"] = cap + 1
    return np.ascontiguousarray(np.concatenate(parts, axis=1)), info


def _read_table(path: Path, dtype, columns: int | None) -> np.ndarray:
    """Parse a comma-separated table; row ``i`` is line ``i + 1``.

    Trailing blank lines are ignored; any other blank line, a value that
    does not parse or a wrong column count raises `TUFormatError` naming
    the line.
    """
    if not path.is_file():
        raise TUFormatError(f"{path}: required TU file is missing")
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    kind = "an integer" if dtype == np.int64 else "a number"
    width = columns or (len(lines[0].split(",")) if lines else 1)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise TUFormatError(f"{path}:{number}: blank line")
        if line.count(",") != width - 1:
            raise TUFormatError(
                f"{path}:{number}: expected {width} comma-separated "
                f"value(s), got {line.strip()!r}"
            )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.loadtxt(lines, delimiter=",", dtype=dtype, ndmin=2
                              ).reshape(len(lines), width)
    except ValueError:
        pass
    for number, line in enumerate(lines, start=1):
        for value in line.split(","):
            try:
                (int if dtype == np.int64 else float)(value)
            except ValueError:
                raise TUFormatError(
                    f"{path}:{number}: {value.strip()!r} is not {kind}"
                ) from None
    raise TUFormatError(f"{path}: cannot be parsed as {kind} table")


def _check_rows(path, table, num_nodes):
    if table.shape[0] != num_nodes:
        raise TUFormatError(
            f"{path}:{min(table.shape[0], num_nodes) + 1}: {table.shape[0]} "
            f"rows, but the graph indicator has {num_nodes} nodes"
        )


def _check_indicator(path, indicator):
    if indicator.size == 0:
        raise TUFormatError(f"{path}:1: no nodes")
    if indicator[0] != 1:
        raise TUFormatError(
            f"{path}:1: first graph id is {indicator[0]}, expected 1"
        )
    step = np.diff(indicator)
    bad = np.flatnonzero((step < 0) | (step > 1))
    if bad.size:
        i = int(bad[0]) + 1
        what = "not sorted" if step[i - 1] < 0 else "skips a graph id"
        raise TUFormatError(
            f"{path}:{i + 1}: graph indicator {what}: graph "
            f"{indicator[i]} after graph {indicator[i - 1]}"
        )


def _check_edges(path, edges, indicator):
    num_nodes = indicator.size
    bad = np.flatnonzero(((edges < 1) | (edges > num_nodes)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise TUFormatError(
            f"{path}:{row + 1}: node id out of range 1..{num_nodes} in "
            f"edge {edges[row, 0]}, {edges[row, 1]}"
        )
    graphs = indicator[edges - 1]
    bad = np.flatnonzero(graphs[:, 0] != graphs[:, 1])
    if bad.size:
        row = int(bad[0])
        raise TUFormatError(
            f"{path}:{row + 1}: edge {edges[row, 0]}, {edges[row, 1]} joins "
            f"graph {graphs[row, 0]} and graph {graphs[row, 1]}"
        )

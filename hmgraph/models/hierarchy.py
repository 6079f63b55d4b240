"""Batched graphs at the levels of a pooling hierarchy, and the base class.

The harness shared by HAP (`hmgraph.models.hap`) and the pooling baselines
(`hmgraph.models.pooling`): `GraphLevel`, the GIN and GCN layers over it,
`coarsen` (``S^T A S``) and `GraphClassifier`, the base of every graph
classifier.

Every `GraphClassifier` has the constructor ``(in_feats, hidden_feats,
num_classes, num_levels=3, dropout=None, ratio=..., max_nodes=None)``,
``forward(graph, features) -> logits`` on a batched DGL graph
(``dgl.batch``, on the CPU; ``features`` on any device), ``embed(graph,
features)`` for the graph embeddings before the classifier, and an
``auxiliary_loss`` tensor set by each forward (0 for models without one)
that the training loop adds to the classification loss. As in
`hmgraph.models.layers`, message passing is torch ``index_add_`` /
``scatter_reduce`` over the graph's edge ids (moved to the features'
device), so the models run on cuda although the DGL wheel is CPU-only.

A batch at one level of a hierarchy is a `GraphLevel`
(`hmgraph.models.graph_level`, whose `GraphLevel`, `coarsen` and
`to_dense_batch` are importable from here too).
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from hmgraph.models.graph_level import (
    MERGE_ROWS,
    GraphLevel,
    coarsen,
    to_dense_batch,
)

__all__ = [
    "MERGE_ROWS",
    "GINConv",
    "GraphClassifier",
    "GraphConv",
    "GraphLevel",
    "coarsen",
    "to_dense_batch",
]


class GINConv(nn.Module):
    """GIN layer: ``MLP((1 + eps) h + sum_neighbours h)``, learnable eps.

    The MLP is Linear -> BatchNorm (optional) -> ReLU -> Linear. On dense
    levels ``normalized`` aggregates over ``D^-1/2 A D^-1/2``.
    """

    def __init__(self, in_feats, out_feats, batch_norm=True, normalized=False):
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(1))
        self.normalized = normalized
        self.mlp = nn.Sequential(
            nn.Linear(in_feats, out_feats),
            nn.BatchNorm1d(out_feats) if batch_norm else nn.Identity(),
            nn.ReLU(), nn.Linear(out_feats, out_feats))

    def forward(self, level, x):
        h = (1 + self.eps) * x + level.aggregate(x, self.normalized)
        return self.mlp(h)


class GraphConv(nn.Module):
    """GCN layer ``Â x W + b`` on any `GraphLevel`."""

    def __init__(self, in_feats, out_feats):
        super().__init__()
        self.linear = nn.Linear(in_feats, out_feats)

    def forward(self, level, x):
        return level.propagate(self.linear(x))


class GraphClassifier(nn.Module):
    """Shared checks, classifier head and `forward`.

    Subclasses implement ``_embed(level, x) -> (B, embed_feats)`` and may
    set ``self.auxiliary_loss`` inside it.

    Parameters
    ----------
    in_feats, hidden_feats, num_classes : int
        Node feature size, hidden size, classes.
    num_levels : int, optional
        Readouts (levels, or GIN layers). Default: ``3``.
    dropout : float, optional
        Dropout in the classifier MLP. Default (None): the class's
        ``default_dropout``, ``0.5`` (HAP: ``0.0``).
    ratio : float, optional
        Kept share of nodes (TopK, SAGPool) or clusters per node (HAP,
        DiffPool) at each pooling, in ``(0, 1]``.
    max_nodes : int, optional
        Nodes of the largest graph (DiffPool's cluster count).
    """

    default_ratio = 0.5
    default_dropout = 0.5

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=None, ratio=None, max_nodes=None):
        super().__init__()
        for name, value in [("in_feats", in_feats),
                            ("hidden_feats", hidden_feats),
                            ("num_classes", num_classes),
                            ("num_levels", num_levels)]:
            if not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(
                    f"{name} must be a positive int; got {value!r}")
        ratio = self.default_ratio if ratio is None else ratio
        dropout = self.default_dropout if dropout is None else dropout
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1]; got {ratio!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout!r}")
        self.in_feats, self.hidden_feats = int(in_feats), int(hidden_feats)
        self.num_classes, self.num_levels = int(num_classes), int(num_levels)
        self.ratio, self.max_nodes = float(ratio), max_nodes
        width = self._embed_width()
        self.classifier = nn.Sequential(
            nn.Linear(width, hidden_feats), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden_feats, max(hidden_feats // 2, 1)), nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(max(hidden_feats // 2, 1), num_classes))
        self.auxiliary_loss = torch.zeros(())

    def embed(self, graph, features):
        """Graph embeddings, ``(graph.batch_size, embed width)``.

        Parameters
        ----------
        graph : dgl.DGLGraph
            A batched graph (``dgl.batch``) on the CPU.
        features : torch.Tensor
            Node features ``(graph.num_nodes(), in_feats)``, any device.

        Returns
        -------
        torch.Tensor
            On ``features.device``; also sets ``auxiliary_loss``.
        """
        if features.dim() != 2 or features.shape != (
                graph.num_nodes(), self.in_feats):
            raise ValueError(
                f"features must have shape (num_nodes={graph.num_nodes()}, "
                f"in_feats={self.in_feats}); got {tuple(features.shape)}")
        self.auxiliary_loss = features.new_zeros(())
        level = GraphLevel.from_graph(graph, features.device)
        return self._embed(level, features)

    def forward(self, graph, features):
        """Class logits ``(graph.batch_size, num_classes)``; see `embed`."""
        return self.classifier(self.embed(graph, features))

    def _embed_width(self):
        """Width of `embed`'s rows: mean ‖ max of ``hidden_feats``."""
        return 2 * self.hidden_feats

    def _embed(self, level, x):
        raise NotImplementedError


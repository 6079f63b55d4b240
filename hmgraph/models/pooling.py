"""Graph classification: the pooling baselines and the model registry.

`POOLING_MODELS` and `build_pooling_model` name every graph classifier:
HAP (`hmgraph.models.hap`, ``hap``, ``hap-sum``) and the baselines below,
all `hmgraph.models.hierarchy.GraphClassifier` subclasses with the same
constructor, readout and classifier head, so differences come from the
pooling. `GraphLevel`, `to_dense_batch` and `HAP` are re-exported here.

The baselines:

- `GIN` (``gin``, sum readout; ``gin-mean``): ``num_levels`` GIN layers,
  readout of every layer, concatenated (Xu et al. 2019).
- `TopKPool` (``topk``): gPool (Gao & Ji 2019): score ``x . p / |p|``,
  keep the ``ceil(ratio * n_g)`` best nodes per graph, gate them with
  ``tanh(score)``; GCN before each pool, ``ratio=0.5``.
- `SAGPool` (``sagpool``): the same, score from a GCN layer (Lee et al.
  2019, SAGPool_h).
- `DiffPool` (``diffpool``): dense DiffPool (Ying et al. 2018): GCN embed
  and GCN assignment per level, ``ceil(0.25 * max_nodes)`` clusters (at
  most ``max_clusters=64``) then 25 % of that, link-prediction and entropy
  losses (weight 1, as the paper).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hmgraph.models.hap import HAP
from hmgraph.models.hierarchy import (
    GINConv,
    GraphClassifier,
    GraphConv,
    GraphLevel,
    coarsen,
    to_dense_batch,
)

__all__ = [
    "GraphLevel",
    "to_dense_batch",
    "GIN",
    "TopKPool",
    "SAGPool",
    "DiffPool",
    "HAP",
    "POOLING_MODELS",
    "build_pooling_model",
    "default_dropout",
]


class GIN(GraphClassifier):
    """GIN with a global readout after every layer, concatenated.

    ``readout`` is ``"sum"`` (the GIN paper's) or ``"mean"``. See
    `GraphClassifier` for the other parameters (``ratio`` unused).
    """

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=None, ratio=None, max_nodes=None, readout="sum"):
        if readout not in ("sum", "mean"):
            raise ValueError(f"readout must be 'sum' or 'mean'; got "
                             f"{readout!r}")
        super().__init__(in_feats, hidden_feats, num_classes, num_levels,
                         dropout, ratio, max_nodes)
        self.readout = readout
        dims = [in_feats] + [hidden_feats] * num_levels
        self.convs = nn.ModuleList(
            GINConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))

    def _embed_width(self):
        return self.num_levels * self.hidden_feats

    def _embed(self, level, x):
        outs = []
        for conv in self.convs:
            x = F.relu(conv(level, x))
            outs.append(level.readout(x, self.readout))
        return torch.cat(outs, dim=-1)


def _select_top(level, score, ratio):
    """Keep the ``ceil(ratio * n_g)`` best-scored nodes of each graph.

    Returns the kept flat rows (grouped by graph) and the sparse level of
    the induced subgraphs.
    """
    dense = level.to_dense(score).masked_fill(~level.mask, -math.inf)
    order = dense.argsort(dim=1, descending=True, stable=True)
    keep_sizes = torch.ceil(ratio * level.sizes.to(score.dtype)).long()
    rank_mask = level.mask & (torch.arange(level.mask.shape[1],
                                           device=score.device)
                              < keep_sizes.unsqueeze(1))
    starts = level.sizes.cumsum(0) - level.sizes
    kept = (order + starts.unsqueeze(1))[rank_mask]
    new_id = torch.full_like(score, -1, dtype=torch.int64)
    new_id[kept] = torch.arange(kept.numel(), device=score.device)
    src, dst = new_id[level.src], new_id[level.dst]
    edge_kept = (src >= 0) & (dst >= 0)
    return kept, GraphLevel.sparse(keep_sizes, src[edge_kept],
                                   dst[edge_kept])


class TopKPool(GraphClassifier):
    """Hierarchical gPool / TopK pooling: [GCN -> pool -> readout] x levels.

    The score is the projection ``x . p / |p|``; kept rows are gated by
    ``tanh(score)`` so ``p`` is trained. See `GraphClassifier`.
    """

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=None, ratio=None, max_nodes=None):
        super().__init__(in_feats, hidden_feats, num_classes, num_levels,
                         dropout, ratio, max_nodes)
        dims = [in_feats] + [hidden_feats] * num_levels
        self.convs = nn.ModuleList(
            GraphConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.scorers = nn.ModuleList(
            self._make_scorer(hidden_feats) for _ in range(num_levels))

    def _make_scorer(self, feats):
        return nn.Linear(feats, 1, bias=False)

    def _score(self, i, level, x):
        weight = self.scorers[i].weight
        return (x @ weight.t()).squeeze(-1) / weight.norm().clamp(min=1e-12)

    def _embed(self, level, x):
        total = 0
        for i, conv in enumerate(self.convs):
            x = F.relu(conv(level, x))
            score = self._score(i, level, x)
            kept, level = _select_top(level, score, self.ratio)
            x = x[kept] * torch.tanh(score[kept]).unsqueeze(-1)
            total = total + level.readout(x)
        return total


class SAGPool(TopKPool):
    """Hierarchical SAGPool: TopK pooling scored by a GCN layer."""

    def _make_scorer(self, feats):
        return GraphConv(feats, 1)

    def _score(self, i, level, x):
        return self.scorers[i](level, x).squeeze(-1)


class DiffPool(GraphClassifier):
    """Dense DiffPool: learned soft cluster assignment per level.

    Level 0 has ``min(ceil(ratio * max_nodes), max_clusters)`` clusters,
    each later level ``ratio`` of the previous; GCN embedding and GCN
    assignment; auxiliary loss = link-prediction ``|A - S S^T|_F^2 / n^2``
    + assignment entropy, averaged over graphs and levels.
    """

    default_ratio = 0.25

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=None, ratio=None, max_nodes=None, max_clusters=64):
        super().__init__(in_feats, hidden_feats, num_classes, num_levels,
                         dropout, ratio, max_nodes)
        if max_nodes is None or max_nodes < 1:
            raise ValueError("DiffPool needs max_nodes (nodes of the "
                             f"largest graph); got {max_nodes!r}")
        counts, count = [], max_nodes
        for _ in range(num_levels - 1):
            count = min(max(1, math.ceil(self.ratio * count)), max_clusters)
            counts.append(count)
        self.cluster_counts = counts
        dims = [in_feats] + [hidden_feats] * num_levels
        self.embeds = nn.ModuleList(
            GraphConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.pools = nn.ModuleList(
            GraphConv(dims[i], k) for i, k in enumerate(counts))

    def _embed(self, level, x):
        total, aux = 0, 0.0
        for i, embed in enumerate(self.embeds):
            z = F.relu(embed(level, x))
            total = total + level.readout(z)
            if i == len(self.pools):
                break
            assign = torch.softmax(self.pools[i](level, x), dim=-1)
            if level.dense:
                assign = assign * level.mask.unsqueeze(-1)
            clusters = torch.ones(level.sizes.numel(), assign.shape[-1],
                                  dtype=torch.bool, device=x.device)
            coarse = coarsen(level, assign, clusters)
            aux = aux + self._losses(level, assign, coarse.adj)
            x = level.graph_matmul(assign, z)
            level = coarse
        self.auxiliary_loss = aux / max(len(self.pools), 1)
        return total

    @staticmethod
    def _losses(level, assign, coarse_adj):
        """Link prediction ``|A - S S^T|_F^2 / n^2`` and entropy, per graph."""
        if level.dense:
            adj_sq = level.adj.pow(2).sum((1, 2))
        else:
            adj_sq = torch.bincount(level.batch[level.src],
                                    minlength=level.sizes.numel())
        gram = level.graph_matmul(assign, assign)
        link = (adj_sq - 2 * coarse_adj.diagonal(dim1=1, dim2=2).sum(-1)
                + gram.pow(2).sum((1, 2)))
        n = level.sizes.clamp(min=1).to(assign.dtype)
        plogp = (assign * torch.log(assign + 1e-12)).sum(-1, keepdim=True)
        entropy = -level.sum_nodes(plogp).squeeze(-1) / n
        return (link.clamp(min=0) / n.pow(2) + entropy).mean()


POOLING_MODELS = {
    "hap": HAP,
    "hap-sum": lambda *args, **kwargs: HAP(*args, input_sum=True, **kwargs),
    "gin": GIN,
    "gin-mean": lambda *args, **kwargs: GIN(*args, readout="mean", **kwargs),
    "topk": TopKPool,
    "sagpool": SAGPool,
    "diffpool": DiffPool,
}
#: The class behind each name (a variant's is its base class's).
_CLASSES = {"hap-sum": HAP, "gin-mean": GIN}


def default_dropout(name: str) -> float:
    """The classifier-head dropout model ``name`` takes by default (see
    `GraphClassifier`): 0 for HAP, 0.5 for the baselines."""
    if name not in POOLING_MODELS:
        raise ValueError(f"unknown model {name!r}; available: "
                         f"{', '.join(sorted(POOLING_MODELS))}")
    return _CLASSES.get(name, POOLING_MODELS[name]).default_dropout


def build_pooling_model(name, in_feats, hidden_feats, num_classes,
                        num_levels=3, dropout=None, ratio=None,
                        max_nodes=None):
    """Build a graph classifier from `POOLING_MODELS` by name.

    Parameters
    ----------
    name : str
        One of ``"diffpool"``, ``"gin"``, ``"gin-mean"``, ``"hap"``,
        ``"hap-sum"``, ``"sagpool"``, ``"topk"``.
    in_feats, hidden_feats, num_classes, num_levels, dropout, ratio
        See `GraphClassifier`; ``ratio=None`` takes the model's default
        (0.25 for HAP and DiffPool, 0.5 for TopK and SAGPool),
        ``dropout=None`` too (0 for HAP, 0.5 for the others).
    max_nodes : int, optional
        Nodes of the dataset's largest graph; required by DiffPool.

    Returns
    -------
    torch.nn.Module
        With parameters on the CPU.

    Raises
    ------
    ValueError
        Unknown name (the message lists the available ones) or a bad
        argument.

    Examples
    --------
    >>> model = build_pooling_model("hap", 7, 64, 2)
    >>> len(model.moas)
    2
    """
    if name not in POOLING_MODELS:
        available = ", ".join(sorted(POOLING_MODELS))
        raise ValueError(f"unknown model {name!r}; available: {available}")
    return POOLING_MODELS[name](in_feats, hidden_feats, num_classes,
                                num_levels=num_levels, dropout=dropout,
                                ratio=ratio, max_nodes=max_nodes)

"""Graph classification: HAP hierarchical adaptive pooling and baselines.

Every model here has the constructor ``(in_feats, hidden_feats,
num_classes, num_levels=3, dropout=0.5, ratio=..., max_nodes=None)``,
``forward(graph, features) -> logits`` on a batched DGL graph
(``dgl.batch``, on the CPU; ``features`` on any device), ``embed(graph,
features)`` for the graph embeddings before the classifier, and an
``auxiliary_loss`` tensor set by each forward (0 for models without one)
that the training loop adds to the classification loss. As in
`hmgraph.models.layers`, message passing is torch ``index_add_`` /
``scatter_reduce`` over the graph's edge ids (moved to the features'
device), so the models run on cuda although the DGL wheel is CPU-only.

A batch at one level of a hierarchy is a `GraphLevel`: the input level is
*sparse* (node rows flat, ``(total nodes, F)``, graph after graph, with
edge ids); a coarsened level is *dense* (rows padded to ``(B, K, F)`` with
a node mask and a weighted adjacency ``(B, K, K)``). TopK and SAGPool stay
sparse at every level (they keep a subset of the nodes); HAP and DiffPool
compute their first assignment from the sparse level (``S^T A S`` as
``S^T (A S)`` with ``A S`` summed over edges, never an ``N x N`` matrix)
and are dense after that.

HAP (Liu et al., "HAP: hierarchical graph-level representation learning
framework adaptively sensitive to graph structures") is described there in
words only; the choices made where the description is silent, and why:

1. **Levels.** ``num_levels=3``: the input graph and two coarsened levels,
   each followed by a readout. Three readouts is the depth of the
   hierarchical SAGPool/gPool architecture and of DiffPool's benchmark
   model, and TU graphs (10-600 nodes) leave little to coarsen beyond two.
2. **Per-level GNN.** Two GIN layers (sum aggregation, MLP with batch
   norm; Xu et al. 2019) on the input graph, where injective aggregation
   matters most; one GIN layer per coarsened level, aggregating over the
   symmetrically normalised weighted adjacency, because ``S^T A S`` has
   weights that grow with cluster size and a plain sum would let large
   clusters dominate.
3. **Super-node counts (adaptive).** Graph ``g`` with ``n_g`` nodes gets
   ``k_g = clamp(ceil(ratio * n_g), 1, max_clusters)`` super-nodes
   (``ratio=0.25``, DiffPool's choice; at the next level ``ratio * k_g``
   again). Counts follow each graph's size as in SAGPool's ``ceil(kN)``,
   rather than DiffPool's one count for all graphs, so small graphs are
   not padded with empty clusters; ``max_clusters`` (default 32 at the
   first level) bounds the padded ``(B, K, K)`` tensors on the CPU.
   Inactive super-nodes are masked out of every softmax and readout.
4. **MOA (cross-level attention).** Queries are ``k_g`` learned super-node
   seeds (shared across graphs, as the inducing points of the Set
   Transformer's PMA) shifted by the level's graph content (GCont, below)
   and the mean node embedding; keys are the finer nodes' embeddings mixed
   with their 1- and 2-hop propagations ``Â h``, ``Â² h`` (``Â`` the
   self-looped GCN normalisation) by learned softmax weights, so nodes
   that share a neighbourhood get similar keys and fall into the same
   super-node: attention favours the close neighbourhood while the 2-hop
   term carries higher-order dependencies. Scaled dot-product logits are
   normalised over the super-nodes (each node distributes its membership,
   as DiffPool's assignment and Slot Attention's competition), and each
   super-node's features are the membership-weighted mean of its nodes'
   embeddings (Slot Attention's normalisation, with ``eps=1e-8``).
5. **Coarsened graph.** ``A' = S^T A S`` (DiffPool), a weighted adjacency
   whose diagonal keeps intra-cluster edges.
6. **GCont.** One learned content vector per level (a parameter, hence the
   same for every graph and every graph of the same feature form) scores
   the nodes, ``a_i = softmax_i(c . tanh(W h_i))``, and the graph content
   is ``sum_i a_i h_i`` (the attention readout of gated graph networks).
   It guides coarsening (added to the queries) and is compared before and
   after coarsening: the stability loss is ``1 - cos(content before,
   content after)``, a scale-free form that embeddings cannot satisfy by
   shrinking; it is averaged over graphs and levels and weighted by
   ``content_weight=0.1`` (small, as DiffPool's auxiliary losses, so that
   classification leads).
7. **Readout.** Mean and max over the (active) nodes of each level,
   concatenated, summed over levels (SAGPool_h / gPool's hierarchical
   readout), then a 3-layer MLP classifier with dropout. All hierarchical
   baselines here use the same readout and classifier, so differences
   come from the pooling. ``hap-sum`` (``input_sum=True``) also
   concatenates the *sum* of the input level's rows: mean and max forget
   how many nodes carry a pattern, the sum keeps the counts (GIN's
   argument for injective readouts, Xu et al. 2019), and the coarsened
   levels, built from weighted means, do not keep them either.

Baselines, in the same harness:

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
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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
]


def to_dense_batch(x, sizes):
    """Pad flat node rows, graph after graph, to a dense batch.

    Parameters
    ----------
    x : torch.Tensor
        Shape ``(sum(sizes), *feat_shape)``; rows of graph 0, then 1, ...
    sizes : torch.Tensor
        int64 nodes per graph, shape ``(B,)``, on ``x.device``.

    Returns
    -------
    tuple of torch.Tensor
        ``dense`` of shape ``(B, max(sizes), *feat_shape)`` with zeros in
        the padding, and ``mask`` (bool, ``(B, max(sizes))``, True on real
        nodes); both on ``x.device``.
    """
    width = int(sizes.max()) if sizes.numel() else 0
    mask = torch.arange(width, device=x.device) < sizes.unsqueeze(1)
    dense = x.new_zeros((sizes.numel(), width, *x.shape[1:]))
    dense[mask] = x
    return dense, mask


@dataclass
class GraphLevel:
    """A batch of ``B`` graphs at one level of a pooling hierarchy.

    Sparse (``adj is None``): node rows are flat, ``(sizes.sum(), F)``,
    graph after graph; ``batch`` is each row's graph and ``src`` / ``dst``
    hold the edges. Dense: node rows are ``(B, K, F)``, ``mask`` marks real
    rows and ``adj`` is the weighted ``(B, K, K)`` adjacency. Per-node work
    stays in the level's own layout (padding a sparse level to ``(B,
    max_nodes, F)`` costs 16x the rows on PROTEINS). Tensors are on the
    model's device.
    """

    sizes: torch.Tensor
    mask: torch.Tensor
    batch: torch.Tensor | None = None
    src: torch.Tensor | None = None
    dst: torch.Tensor | None = None
    adj: torch.Tensor | None = None

    @classmethod
    def sparse(cls, sizes, src, dst) -> GraphLevel:
        """A sparse level from nodes per graph and flat edge ids."""
        width = int(sizes.max()) if sizes.numel() else 0
        mask = torch.arange(width, device=sizes.device) < sizes.unsqueeze(1)
        batch = torch.repeat_interleave(
            torch.arange(sizes.numel(), device=sizes.device), sizes)
        return cls(sizes, mask, batch, src, dst)

    @classmethod
    def from_graph(cls, graph, device) -> GraphLevel:
        """The sparse level of a batched DGL graph, on ``device``."""
        src, dst = graph.edges()
        sizes = graph.batch_num_nodes().to(device=device, dtype=torch.int64)
        return cls.sparse(sizes, src.to(device, torch.int64),
                          dst.to(device, torch.int64))

    @property
    def dense(self) -> bool:
        return self.adj is not None

    def to_dense(self, x):
        """Rows as ``(B, K, ...)``, zero padded."""
        return x if self.dense else to_dense_batch(x, self.sizes)[0]

    def from_dense(self, x):
        """Inverse of `to_dense` (back to the level's own layout)."""
        return x if self.dense else x[self.mask]

    def aggregate(self, x, normalized=False):
        """Sum of neighbour rows (weighted on dense levels).

        With ``normalized`` the adjacency is ``D^-1/2 A D^-1/2``.
        """
        if self.dense:
            adj = self.adj
            if normalized:
                norm = adj.sum(-1).clamp(min=1e-6).pow(-0.5)
                adj = norm.unsqueeze(-1) * adj * norm.unsqueeze(-2)
            return adj @ x
        if normalized:
            degree = torch.bincount(self.dst, minlength=x.shape[0])
            norm = degree.clamp(min=1).to(x.dtype).pow(-0.5)
            norm = norm.view(-1, *[1] * (x.dim() - 1))
            return norm * self.aggregate(norm * x)
        out = torch.zeros_like(x)
        return out.index_add_(0, self.dst, x.index_select(0, self.src))

    def propagate(self, x):
        """GCN propagation ``D^-1/2 (A + I) D^-1/2 x``."""
        if self.dense:
            degree = self.adj.sum(-1) + 1.0
        else:
            degree = torch.bincount(self.dst, minlength=x.shape[0]) + 1.0
        norm = degree.to(x.dtype).pow(-0.5).unsqueeze(-1)
        return norm * (self.aggregate(norm * x) + norm * x)

    def sum_nodes(self, x):
        """Per-graph sum of rows, ``(B, F)``; padding excluded."""
        if self.dense:
            return (x * self.mask.unsqueeze(-1)).sum(1)
        out = x.new_zeros((self.sizes.numel(), x.shape[-1]))
        return out.index_add_(0, self.batch, x)

    def softmax_nodes(self, scores):
        """Softmax of per-node scores over each graph's nodes."""
        dense = self.to_dense(scores).masked_fill(~self.mask, -math.inf)
        weights = torch.nan_to_num(torch.softmax(dense, dim=1))
        return self.from_dense(weights)

    def readout(self, x, how="meanmax"):
        """Per-graph ``sum``, ``mean`` or ``meanmax`` (mean ‖ max), ``(B, .)``.

        Padded rows and empty graphs contribute nothing (zeros).
        """
        total = self.sum_nodes(x)
        if how == "sum":
            return total
        mean = total / self.sizes.clamp(min=1).unsqueeze(-1).to(x.dtype)
        if how == "mean":
            return mean
        if self.dense:
            peak = x.masked_fill(~self.mask.unsqueeze(-1), -math.inf).amax(1)
            peak = peak.masked_fill(self.sizes.unsqueeze(-1) == 0, 0.0)
        else:
            index = self.batch.unsqueeze(-1).expand_as(x)
            peak = x.new_zeros((self.sizes.numel(), x.shape[-1]))
            peak = peak.scatter_reduce(0, index, x, reduce="amax",
                                       include_self=False)
        return torch.cat([mean, peak], dim=-1)


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


class _GraphClassifier(nn.Module):
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
        Dropout in the classifier MLP. Default: ``0.5``.
    ratio : float, optional
        Kept share of nodes (TopK, SAGPool) or clusters per node (HAP,
        DiffPool) at each pooling, in ``(0, 1]``.
    max_nodes : int, optional
        Nodes of the largest graph (DiffPool's cluster count).
    """

    default_ratio = 0.5

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=0.5, ratio=None, max_nodes=None):
        super().__init__()
        for name, value in [("in_feats", in_feats),
                            ("hidden_feats", hidden_feats),
                            ("num_classes", num_classes),
                            ("num_levels", num_levels)]:
            if not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(
                    f"{name} must be a positive int; got {value!r}")
        ratio = self.default_ratio if ratio is None else ratio
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


class GIN(_GraphClassifier):
    """GIN with a global readout after every layer, concatenated.

    ``readout`` is ``"sum"`` (the GIN paper's) or ``"mean"``. See
    `_GraphClassifier` for the other parameters (``ratio`` unused).
    """

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=0.5, ratio=None, max_nodes=None, readout="sum"):
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


class TopKPool(_GraphClassifier):
    """Hierarchical gPool / TopK pooling: [GCN -> pool -> readout] x levels.

    The score is the projection ``x . p / |p|``; kept rows are gated by
    ``tanh(score)`` so ``p`` is trained. See `_GraphClassifier`.
    """

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=0.5, ratio=None, max_nodes=None):
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


def _coarsen(level, assign, cluster_mask):
    """The dense level with adjacency ``S^T A S``.

    ``assign`` is ``S`` as a dense ``(B, N, K)`` tensor (zero on padded
    nodes); ``A S`` is summed over the level's edges (or ``adj @ S``), so a
    sparse level never builds an ``N x N`` matrix. ``cluster_mask`` (``(B,
    K)``) marks the super-nodes in use.
    """
    adj_assign = level.to_dense(level.aggregate(level.from_dense(assign)))
    adj = assign.transpose(1, 2) @ adj_assign
    adj = adj * (cluster_mask.unsqueeze(1) & cluster_mask.unsqueeze(2))
    return GraphLevel(cluster_mask.sum(1), cluster_mask, adj=adj)


class DiffPool(_GraphClassifier):
    """Dense DiffPool: learned soft cluster assignment per level.

    Level 0 has ``min(ceil(ratio * max_nodes), max_clusters)`` clusters,
    each later level ``ratio`` of the previous; GCN embedding and GCN
    assignment; auxiliary loss = link-prediction ``|A - S S^T|_F^2 / n^2``
    + assignment entropy, averaged over graphs and levels.
    """

    default_ratio = 0.25

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=0.5, ratio=None, max_nodes=None, max_clusters=64):
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
            logits = self.pools[i](level, x)
            assign = level.to_dense(torch.softmax(logits, dim=-1))
            assign = assign * level.mask.unsqueeze(-1)
            clusters = torch.ones(assign.shape[0], assign.shape[2],
                                  dtype=torch.bool, device=x.device)
            coarse = _coarsen(level, assign, clusters)
            aux = aux + self._losses(level, assign, coarse.adj)
            x = assign.transpose(1, 2) @ level.to_dense(z)
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
        gram = assign.transpose(1, 2) @ assign
        link = (adj_sq - 2 * coarse_adj.diagonal(dim1=1, dim2=2).sum(-1)
                + gram.pow(2).sum((1, 2)))
        n = level.sizes.clamp(min=1).to(assign.dtype)
        entropy = -(assign * torch.log(assign + 1e-12)).sum((1, 2)) / n
        return (link.clamp(min=0) / n.pow(2) + entropy).mean()


class GCont(nn.Module):
    """Learned global graph content of one level.

    A content vector ``c`` (a parameter, shared by all graphs) scores each
    node, ``a_i = softmax_i(c . tanh(W h_i))``; the graph's content is
    ``sum_i a_i h_i``, ``(B, F)``.
    """

    def __init__(self, feats):
        super().__init__()
        self.proj = nn.Linear(feats, feats)
        self.content = nn.Parameter(torch.randn(feats) / math.sqrt(feats))

    def forward(self, level, x):
        """Content of the rows ``x`` of ``level`` (its own layout)."""
        weights = level.softmax_nodes(torch.tanh(self.proj(x)) @ self.content)
        return level.sum_nodes(weights.unsqueeze(-1) * x)


class MOA(nn.Module):
    """Cross-level attention from super-node seeds to the finer nodes.

    See choices 3-6 of the module docstring. ``forward(level, h)`` returns
    the coarse dense level, its rows ``(B, K, F)`` and the GCont stability
    loss (a scalar).
    """

    def __init__(self, feats, ratio, max_clusters, hops=2):
        super().__init__()
        self.ratio, self.max_clusters, self.hops = ratio, max_clusters, hops
        self.seeds = nn.Parameter(torch.randn(max_clusters, feats))
        self.hop_logits = nn.Parameter(torch.zeros(hops + 1))
        self.gcont = GCont(feats)
        self.guide = nn.Linear(2 * feats, feats)
        self.query = nn.Linear(feats, feats)
        self.key = nn.Linear(feats, feats, bias=False)

    def cluster_counts(self, sizes):
        """Super-nodes per graph: ``clamp(ceil(ratio * n), 1, max)``."""
        counts = torch.ceil(self.ratio * sizes.to(torch.float64)).long()
        return counts.clamp(1, self.max_clusters)

    def forward(self, level, h):
        # (1) Super-node counts and their mask.
        counts = self.cluster_counts(level.sizes)
        width = int(counts.max()) if counts.numel() else 0
        clusters = torch.arange(width, device=h.device) < counts.unsqueeze(1)
        # (2) Keys: embeddings mixed with their 1..hops propagations.
        mix, hop = torch.softmax(self.hop_logits, 0), h
        context = mix[0] * h
        for i in range(1, self.hops + 1):
            hop = level.propagate(hop)
            context = context + mix[i] * hop
        keys = level.to_dense(self.key(context))
        # (3) Queries: seeds guided by the graph content (GCont) and mean.
        before = self.gcont(level, h)
        guide = self.guide(torch.cat([before, level.readout(h, "mean")], -1))
        queries = self.query(self.seeds[:width] + guide.unsqueeze(1))
        # (4) Memberships: softmax over the active super-nodes per node.
        logits = keys @ queries.transpose(1, 2) / math.sqrt(h.shape[-1])
        logits = logits.masked_fill(~clusters.unsqueeze(1), -math.inf)
        member = torch.softmax(logits, dim=-1)
        member = member * level.mask.unsqueeze(-1)  # (B, N, K), 0 on pad
        # (5) Super-node rows: membership-weighted means; A' = S^T A S.
        weights = (member + 1e-8) * level.mask.unsqueeze(-1)
        weights = weights / weights.sum(1, keepdim=True).clamp(min=1e-12)
        rows = weights.transpose(1, 2) @ level.to_dense(h)
        rows = rows * clusters.unsqueeze(-1)
        coarse = _coarsen(level, member, clusters)
        # (6) GCont stability: content before and after coarsening.
        after = self.gcont(coarse, rows)
        stability = 1 - F.cosine_similarity(before, after, dim=-1, eps=1e-8)
        return coarse, rows, stability.mean()


class HAP(_GraphClassifier):
    """HAP: hierarchical adaptive pooling with MOA and GCont.

    Level 0: two GIN layers on the input graph; each later level: MOA
    coarsening, then one GIN layer over the normalised coarse adjacency;
    mean ‖ max readout per level, summed; ``auxiliary_loss`` is
    ``content_weight`` x the mean GCont stability loss. See the module
    docstring for every choice and `_GraphClassifier` for parameters;
    ``max_clusters`` bounds super-nodes per graph at the first coarsening
    (``ratio`` of it at the next); ``input_sum`` adds the input level's sum
    readout to the embedding (choice 7).
    """

    default_ratio = 0.25

    def __init__(self, in_feats, hidden_feats, num_classes, num_levels=3,
                 dropout=0.5, ratio=None, max_nodes=None, max_clusters=32,
                 content_weight=0.1, input_sum=False):
        self.input_sum = bool(input_sum)  # read by _embed_width below
        super().__init__(in_feats, hidden_feats, num_classes, num_levels,
                         dropout, ratio, max_nodes)
        if not isinstance(max_clusters, numbers.Integral) or max_clusters < 1:
            raise ValueError(f"max_clusters must be a positive int; got "
                             f"{max_clusters!r}")
        self.content_weight = float(content_weight)
        self.input_convs = nn.ModuleList([GINConv(in_feats, hidden_feats),
                                          GINConv(hidden_feats, hidden_feats)])
        self.moas, self.convs, cap = nn.ModuleList(), nn.ModuleList(), None
        for _ in range(num_levels - 1):
            cap = max_clusters if cap is None else max(
                1, math.ceil(self.ratio * cap))
            self.moas.append(MOA(hidden_feats, self.ratio, cap))
            self.convs.append(GINConv(hidden_feats, hidden_feats,
                                      batch_norm=False, normalized=True))

    def _embed_width(self):
        return (3 if self.input_sum else 2) * self.hidden_feats

    def _embed(self, level, x):
        for conv in self.input_convs:
            x = F.relu(conv(level, x))
        total, stability = level.readout(x), 0.0
        counts = level.readout(x, "sum") if self.input_sum else None
        for moa, conv in zip(self.moas, self.convs, strict=True):
            level, x, loss = moa(level, x)
            stability = stability + loss
            x = F.relu(conv(level, x)) * level.mask.unsqueeze(-1)
            total = total + level.readout(x)
        if self.moas:
            self.auxiliary_loss = (self.content_weight * stability
                                   / len(self.moas))
        return total if counts is None else torch.cat([counts, total], -1)


POOLING_MODELS = {
    "hap": HAP,
    "hap-sum": lambda *args, **kwargs: HAP(*args, input_sum=True, **kwargs),
    "gin": GIN,
    "gin-mean": lambda *args, **kwargs: GIN(*args, readout="mean", **kwargs),
    "topk": TopKPool,
    "sagpool": SAGPool,
    "diffpool": DiffPool,
}


def build_pooling_model(name, in_feats, hidden_feats, num_classes,
                        num_levels=3, dropout=0.5, ratio=None,
                        max_nodes=None):
    """Build a graph classifier from `POOLING_MODELS` by name.

    Parameters
    ----------
    name : str
        One of ``"diffpool"``, ``"gin"``, ``"gin-mean"``, ``"hap"``,
        ``"hap-sum"``, ``"sagpool"``, ``"topk"``.
    in_feats, hidden_feats, num_classes, num_levels, dropout, ratio
        See `_GraphClassifier`; ``ratio=None`` takes the model's default
        (0.25 for HAP and DiffPool, 0.5 for TopK and SAGPool).
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

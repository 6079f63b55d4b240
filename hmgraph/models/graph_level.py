"""A batch of graphs at one level of a pooling hierarchy: `GraphLevel`.

The level that HAP (`hmgraph.models.hap`) and the pooling baselines
(`hmgraph.models.pooling`) pass between their layers, `to_dense_batch`,
and `coarsen` (``S^T A S``), which builds the next level.

A batch at one level of a hierarchy is a `GraphLevel`: the input level is
*sparse* (node rows flat, ``(total nodes, F)``, graph after graph, with
edge ids); a coarsened level has a weighted adjacency ``(B, K, K)`` and
rows either *dense* (padded to ``(B, K, F)`` with a node mask) or
*packed* (flat, graph after graph, as a sparse level's). TopK and SAGPool
stay sparse at every level (they keep a subset of the nodes); HAP and
DiffPool compute their first assignment from the sparse level (``S^T A
S`` as ``S^T (A S)`` with ``A S`` summed over edges, never an ``N x N``
matrix). DiffPool's coarse levels are dense (every graph has every
cluster); HAP's are packed, since its graphs have ``ceil(ratio n_g)``
super-nodes each and padding them to the batch's most (NCI1 at batch 128:
about 8 on average, 19 to 28 at most) would multiply every coarse row's
work 2.5-3.5x. Per-graph products ``S^T X`` on a sparse level pad graphs
in groups of similar size (`GraphLevel.graph_matmul`), not each to the
batch's largest: DD's graphs (30 to 5,748 nodes) padded to the largest
are 20x their nodes at batch 128.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

#: `GraphLevel.size_groups` merges two groups of graphs where that pads
#: fewer rows than this: the cost, in rows, of a group's own operations.
MERGE_ROWS = 1024

__all__ = [
    "MERGE_ROWS",
    "GraphLevel",
    "coarsen",
    "to_dense_batch",
]


def _row_graphs(sizes):
    """Each flat row's graph: graph ``g`` repeated ``sizes[g]`` times."""
    return torch.repeat_interleave(
        torch.arange(sizes.numel(), device=sizes.device), sizes)


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
    hold the edges. Dense (``adj`` set, ``batch`` None): node rows are
    ``(B, K, F)``, ``mask`` marks real rows and ``adj`` is the weighted
    ``(B, K, K)`` adjacency. Packed (``adj`` and ``batch`` set): rows flat
    as a sparse level's, edges in ``adj`` as a dense one's; message
    passing pads the rows for one ``bmm``. Per-node work stays in the
    level's own layout (padding a sparse level to ``(B, max_nodes, F)``
    costs 16x the rows on PROTEINS). Tensors are on the model's device.

    What depends on the level's structure only (a sparse level's padded
    positions and degrees, a dense level's degrees) is computed once and
    kept in ``cache``; a level is built once per forward and not changed
    after.
    """

    sizes: torch.Tensor
    mask: torch.Tensor
    batch: torch.Tensor | None = None
    src: torch.Tensor | None = None
    dst: torch.Tensor | None = None
    adj: torch.Tensor | None = None
    cache: dict = field(default_factory=dict, init=False, repr=False,
                        compare=False)

    @classmethod
    def sparse(cls, sizes, src, dst) -> GraphLevel:
        """A sparse level from nodes per graph and flat edge ids."""
        width = int(sizes.max()) if sizes.numel() else 0
        mask = torch.arange(width, device=sizes.device) < sizes.unsqueeze(1)
        return cls(sizes, mask, _row_graphs(sizes), src, dst)

    @classmethod
    def from_graph(cls, graph, device) -> GraphLevel:
        """The sparse level of a batched DGL graph, on ``device``."""
        src, dst = graph.edges()
        sizes = graph.batch_num_nodes().to(device=device, dtype=torch.int64)
        return cls.sparse(sizes, src.to(device, torch.int64),
                          dst.to(device, torch.int64))

    @property
    def dense(self) -> bool:
        """Rows padded to ``(B, K, F)`` (else flat, graph after graph)."""
        return self.adj is not None and self.batch is None

    def _cached(self, key, make):
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def ranks(self):
        """Row ``i`` of a sparse or packed level: its rank among its
        graph's rows."""
        def make():
            starts = self.sizes.cumsum(0) - self.sizes
            rows = torch.arange(self.batch.numel(), device=self.batch.device)
            return rows - starts[self.batch]
        return self._cached("ranks", make)

    def positions(self):
        """Row ``i`` of a flat level: its row in ``to_dense(x).flatten(0,
        1)`` (graph ``batch[i]`` times the padded width plus its rank)."""
        return self._cached("positions", lambda: self.ranks()
                            + self.batch * self.mask.shape[1])

    def to_dense(self, x):
        """Rows as ``(B, K, ...)``, zero padded.

        Kept per tensor while the level lives: HAP pads the same
        memberships for several products.
        """
        if self.dense:
            return x
        key = ("to_dense", id(x))
        last = self.cache.get(key)
        if last is not None and last[0] is x and last[1] == x._version:
            return last[2]
        shape = (self.sizes.numel(), self.mask.shape[1], *x.shape[1:])
        flat = x.new_zeros((shape[0] * shape[1], *x.shape[1:]))
        dense = flat.index_copy_(0, self.positions(), x).view(shape)
        self.cache[key] = (x, x._version, dense)
        return dense

    def from_dense(self, x):
        """Inverse of `to_dense` (back to the level's own layout)."""
        if self.dense:
            return x
        return x.flatten(0, 1).index_select(0, self.positions())

    def per_node(self, x):
        """Per-graph rows ``(B, ...)`` broadcast to the level's nodes.

        ``(total nodes, ...)`` on a sparse level, ``(B, 1, ...)`` on a
        dense one.
        """
        return x.unsqueeze(1) if self.dense else x.index_select(0, self.batch)

    def size_groups(self):
        """A sparse level's graphs in groups of similar size.

        Graph ``g`` joins group ``ceil(log2 n_g)``, so no graph is padded
        to more than twice its nodes; neighbouring groups are then merged
        while that adds fewer than `MERGE_ROWS` padded rows, since each
        group costs a few operations of its own. (Padding a batch to its
        largest graph pads NCI1's nodes 3.6x at batch 128, DD's 20x.)

        Returns
        -------
        tuple
            ``groups``, per group ``(graphs, width)``: its graph ids (a
            list, in id order) and padded width (its largest graph);
            ``slots``, each node's row in a buffer of every group's
            padded rows, group after group (`positions` for one group);
            ``inverse``, each graph's position among the groups' graphs.
        """
        def make():
            sizes = self.sizes.tolist()
            members = {}
            for graph, n in enumerate(sizes):  # ceil(log2 n): n <= 2^c
                members.setdefault(max(n - 1, 0).bit_length(), []).append(
                    graph)
            bounds = [(2 ** c, members[c]) for c in sorted(members)]
            while len(bounds) > 1:
                added = [len(graphs) * (bounds[i + 1][0] - limit)
                         for i, (limit, graphs) in enumerate(bounds[:-1])]
                i = min(range(len(added)), key=added.__getitem__)
                if added[i] >= MERGE_ROWS:
                    break
                merged = sorted(bounds[i][1] + bounds[i + 1][1])
                bounds[i:i + 2] = [(bounds[i + 1][0], merged)]
            groups = [(graphs, max(sizes[g] for g in graphs))
                      for _, graphs in bounds]
            if len(groups) == 1:
                return groups, self.positions(), None
            starts, order, offset = [0] * len(sizes), [], 0
            for graphs, width in groups:
                for local, graph in enumerate(graphs):
                    starts[graph] = offset + local * width
                offset += len(graphs) * width
                order += graphs
            device = self.sizes.device
            slots = torch.tensor(starts, device=device)[self.batch] \
                + self.ranks()
            inverse = torch.empty(len(order), dtype=torch.int64)
            inverse[order] = torch.arange(len(order))
            return groups, slots, inverse.to(device)
        return self._cached("size_groups", make)

    def graph_matmul(self, a, b, a_cols=None, b_cols=None):
        """Per graph ``a_g^T b_g``, ``(B, a.shape[-1], b.shape[-1])``.

        ``a`` and ``b`` are rows in the level's layout (zero on a dense
        level's padding). ``a_cols`` / ``b_cols`` (``(B,)``, optional):
        per graph, how many leading columns of ``a`` / ``b`` can be
        nonzero (HAP's super-nodes); the product leaves the others out
        and their entries are 0. A sparse level is padded group by group
        (`size_groups`), not to its largest graph; a packed one to its
        most super-nodes (a few dozen at most).
        """
        if self.adj is not None:  # K <= a few dozen: pad to the most
            return self.to_dense(a).transpose(1, 2) @ self.to_dense(b)
        groups, slots, inverse = self.size_groups()
        if not groups:  # no graphs
            return a.new_zeros((0, a.shape[1], b.shape[1]))
        a_cols = None if a_cols is None else a_cols.tolist()
        b_cols = None if b_cols is None else b_cols.tolist()
        spans = [len(graphs) * width for graphs, width in groups]
        rows = sum(spans)
        # Split, not sliced: the backward of a split is one concatenation,
        # of a slice a zero-filled buffer each.
        parts_a = a.new_zeros((rows, a.shape[1])).index_copy_(
            0, slots, a).split(spans)
        parts_b = b.new_zeros((rows, b.shape[1])).index_copy_(
            0, slots, b).split(spans)
        parts = []
        for (graphs, width), part_a, part_b in zip(groups, parts_a, parts_b,
                                                   strict=True):
            ka = a.shape[1] if a_cols is None else max(a_cols[g]
                                                       for g in graphs)
            kb = b.shape[1] if b_cols is None else max(b_cols[g]
                                                       for g in graphs)
            part_a = part_a.view(len(graphs), width, a.shape[1])[..., :ka]
            part_b = part_b.view(len(graphs), width, b.shape[1])[..., :kb]
            part = part_a.transpose(1, 2) @ part_b
            if (ka, kb) != (a.shape[1], b.shape[1]):
                part = nn.functional.pad(
                    part, (0, b.shape[1] - kb, 0, a.shape[1] - ka))
            parts.append(part)
        if inverse is None:  # one group: the graphs in id order
            return parts[0]
        return torch.cat(parts).index_select(0, inverse)

    def aggregate(self, x, normalized=False):
        """Sum of neighbour rows (weighted on dense and packed levels).

        With ``normalized`` the adjacency is ``D^-1/2 A D^-1/2``.
        """
        if self.adj is not None:
            adj = self.adj
            if normalized:
                norm = adj.sum(-1).clamp(min=1e-6).pow(-0.5)
                adj = norm.unsqueeze(-1) * adj * norm.unsqueeze(-2)
            return self.from_dense(adj @ self.to_dense(x))
        if normalized:
            degree = torch.bincount(self.dst, minlength=x.shape[0])
            norm = degree.clamp(min=1).to(x.dtype).pow(-0.5)
            norm = norm.view(-1, *[1] * (x.dim() - 1))
            return norm * self.aggregate(norm * x)
        out = torch.zeros_like(x)
        return out.index_add_(0, self.dst, x.index_select(0, self.src))

    def propagate(self, x):
        """GCN propagation ``D^-1/2 (A + I) D^-1/2 x``."""
        def make():
            if self.adj is not None:
                degree = self.from_dense(self.adj.sum(-1)) + 1.0
            else:
                degree = torch.bincount(self.dst, minlength=x.shape[0]) + 1.0
            return degree.to(x.dtype).pow(-0.5).unsqueeze(-1)
        norm = self._cached(("propagate", x.dtype, x.shape[0]), make)
        scaled = norm * x
        return norm * (self.aggregate(scaled) + scaled)

    def sum_nodes(self, x):
        """Per-graph sum of rows, ``(B, F)``; padding excluded.

        The last result is kept: the readout and MOA sum the same rows.
        """
        last = self.cache.get("sum_nodes")
        if last is not None and last[0] is x:
            return last[1]
        if self.dense:
            out = (x * self.mask.unsqueeze(-1)).sum(1)
        else:
            out = x.new_zeros((self.sizes.numel(), x.shape[-1]))
            out = out.index_add_(0, self.batch, x)
        self.cache["sum_nodes"] = (x, out)
        return out

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
        else:  # not torch.segment_reduce: in PyTorch 2.2 its backward
            # splits a tie's gradient only where the gradient is positive
            # (a negative one reaches every tied row whole). From -inf, so
            # that a tie at 0 is not shared with the initial value.
            index = self.batch.unsqueeze(-1).expand_as(x)
            peak = x.new_full((self.sizes.numel(), x.shape[-1]), -math.inf)
            peak = peak.scatter_reduce(0, index, x, reduce="amax")
        peak = peak.masked_fill(self.sizes.unsqueeze(-1) == 0, 0.0)
        return torch.cat([mean, peak], dim=-1)


def coarsen(level, assign, cluster_mask, packed=False):
    """The coarse level with adjacency ``S^T A S``.

    ``assign`` is ``S`` in the level's layout (``(nodes, K)`` on a sparse
    or packed level, ``(B, N, K)`` with zero padded rows on a dense one);
    ``cluster_mask`` (``(B, K)``) marks each graph's super-nodes in use,
    its leading ones, outside which ``S`` is 0. ``A S`` is summed over the
    level's edges (or ``adj @ S``), so a sparse level never builds an ``N
    x N`` matrix, and ``S^T (A S)`` is `GraphLevel.graph_matmul`'s. The
    coarse level is dense, or with ``packed`` holds its rows packed
    (`GraphLevel`; ``coarse.from_dense`` packs padded super-node rows).
    """
    counts = cluster_mask.sum(1)
    if level.adj is None:
        adj = level.graph_matmul(assign, level.aggregate(assign), counts,
                                 counts)
    else:  # a dense or packed level: S^T (A S) on padded rows
        padded = level.to_dense(assign)
        adj = padded.transpose(1, 2) @ (level.adj @ padded)
    adj = adj * (cluster_mask.unsqueeze(1) & cluster_mask.unsqueeze(2))
    return GraphLevel(counts, cluster_mask, adj=adj,
                      batch=_row_graphs(counts) if packed else None)

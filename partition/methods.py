"""Partition methods: which part owns each vertex, and what it replicates.

Four methods, selectable by name (`METHODS`):

``random``
    DGL's random baseline: every vertex to a part drawn uniformly
    (`dgl.random.choice`, seeded).
``metis``
    DGL's METIS baseline: `dgl.metis_partition_assignment` with training
    vertices and edges balanced, as DGL's distributed examples partition.
``self-dependence`` (2PGraph)
    Parts are unions of whole METIS clusters, grown by linear deterministic
    greedy assignment (LDG, Stanton and Kliot, KDD 2012): each cluster, the
    one with most training vertices first, joins the part it has most edges
    to, discounted by how full that part already is in training vertices.
    Each part then replicates the dependencies of its own training vertices
    (the vertices its trainer's L-hop sampling reaches) up to a replication
    budget, most-read first, so that most feature reads stay local.
``hierarchy`` (HMGraph)
    Clusters are assigned by the same greedy rule, but a part is full when
    either its training vertices or its *hot feature bytes* (rows in the
    profiled hot set) reach its share: the hot-byte share of a part is its
    machine's fast-tier budget (device + host bytes), so each machine's
    fast tiers can hold its own hot rows. Hot rows follow training
    vertices, so on machines of unequal budgets the two balances conflict:
    training vertices may exceed an even share by 20 %, hot bytes a
    machine's share by 5 %, and where no part has room the item goes where
    it overflows least. Replicas as for ``self-dependence``, capped by the
    same budget.

A method returns an `Assignment`; `hmgraph.partition.export` writes it in
DGL's distributed format.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["METHODS", "Assignment", "assign", "ldg_assign", "replicas_from"]

log = logging.getLogger(__name__)

@dataclass
class Assignment:
    """Owner part of every vertex, and per-part replicated vertices.

    Attributes
    ----------
    method : str
        One of `METHODS`.
    parts : torch.Tensor
        int64 (num_nodes,): the part owning each vertex.
    replicas : list of torch.Tensor
        Per part, sorted int64 ids of vertices owned elsewhere whose
        features the part stores too. Empty for DGL's methods.
    info : dict
        The method's settings (clusters, budgets, replication), as JSON.
    """

    method: str
    parts: torch.Tensor
    replicas: list[torch.Tensor]
    info: dict = field(default_factory=dict)

    @property
    def num_parts(self) -> int:
        return len(self.replicas)

    @property
    def num_nodes(self) -> int:
        return int(self.parts.numel())

    def replication_factor(self) -> float:
        """Feature rows stored over all parts, per vertex (1.0: none)."""
        copies = sum(int(r.numel()) for r in self.replicas)
        return (self.num_nodes + copies) / max(1, self.num_nodes)

    def local_ids(self, part: int) -> torch.Tensor:
        """Sorted ids whose features part ``part`` stores (owned + copies)."""
        owned = torch.nonzero(self.parts == part).flatten()
        return torch.sort(torch.cat([owned, self.replicas[part]])).values


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(
            f"unknown partition method {method!r}; "
            f"available: {', '.join(METHODS)}"
        )


def ldg_assign(weights: np.ndarray, affinity, capacities: np.ndarray
               ) -> np.ndarray:
    """Linear deterministic greedy assignment of items to bins.

    Items (clusters) are taken heaviest first (by the first weight); each
    goes to the bin maximising ``edges to the bin * (1 - fill)``, where
    ``fill`` is the bin's fullest resource relative to its capacity; ties
    go to the emptiest bin. Bins the item would overflow are used only
    when every bin would, and then the one overflowing least.

    Parameters
    ----------
    weights : numpy.ndarray
        float (num_items, num_resources): what each item costs.
    affinity : scipy.sparse matrix
        (num_items, num_items): edges between items.
    capacities : numpy.ndarray
        float (num_bins, num_resources): what each bin can take.

    Returns
    -------
    numpy.ndarray
        int64 (num_items,): the bin of each item.
    """
    num_items = weights.shape[0]
    num_bins = capacities.shape[0]
    affinity = affinity.tocsr()
    load = np.zeros_like(capacities, dtype=np.float64)
    to_bin = np.zeros((num_items, num_bins))
    out = np.full(num_items, -1, dtype=np.int64)
    safe = np.maximum(capacities, 1e-12)
    order = np.lexsort((np.arange(num_items), -weights[:, 0]))
    for item in order:
        now = (load / safe).max(axis=1)
        after = ((load + weights[item]) / safe).max(axis=1)
        fits = after <= 1.0
        if fits.any():
            # LDG: edges to the bin, discounted by how full it is; ties
            # (no edges anywhere) go to the emptiest bin.
            score = to_bin[item] * (1.0 - np.minimum(now, 1.0))
            key = np.where(fits, score, -np.inf)
            best_score = key.max()
            ties = np.flatnonzero(key >= best_score - 1e-12)
            best = int(ties[np.argmin(now[ties])])
        else:
            best = int(np.argmin(after))
        out[item] = best
        load[best] += weights[item]
        row = affinity.getrow(item)
        to_bin[row.indices, best] += row.data
    return out


def _cluster_affinity(graph, clusters: torch.Tensor, num_clusters: int):
    """Edges between clusters as a symmetric sparse matrix."""
    # scipy.sparse (0.15 s to import) for this matrix alone.
    import scipy.sparse as sp

    src, dst = graph.edges()
    cs = clusters[src].numpy()
    cd = clusters[dst].numpy()
    between = cs != cd
    matrix = sp.coo_matrix(
        (np.ones(int(between.sum())), (cs[between], cd[between])),
        shape=(num_clusters, num_clusters),
    ).tocsr()
    return matrix + matrix.T


def replicas_from(counts: torch.Tensor, owned: torch.Tensor,
                  budget: int) -> torch.Tensor:
    """The ``budget`` most-read vertices a part does not own.

    Parameters
    ----------
    counts : torch.Tensor
        int64 (num_nodes,): profiled reads by the part's trainers.
    owned : torch.Tensor
        bool (num_nodes,): the part's own vertices.
    budget : int
        Most vertices to replicate.

    Returns
    -------
    torch.Tensor
        Sorted int64 ids (only vertices read at least once).
    """
    wanted = counts.clone()
    wanted[owned] = 0
    reached = int((wanted > 0).sum())
    take = min(max(0, budget), reached)
    if take == 0:
        return torch.empty(0, dtype=torch.int64)
    top = torch.topk(wanted, take, sorted=False).indices
    return torch.sort(top).values


def assign(graph, num_parts: int, method: str, *, train_ids: torch.Tensor,
           profile=None, clusters: torch.Tensor | None = None,
           replication: float = 0.5, budgets=None, row_bytes: int = 0,
           seed: int = 0) -> Assignment:
    """Partition ``graph`` into ``num_parts`` parts with ``method``.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The (symmetric) graph.
    num_parts : int
        Parts (>= 1), one per machine.
    method : str
        One of `METHODS`.
    train_ids : torch.Tensor
        Training vertices (balanced across parts).
    profile : callable, optional
        ``profile(seeds) -> counts``: reads per vertex when training on
        ``seeds`` (e.g. `hmgraph.samplers.presample` counts). Needed by
        ``self-dependence`` and ``hierarchy``.
    clusters : torch.Tensor, optional
        int64 (num_nodes,): METIS clusters, needed by ``self-dependence``
        and ``hierarchy``; more clusters than parts.
    replication : float
        Replicated vertices per part, as a fraction of the vertices it
        owns (``self-dependence`` and ``hierarchy``); 0.5 gives a
        replication factor of at most 1.5.
    budgets : sequence of int, optional
        Fast-tier bytes (device + host) of each part's machine
        (``hierarchy``); default equal shares of the feature bytes.
    row_bytes : int
        Bytes per feature row (``hierarchy``).
    seed : int
        Seed of the random method.

    Returns
    -------
    Assignment
    """
    _check_method(method)
    num_nodes = graph.num_nodes()
    if not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive int, got {num_parts!r}")
    if num_parts > num_nodes:
        raise ValueError(
            f"num_parts={num_parts} is more than the graph's {num_nodes} nodes"
        )
    if train_ids.numel() == 0:
        raise ValueError("cannot partition: the training split is empty")
    if replication < 0:
        raise ValueError(f"replication must be >= 0, got {replication}")
    is_train = torch.zeros(num_nodes, dtype=torch.bool)
    is_train[train_ids] = True
    if num_parts == 1:
        return Assignment(method, torch.zeros(num_nodes, dtype=torch.int64),
                          _no_replicas(1), {"num_parts": 1})
    request = _Request(graph, num_parts, method, train_ids, is_train,
                       profile, clusters, replication, budgets, row_bytes,
                       seed)
    return _ASSIGNERS[method](request)


@dataclass
class _Request:
    """What `assign` was asked, checked, for the method's function."""

    graph: object
    num_parts: int
    method: str
    train_ids: torch.Tensor
    is_train: torch.Tensor  # bool per vertex
    profile: object
    clusters: torch.Tensor | None
    replication: float
    budgets: object
    row_bytes: int
    seed: int

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes()

    def simple_graph(self):
        """The graph without self loops or parallel edges (DGL's)."""
        # Lazy, as every DGL import here: DGL takes 4 s to import, and
        # reading METHODS needs none.
        import dgl

        return dgl.to_simple(dgl.remove_self_loop(
            dgl.graph(self.graph.edges(), num_nodes=self.num_nodes)))


def _no_replicas(num_parts: int) -> list[torch.Tensor]:
    """An empty replica list per part (DGL's methods replicate none)."""
    return [torch.empty(0, dtype=torch.int64) for _ in range(num_parts)]


def _assign_random(request: _Request) -> Assignment:
    """DGL's random baseline: every vertex to a uniform part, seeded."""
    import dgl  # lazy: see _Request.simple_graph

    dgl.seed(request.seed)
    parts = dgl.random.choice(request.num_parts, request.num_nodes).long()
    return Assignment(request.method, parts,
                      _no_replicas(request.num_parts),
                      {"seed": request.seed})


def _assign_metis(request: _Request) -> Assignment:
    """DGL's METIS baseline: training vertices and edges balanced."""
    import dgl  # lazy: see _Request.simple_graph

    parts = dgl.metis_partition_assignment(
        request.simple_graph(), request.num_parts,
        balance_ntypes=request.is_train.long(), balance_edges=True,
    ).long()
    return Assignment(request.method, parts,
                      _no_replicas(request.num_parts),
                      {"balance": "train vertices, edges"})


#: How far a part may run over its share of what LDG balances.
SLACK = 1.05


@dataclass
class _Clusters:
    """What LDG weighs per METIS cluster, common to the project's methods.

    ``train`` and ``nodes`` are float64 per cluster; ``affinity`` is the
    edges between clusters (`_cluster_affinity`).
    """

    ids: torch.Tensor  # int64 cluster per vertex
    count: int
    train: np.ndarray
    nodes: np.ndarray
    affinity: object


def _clusters_of(request: _Request) -> _Clusters:
    """The request's clusters, checked, with what LDG weighs of them."""
    if request.clusters is None or request.profile is None:
        raise ValueError(
            f"method {request.method!r} needs clusters and a profile")
    clusters = request.clusters.long()
    count = int(clusters.max()) + 1
    if count < request.num_parts:
        raise ValueError(
            f"{count} clusters cannot make {request.num_parts} parts; "
            "use more clusters than parts"
        )
    train = torch.bincount(
        clusters[request.is_train], minlength=count).double().numpy()
    nodes = torch.bincount(clusters, minlength=count).double().numpy()
    affinity = _cluster_affinity(request.simple_graph(), clusters, count)
    return _Clusters(clusters, count, train, nodes, affinity)


def _assign_self_dependence(request: _Request) -> Assignment:
    """2PGraph: LDG over clusters balancing training vertices and
    vertices, then replicas of each part's dependencies."""
    clusters = _clusters_of(request)
    weights = np.stack([clusters.train, clusters.nodes], 1)
    caps = np.tile(weights.sum(0) / request.num_parts * SLACK,
                   (request.num_parts, 1))
    return _place_clusters(request, clusters, weights, caps, {})


def _machine_budgets(request: _Request) -> list[int]:
    """Fast-tier bytes per part's machine, checked; equal shares of the
    feature bytes when none were given."""
    num_parts, row_bytes = request.num_parts, request.row_bytes
    budgets = request.budgets
    if budgets is None:
        budgets = [row_bytes * request.num_nodes // num_parts] * num_parts
    budgets = [int(b) for b in budgets]
    if len(budgets) != num_parts:
        raise ValueError(
            f"{len(budgets)} machine budgets for {num_parts} parts; "
            "give one per part"
        )
    if min(budgets) < 0 or row_bytes <= 0:
        raise ValueError(
            f"budgets must be >= 0 and row_bytes > 0, got {budgets} "
            f"and {row_bytes}"
        )
    return budgets


def _assign_hierarchy(request: _Request) -> Assignment:
    """HMGraph: LDG over clusters balancing training vertices and hot
    feature bytes against each machine's fast tiers, then replicas."""
    clusters = _clusters_of(request)
    num_nodes, row_bytes = request.num_nodes, request.row_bytes
    counts = request.profile(request.train_ids)
    budgets = _machine_budgets(request)
    hot_rows = min(num_nodes, sum(budgets) // row_bytes)
    hot = torch.zeros(num_nodes, dtype=torch.bool)
    if hot_rows:
        hot[torch.topk(counts, hot_rows, sorted=False).indices] = True
    hot_per_cluster = torch.bincount(
        clusters.ids[hot], minlength=clusters.count).double().numpy()
    weights = np.stack([clusters.train, hot_per_cluster * row_bytes], 1)
    share = np.asarray(budgets, dtype=np.float64) / max(1, sum(budgets))
    # Hot rows follow training vertices, so the two balances pull
    # against each other on machines of unequal budgets: training
    # vertices may run 20 % over an even share, hot bytes 5 %.
    caps = np.stack([
        np.full(request.num_parts,
                clusters.train.sum() / request.num_parts * 1.2),
        share * weights[:, 1].sum() * SLACK,
    ], 1)
    return _place_clusters(request, clusters, weights, caps,
                           {"budgets": budgets, "hot_rows": hot_rows})


def _place_clusters(request: _Request, clusters: _Clusters,
                    weights: np.ndarray, caps: np.ndarray,
                    info: dict) -> Assignment:
    """Clusters to parts by `ldg_assign`, then each part's replicas: the
    most-read vertices its training vertices reach, up to
    ``replication`` times the vertices it owns."""
    method, num_parts = request.method, request.num_parts
    info = {"clusters": clusters.count, "replication": request.replication,
            "assignment": "LDG over METIS clusters", **info}
    cluster_part = ldg_assign(weights, clusters.affinity, caps)
    parts = torch.from_numpy(cluster_part)[clusters.ids]
    replicas = []
    for part in range(num_parts):
        owned = parts == part
        seeds = request.train_ids[owned[request.train_ids]]
        budget = math.floor(request.replication * int(owned.sum()))
        if seeds.numel() == 0 or budget == 0:
            replicas.append(torch.empty(0, dtype=torch.int64))
            continue
        replicas.append(replicas_from(request.profile(seeds), owned, budget))
    log.info("%s: %d parts, replication factor %.3f", method, num_parts,
             Assignment(method, parts, replicas).replication_factor())
    return Assignment(method, parts, replicas, info)


#: Each method's function, by name: a new method is one function here.
_ASSIGNERS = {
    "random": _assign_random,
    "metis": _assign_metis,
    "self-dependence": _assign_self_dependence,
    "hierarchy": _assign_hierarchy,
}

#: The methods' names, for `assign` and the command line's choices.
METHODS = tuple(_ASSIGNERS)

"""Locality-aware cluster sampling (2PGraph).

Uniform neighbour sampling over the whole graph touches scattered rows and
expands neighbourhoods without bound. `ClusterSampler` draws each
mini-batch's seeds from one cluster or a few neighbouring clusters (METIS
parts, computed once and cached with the dataset) and keeps neighbour
expansion local:

* ``locality = 0`` is DGL's uniform ``NeighborSampler``, unchanged;
* ``0 < locality < 1`` samples every node's neighbours without replacement
  with weight 1 for a neighbour in the node's own cluster and
  ``1 - locality`` for one outside it;
* ``locality = 1`` samples only neighbours inside the cluster, so a batch's
  inputs stay inside its seeds' clusters.

Sampling runs in DGL's native (fused, multi-threaded) samplers, set up
once, vectorised: no Python loop over vertices. ``0 < locality < 1`` uses
DGL's weighted sampler over a per-edge weight. ``locality = 1`` samples
uniformly from the subgraph of intra-cluster edges (same vertex ids; edge
ids mapped back to the graph's): the same distribution as weights 1 and 0,
but DGL's uniform sampler costs O(fanout) per vertex where its weighted
one costs O(degree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import numpy as np
import torch
from dgl.dataloading import NeighborSampler

from hmgraph.cache.format import atomic_path

log = logging.getLogger(__name__)

__all__ = ["METIS_OPTIONS", "ClusterSampler", "cached_clusters",
           "cluster_order", "metis_clusters", "metis_key"]

_WEIGHT_KEY = "_hmgraph_locality"


#: How `metis_clusters` runs METIS; part of the key of its cache file.
METIS_OPTIONS = {"function": "dgl.metis_partition_assignment",
                 "input": "simple graph without self-loops",
                 "mode": "k-way", "objtype": "cut", "balance_edges": False}


def metis_key(graph, num_clusters: int) -> dict:
    """What a cached assignment must match: the graph and the METIS run.

    The graph is named by its node and edge counts and a BLAKE2b hash of
    its CSC structure (``indptr`` and ``indices``; its COO arrays where
    the graph allows no CSC), the run by ``num_clusters`` and
    `METIS_OPTIONS`.
    """
    formats = graph.formats()
    fmt = "csc" if "csc" in formats["created"] + formats["not created"] \
        else "coo"
    digest = hashlib.blake2b(digest_size=16)
    for array in graph.adj_tensors(fmt)[:2]:
        digest.update(array.contiguous().numpy())
    return {"num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(),
            fmt: digest.hexdigest(), "num_clusters": int(num_clusters),
            **METIS_OPTIONS}


def cached_clusters(path: str | os.PathLike, key: dict
                    ) -> torch.Tensor | None:
    """The assignment cached at ``path`` if its key is ``key``, else None.

    The file holds two ``.npy`` records: the cluster ids (so that
    ``np.load(path)`` reads them) and the key as JSON. A file without a
    key (written before keys), unreadable, or of another key is None.
    """
    try:
        with open(path, "rb") as f:
            parts = np.load(f)
            stored = json.loads(str(np.load(f)))
    except (OSError, ValueError, EOFError):
        return None
    if stored != key or parts.shape != (key["num_nodes"],):
        log.info("ignoring %s: it is not for this graph and METIS run", path)
        return None
    return torch.from_numpy(parts).long()


def metis_clusters(graph, num_clusters: int,
                   cache_path: str | os.PathLike | None = None
                   ) -> torch.Tensor:
    """METIS cluster id of every node, cached on disk: hmgraph's one way to
    run METIS.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The (symmetric) graph; METIS sees it as a simple graph without
        self-loops.
    num_clusters : int
        Number of clusters (>= 1).
    cache_path : str or os.PathLike, optional
        File of the cached assignment: read if its key (`metis_key`: the
        graph's counts and structure hash, ``num_clusters`` and
        `METIS_OPTIONS`) is this call's, else computed with
        `dgl.metis_partition_assignment` and written atomically with the
        key (`cached_clusters` reads it).

    Returns
    -------
    torch.Tensor
        int64 (num_nodes,): cluster ids in ``[0, num_clusters)``.
    """
    import dgl

    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
    key = None
    if cache_path is not None:
        key = metis_key(graph, num_clusters)
        parts = cached_clusters(cache_path, key)
        if parts is not None:
            return parts
    start = time.perf_counter()
    if num_clusters == 1:
        parts = torch.zeros(graph.num_nodes(), dtype=torch.int64)
    else:
        simple = dgl.graph(graph.edges(), num_nodes=graph.num_nodes())
        simple = dgl.to_simple(dgl.remove_self_loop(simple))
        parts = dgl.metis_partition_assignment(simple, num_clusters).long()
    log.info("METIS: %d clusters of %d nodes in %.1f s", num_clusters,
             graph.num_nodes(), time.perf_counter() - start)
    if cache_path is not None:
        with atomic_path(cache_path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, parts.numpy())
                np.save(f, np.array(json.dumps(key)))
    return parts


def cluster_order(seeds: torch.Tensor, clusters: torch.Tensor,
                  group_size: int, seed: int,
                  num_clusters: int | None = None) -> torch.Tensor:
    """Seeds grouped by cluster, clusters in a seeded random order.

    Clusters are shuffled and taken ``group_size`` at a time; the seeds of
    a group are shuffled together, so consecutive batches draw their seeds
    from one group of clusters.

    Parameters
    ----------
    seeds : torch.Tensor
        Seed ids (int64).
    clusters : torch.Tensor
        Cluster id per node.
    group_size : int
        Clusters per group (>= 1).
    seed : int
        Seed of the generator (``seed + epoch`` for an epoch).
    num_clusters : int, optional
        Default ``clusters.max() + 1``.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if num_clusters is None:
        num_clusters = int(clusters.max()) + 1 if clusters.numel() else 0
    generator = torch.Generator().manual_seed(seed)
    cluster_rank = torch.randperm(num_clusters, generator=generator)
    within = torch.randperm(seeds.numel(), generator=generator)
    shuffled = seeds[within]
    group = cluster_rank[clusters[shuffled]] // group_size
    return shuffled[torch.argsort(group, stable=True)]


class ClusterSampler(NeighborSampler):
    """Neighbour sampling that keeps mini-batches inside graph clusters.

    A DGL ``BlockSampler``: ``sample(g, seeds)`` returns ``input_nodes,
    output_nodes, blocks`` like `dgl.dataloading.NeighborSampler`, so it
    works with `hmgraph.DataLoader` and with DGL's own loader. Use
    `order_seeds` for the seed order (hmgraph's loader does so itself).

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph it will sample from (an edge weight is stored in its
        ``edata`` when ``0 < locality``).
    fanouts : list of int
        As in DGL, first layer first; -1 takes all neighbours.
    clusters : torch.Tensor
        Cluster id per node (see `metis_clusters`).
    locality : float
        0 (uniform, DGL's sampler) to 1 (only neighbours in the cluster).
    group_size : int
        Clusters whose seeds are mixed into the same batches: 1 draws each
        batch from one cluster; a few mix the labels of a batch (seeds of
        one cluster tend to share a label) while keeping it local.
    """

    def __init__(self, graph, fanouts, clusters: torch.Tensor,
                 locality: float = 1.0, group_size: int = 1, **kwargs):
        if not 0.0 <= locality <= 1.0:
            raise ValueError(f"locality must be in [0, 1], got {locality}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        clusters = torch.as_tensor(clusters).long()
        if clusters.numel() != graph.num_nodes():
            raise ValueError(
                f"clusters has {clusters.numel()} entries for "
                f"{graph.num_nodes()} nodes"
            )
        prob = None
        self._inside = self._inside_eids = None
        if locality == 1.0:
            import dgl

            src, dst = graph.edges()
            self._inside_eids = torch.nonzero(
                clusters[src] == clusters[dst]).flatten()
            self._inside = dgl.graph(
                (src[self._inside_eids], dst[self._inside_eids]),
                num_nodes=graph.num_nodes(),
            ).formats("csc")
            self._num_edges = graph.num_edges()
        elif locality > 0:
            src, dst = graph.edges()
            inside = clusters[src] == clusters[dst]
            weight = torch.full((graph.num_edges(),), 1.0 - locality)
            weight[inside] = 1.0
            # One key per sampler: two samplers on one graph keep their own
            # weights.
            prob = f"{_WEIGHT_KEY}_{id(self)}"
            graph.edata[prob] = weight
        super().__init__(fanouts, prob=prob, **kwargs)
        self.clusters = clusters
        self.locality = locality
        self.group_size = group_size
        self.num_clusters = int(clusters.max()) + 1 if clusters.numel() \
            else 0

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        """DGL's `NeighborSampler.sample_blocks`; see the class notes."""
        if self._inside is None:
            return super().sample_blocks(g, seed_nodes, exclude_eids)
        from dgl import EID

        if g.num_edges() != self._num_edges:
            raise ValueError(
                f"this ClusterSampler was built for a graph of "
                f"{self._num_edges} edges, got one of {g.num_edges()}"
            )
        if exclude_eids is not None:
            # Graph edge ids -> ids in the intra-cluster subgraph.
            exclude_eids = torch.as_tensor(exclude_eids)
            where = torch.searchsorted(self._inside_eids, exclude_eids)
            where = where.clamp(max=max(0, self._inside_eids.numel() - 1))
            exclude_eids = where[self._inside_eids[where] == exclude_eids]
        input_nodes, output_nodes, blocks = super().sample_blocks(
            self._inside, seed_nodes, exclude_eids)
        for block in blocks:
            if EID in block.edata:
                block.edata[EID] = self._inside_eids[block.edata[EID]]
        return input_nodes, output_nodes, blocks

    def order_seeds(self, seeds: torch.Tensor, seed: int) -> torch.Tensor:
        """Seeds grouped by cluster, clusters in a seeded random order.

        See `cluster_order`, with this sampler's clusters and group size.

        Parameters
        ----------
        seeds : torch.Tensor
            Seed ids (int64).
        seed : int
            Seed of the generator (``seed + epoch`` for an epoch).
        """
        return cluster_order(seeds, self.clusters, self.group_size, seed,
                             self.num_clusters)

    def __repr__(self) -> str:
        return (f"ClusterSampler(fanouts={self.fanouts}, clusters="
                f"{self.num_clusters}, locality={self.locality}, "
                f"group_size={self.group_size})")

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

``0 < locality <= 1`` runs in compiled code (`hmgraph.samplers.locality`:
numba, GIL released, O(fanout) per node and O(edges) per layer, no pass
over the graph), tested bit for bit against its torch reference
(``engine="torch"``); its sets have the distribution of DGL's weighted
sampler, which ``engine="dgl"`` runs (the implementation before: a
per-edge weight for ``0 < locality < 1``, uniform sampling of the
intra-cluster subgraph for ``locality = 1``) and which serves what the
kernels do not (``exclude_eids``, ``replace=True``, ``edge_dir="out"``,
``output_device``, a graph off the CPU).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time

import dgl
import numpy as np
import torch
from dgl import EID, heterograph_index, utils
from dgl.dataloading import NeighborSampler
from dgl.heterograph import DGLBlock

from hmgraph.cache.format import atomic_path
from hmgraph.samplers import locality as kernels

log = logging.getLogger(__name__)

__all__ = ["ENGINES", "METIS_OPTIONS", "ClusterSampler", "cached_clusters",
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


#: `ClusterSampler` engines: the numba kernels, their torch reference and
#: DGL's samplers.
ENGINES = ("compiled", "torch", "dgl")


class ClusterSampler(NeighborSampler):
    """Neighbour sampling that keeps mini-batches inside graph clusters.

    A DGL ``BlockSampler``: ``sample(g, seeds)`` returns ``input_nodes,
    output_nodes, blocks`` like `dgl.dataloading.NeighborSampler`, so it
    works with `hmgraph.DataLoader` and with DGL's own loader. Use
    `order_seeds` for the seed order (hmgraph's loader does so itself).

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph it will sample from.
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
    engine : str
        How ``0 < locality`` samples: ``"compiled"`` (default), ``"torch"``
        (its reference: the same blocks, slower) or ``"dgl"`` (DGL's
        samplers; an edge weight is stored in ``graph.edata`` where
        ``locality < 1``). Random keys come from DGL's generator, so
        ``dgl.seed`` fixes the blocks of every engine; the compiled and
        torch engines' blocks are equal, DGL's have the same distribution.
        The DGL engine serves, whatever ``engine`` says, what the others
        do not: ``exclude_eids``, ``replace=True``, ``edge_dir="out"``,
        ``output_device``, seeds given as a dict and a graph off the CPU.
    **kwargs
        Passed on to `dgl.dataloading.NeighborSampler`.
    """

    def __init__(self, graph, fanouts, clusters: torch.Tensor,
                 locality: float = 1.0, group_size: int = 1,
                 engine: str = "compiled", **kwargs):
        if not 0.0 <= locality <= 1.0:
            raise ValueError(f"locality must be in [0, 1], got {locality}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose one of "
                             f"{', '.join(ENGINES)}")
        if locality > 0 and (kwargs.get("prob") or kwargs.get("mask")):
            raise ValueError("a ClusterSampler with locality > 0 weighs "
                             "edges itself: no prob or mask")
        clusters = torch.as_tensor(clusters).long()
        if clusters.numel() != graph.num_nodes():
            raise ValueError(
                f"clusters has {clusters.numel()} entries for "
                f"{graph.num_nodes()} nodes"
            )
        super().__init__(fanouts, **kwargs)
        self.clusters = clusters
        self.locality = locality
        self.group_size = group_size
        self.engine = engine
        self.num_clusters = int(clusters.max()) + 1 if clusters.numel() \
            else 0
        self._num_nodes, self._num_edges = graph.num_nodes(), \
            graph.num_edges()
        self._inside = self._inside_eids = self._layout = None
        self._local = threading.local()
        if locality > 0 and engine == "dgl":
            self._dgl_setup(graph)
        elif locality > 0:
            self._layout = _layout(graph, clusters)

    # -- DGL's samplers -----------------------------------------------------

    def _dgl_setup(self, graph) -> None:
        """The DGL engine's state: the intra-cluster subgraph (locality 1)
        or a per-edge weight in ``graph.edata`` (one key per sampler: two
        samplers on one graph keep their own weights)."""
        src, dst = graph.edges()
        inside = self.clusters[src] == self.clusters[dst]
        if self.locality == 1.0:
            self._inside_eids = torch.nonzero(inside).flatten()
            self._inside = dgl.graph(
                (src[self._inside_eids], dst[self._inside_eids]),
                num_nodes=graph.num_nodes(),
            ).formats("csc")
        else:
            weight = torch.full((graph.num_edges(),), 1.0 - self.locality)
            weight[inside] = 1.0
            self.prob = f"{_WEIGHT_KEY}_{id(self)}"
            graph.edata[self.prob] = weight

    def _dgl_blocks(self, g, seed_nodes, exclude_eids):
        """`NeighborSampler.sample_blocks` on the DGL engine's state, set
        up on first use."""
        if self.locality < 1.0:
            if self.prob is None or self.prob not in g.edata:
                self._dgl_setup(g)
            return super().sample_blocks(g, seed_nodes, exclude_eids)
        if self._inside is None:
            self._dgl_setup(g)
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

    # -- Sampling -----------------------------------------------------------

    def _served(self, g, seed_nodes, exclude_eids) -> bool:
        """Whether the compiled / torch engine serves this call."""
        return (self._layout is not None and exclude_eids is None
                and not self.replace and self.edge_dir == "in"
                and self.output_device is None and torch.is_tensor(
                    seed_nodes) and seed_nodes.device.type == "cpu"
                and g.device.type == "cpu")

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        """DGL's `NeighborSampler.sample_blocks`; see the class notes."""
        if self.locality == 0.0:
            return super().sample_blocks(g, seed_nodes, exclude_eids)
        if g.num_nodes() != self._num_nodes or \
                g.num_edges() != self._num_edges:
            raise ValueError(
                f"this ClusterSampler was built for a graph of "
                f"{self._num_nodes} nodes and {self._num_edges} edges, got "
                f"one of {g.num_nodes()} and {g.num_edges()}"
            )
        if not self._served(g, seed_nodes, exclude_eids):
            return self._dgl_blocks(g, seed_nodes, exclude_eids)

        seeds = seed_nodes.long().contiguous()
        if seeds.numel() and (int(seeds.min()) < 0
                              or int(seeds.max()) >= self._num_nodes):
            raise ValueError(f"seed ids must be in [0, {self._num_nodes})")
        indptr, inside, rows = self._layout
        weight = 1.0 - self.locality
        keys = dgl.random.choice((1 << 63) - 1, len(self.fanouts)).tolist()
        blocks = []
        for fanout, key in zip(reversed(self.fanouts), keys, strict=True):
            if self.engine == "torch":
                nodes, offsets, local, eids = kernels.sample_layer_torch(
                    seeds, torch.from_numpy(indptr), torch.from_numpy(inside),
                    torch.from_numpy(rows), int(fanout), weight, key)
            else:
                table, tick = self._table()
                nodes, offsets, local, eids = (torch.from_numpy(a) for a in
                                               kernels.sample_layer(
                    seeds.numpy(), indptr, inside, rows, int(fanout), weight,
                    np.uint64(key), table, tick))
            blocks.insert(0, _block(g, nodes, seeds, offsets, local, eids))
            seeds = nodes
        return seeds.to(g.idtype), seed_nodes, blocks

    def _table(self) -> tuple:
        """This thread's stamped table and a stamp it has not used."""
        state = self._local
        if not hasattr(state, "table"):
            state.table = np.zeros((self._num_nodes, 2), dtype=np.int64)
            state.tick = 0
        state.tick += 1
        return state.table, state.tick

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_local"]  # tables are per thread, and per process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _local=threading.local())

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
                f"group_size={self.group_size}, engine={self.engine!r})")


def _csc(graph) -> tuple:
    """``(indptr, indices, edge ids)`` of the graph's in-edges, as int64
    NumPy arrays: DGL's CSC where the graph allows one, else from COO."""
    formats = graph.formats()
    if "csc" in formats["created"] + formats["not created"]:
        return tuple(a.long().numpy() for a in graph.adj_tensors("csc"))
    src, dst = graph.edges()
    eids = torch.argsort(dst, stable=True)
    indptr = torch.zeros(graph.num_nodes() + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=graph.num_nodes()), 0,
                 out=indptr[1:])
    return indptr.numpy(), src[eids].long().numpy(), eids.numpy()


def _layout(graph, clusters: torch.Tensor) -> tuple:
    """The kernels' view of ``graph``: CSC ``indptr`` (int64), the inside
    neighbours per node and every row's ``(source, edge id)`` pairs,
    inside ones first (`partition_rows`; int32 where ids fit)."""
    indptr, indices, eids = _csc(graph)
    fits = max(graph.num_nodes(), graph.num_edges()) < 2**31
    rows = np.empty((indices.shape[0], 2),
                    dtype=np.int32 if fits else np.int64)
    inside = kernels.partition_rows(indptr, indices, eids, clusters.numpy(),
                                    rows)
    return indptr, inside, rows


def _block(g, nodes, seeds, indptr, local, eids):
    """A block of ``g`` from a layer's CSC: sources ``nodes``, destinations
    ``seeds``, the graph's node and edge data (``NID``, ``EID`` and the
    rest, as DGL's fused sampler attaches them)."""
    idtype = g.idtype
    index = heterograph_index.create_unitgraph_from_csr(
        2, nodes.numel(), seeds.numel(), indptr.to(idtype), local.to(idtype),
        torch.empty(0, dtype=idtype), ["coo", "csr", "csc"], transpose=True)
    block = DGLBlock(index, (g.ntypes, g.ntypes), g.etypes)
    utils.set_new_frames(
        block, node_frames=utils.extract_node_subframes_for_block(
            g, [nodes.to(idtype)], [seeds.to(idtype)]),
        edge_frames=utils.extract_edge_subframes(g, [eids.to(idtype)]))
    return block

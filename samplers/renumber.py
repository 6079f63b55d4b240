"""Vertex renumbering: clusters as id ranges, hot rows first.

`cluster_permutation` orders nodes by cluster (stable, so ids keep their
relative order inside a cluster); `hot_first_permutation` orders them by
profiled hotness, hottest first (inside each cluster when given clusters);
`renumber_graph` and `renumber_feature_file` rewrite the graph and the
on-disk feature file in that order. On disk the rows of a cluster then
share pages, so a batch drawn from a few clusters reads few pages; and the
rows a static cache holds fill whole pages, so its misses fall on the
cold pages only.

Convention: ``perm[new] = old`` and ``inverse[old] = new``.
"""

from __future__ import annotations

import os
from pathlib import Path

import dgl
import torch

from hmgraph.cache.format import FeatureFileWriter, read_manifest
from hmgraph.cache.storage import StorageFeature

__all__ = ["cluster_permutation", "hot_first_permutation",
           "inverse_permutation", "renumber_feature_file", "renumber_graph"]

_CHUNK_BYTES = 256 << 20


def cluster_permutation(clusters: torch.Tensor):
    """Order nodes by cluster.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``perm`` (new id -> old id) and ``inverse`` (old -> new), int64.
    """
    perm = torch.argsort(torch.as_tensor(clusters).long(), stable=True)
    return perm, inverse_permutation(perm)


def hot_first_permutation(counts: torch.Tensor,
                          clusters: torch.Tensor | None = None):
    """Order nodes hottest first (inside each cluster, if given).

    Parameters
    ----------
    counts : torch.Tensor
        Hotness per node (e.g. `Profile.counts`, batches that read the
        row; any real score works), shape (num_nodes,).
    clusters : torch.Tensor, optional
        Cluster id per node. Clusters then stay contiguous id ranges in
        ascending cluster id, as in `cluster_permutation`, and nodes are
        hottest first inside each one.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``perm`` (new id -> old id) and ``inverse`` (old -> new), int64,
        CPU. The sort is stable: equally hot nodes keep their id order.

    Examples
    --------
    >>> perm, inverse = hot_first_permutation(torch.tensor([1, 5, 0, 5]))
    >>> perm.tolist(), inverse.tolist()
    ([1, 3, 0, 2], [2, 0, 3, 1])
    >>> hot_first_permutation(torch.tensor([1, 5, 0, 5]),
    ...                       torch.tensor([1, 1, 0, 0]))[0].tolist()
    [3, 2, 1, 0]
    """
    counts = torch.as_tensor(counts).cpu()
    if counts.dim() != 1:
        raise ValueError(f"counts must be one value per node, got shape "
                         f"{tuple(counts.shape)}")
    # Stable sorts, last key first: by hotness (descending), then by
    # cluster, which keeps the hotness order inside each cluster.
    perm = torch.argsort(counts, descending=True, stable=True)
    if clusters is not None:
        clusters = torch.as_tensor(clusters).cpu().long()
        if clusters.shape != counts.shape:
            raise ValueError(
                f"clusters has {clusters.numel()} entries for "
                f"{counts.numel()} counts"
            )
        perm = perm[torch.argsort(clusters[perm], stable=True)]
    return perm, inverse_permutation(perm)


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inverse`` with ``inverse[perm[i]] = i`` (int64, on perm's device).
    """
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return inverse


def renumber_graph(graph, perm: torch.Tensor, inverse: torch.Tensor):
    """The graph with node ``old`` renamed ``inverse[old]``.

    Node data is permuted along (row ``new`` holds old node ``perm[new]``);
    edge order and edge data are kept.
    """
    src, dst = graph.edges()
    renamed = dgl.graph((inverse[src], inverse[dst]),
                        num_nodes=graph.num_nodes())
    for key, value in graph.ndata.items():
        renamed.ndata[key] = value[perm]
    for key, value in graph.edata.items():
        renamed.edata[key] = value
    return renamed


def renumber_feature_file(source: str | os.PathLike,
                          target: str | os.PathLike,
                          perm: torch.Tensor) -> Path:
    """Write the rows of ``source`` in ``perm`` order to ``target``.

    Row ``new`` of the target is row ``perm[new]`` of the source, gathered
    and written 256 MB at a time (never the whole matrix). Written
    atomically (temporary name, fsync, rename): an existing target is
    replaced whole once the new one is complete, never rewritten in place.

    Returns
    -------
    pathlib.Path
        ``target``.
    """
    target = Path(target)
    manifest = read_manifest(source)
    if perm.numel() != manifest.num_rows:
        raise ValueError(
            f"permutation of {perm.numel()} ids for a feature file of "
            f"{manifest.num_rows} rows"
        )
    # Chunk by chunk of new ids: the storage tier gathers each chunk's old
    # rows (sorted, coalesced, O_DIRECT); memory is one chunk.
    chunk = max(1, _CHUNK_BYTES // max(manifest.row_bytes, 1))
    with StorageFeature(source) as rows, \
            FeatureFileWriter(target, manifest.shape, manifest.dtype) as out:
        for start in range(0, perm.numel(), chunk):
            out.write(rows.read(perm[start:start + chunk]).numpy())
    return target

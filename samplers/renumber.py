"""Vertex renumbering: every cluster becomes a contiguous id range.

`cluster_permutation` orders nodes by cluster (stable, so ids keep their
relative order inside a cluster); `renumber_graph` and
`renumber_feature_file` rewrite the graph and the on-disk feature file in
that order. On disk the rows of a cluster then share pages, so a batch
drawn from a few clusters reads few pages.

Convention: ``perm[new] = old`` and ``inverse[old] = new``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from hmgraph.cache.format import FeatureFileWriter, read_manifest
from hmgraph.cache.storage import StorageFeature

__all__ = ["cluster_permutation", "renumber_feature_file", "renumber_graph"]

_CHUNK_BYTES = 256 << 20


def cluster_permutation(clusters: torch.Tensor):
    """Order nodes by cluster.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``perm`` (new id -> old id) and ``inverse`` (old -> new), int64.
    """
    perm = torch.argsort(torch.as_tensor(clusters).long(), stable=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    return perm, inverse


def renumber_graph(graph, perm: torch.Tensor, inverse: torch.Tensor):
    """The graph with node ``old`` renamed ``inverse[old]``.

    Node data is permuted along (row ``new`` holds old node ``perm[new]``);
    edge order and edge data are kept.
    """
    import dgl

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
    atomically (temporary name, fsync, rename); an existing target with the
    source's shape and dtype is kept.

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
    if target.is_file():
        done = read_manifest(target)
        if done.shape == manifest.shape and done.dtype == manifest.dtype:
            return target
    # Chunk by chunk of new ids: the storage tier gathers each chunk's old
    # rows (sorted, coalesced, O_DIRECT); memory is one chunk.
    chunk = max(1, _CHUNK_BYTES // max(manifest.row_bytes, 1))
    with StorageFeature(source) as rows, \
            FeatureFileWriter(target, manifest.shape, manifest.dtype) as out:
        for start in range(0, perm.numel(), chunk):
            out.write(rows.read(perm[start:start + chunk]).numpy())
    return target

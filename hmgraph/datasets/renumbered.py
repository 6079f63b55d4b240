"""A node dataset renumbered: clusters as id ranges, or any permutation."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.format import atomic_path
from hmgraph.datasets.base import FEATURE_FILE, NodeDataset
from hmgraph.samplers.renumber import (
    cluster_permutation,
    inverse_permutation,
    renumber_feature_file,
    renumber_graph,
)

log = logging.getLogger(__name__)

__all__ = ["permuted", "renumbered", "to_original"]


def renumbered(dataset: NodeDataset, clusters: torch.Tensor,
               tag: str) -> NodeDataset:
    """``dataset`` with node ``old`` renamed so clusters are contiguous.

    `permuted` with `cluster_permutation` of ``clusters``.

    Parameters
    ----------
    dataset : NodeDataset
        The dataset (possibly renumbered already).
    clusters : torch.Tensor
        Cluster id per node of ``dataset``, in its ids.
    tag : str
        Names the cache folder (e.g. ``"metis-188"``).
    """
    perm, _ = cluster_permutation(clusters)
    return permuted(dataset, perm, tag)


def permuted(dataset: NodeDataset, perm: torch.Tensor,
             tag: str) -> NodeDataset:
    """``dataset`` with node ``perm[new]`` renamed ``new``.

    The graph, labels, split and feature file are in the new ids; the
    rewritten feature file is cached beside the one it is read from, under
    ``renumbered-<tag>/``, and reused while its permutation matches. The
    returned dataset's ``info`` holds ``perm`` (new -> original id) and
    ``inverse`` (original -> new), ``folder`` and ``reused`` (True when
    the rewritten file was already there); `to_original` maps per-node
    outputs back, so predictions and evaluation stay in the user's ids.

    Renumbering composes: when ``dataset`` is renumbered already (its
    ``info`` has ``perm``), ``perm`` is relative to its ids, its feature
    file is rewritten with ``perm``, and ``info["perm"]`` of the result
    maps to the ids of the dataset it was first renumbered from.

    Parameters
    ----------
    dataset : NodeDataset
        The dataset to renumber.
    perm : torch.Tensor
        int64 (num_nodes,): a permutation of ``dataset``'s ids, ``perm[new]
        = old``.
    tag : str
        Names the cache folder (e.g. ``"hot-first"``).

    Returns
    -------
    NodeDataset
        Renumbered; its ``feature_path`` is the rewritten file.
    """
    perm = torch.as_tensor(perm).cpu().long()
    n = dataset.num_nodes
    if perm.shape != (n,) or not torch.equal(perm.sort().values,
                                             torch.arange(n)):
        raise ValueError(
            f"perm must be a permutation of the {n} node ids, got a tensor "
            f"of shape {tuple(perm.shape)}"
        )
    inverse = inverse_permutation(perm)
    # (1) The permutation to the original ids (composed when renumbered).
    base = dataset.info.get("perm")
    total = perm if base is None else base[perm]
    # (2) The feature file, rewritten from the dataset's own file unless
    # the cached one is in this order already (perm.npy written last).
    folder = Path(dataset.feature_path).parent / f"renumbered-{tag}"
    perm_path = folder / "perm.npy"
    target = folder / FEATURE_FILE
    if perm_path.is_file() and not np.array_equal(np.load(perm_path),
                                                  total.numpy()):
        log.info("%s holds another permutation; rewriting it", folder)
        perm_path.unlink()
        target.unlink(missing_ok=True)
    reused = perm_path.is_file()
    if not reused:
        folder.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        renumber_feature_file(dataset.feature_path, target, perm)
        with atomic_path(perm_path) as tmp:  # written last: the marker
            with open(tmp, "wb") as f:
                np.save(f, total.numpy())
    # (3) Graph, labels and split in the new ids.
    graph = renumber_graph(dataset.graph, perm, inverse)
    split = {k: inverse[v] for k, v in dataset.split.items()}
    info = dict(dataset.info, perm=total, inverse=inverse_permutation(total),
                folder=folder, reused=reused)
    return dataclasses.replace(
        dataset, graph=graph, labels=dataset.labels[perm], split=split,
        feature_path=target, info=info,
    )


def to_original(dataset: NodeDataset, values: torch.Tensor) -> torch.Tensor:
    """Per-node ``values`` in the dataset's ids, reordered to original ids.

    Identity for a dataset that was not renumbered.
    """
    inverse = dataset.info.get("inverse")
    return values if inverse is None else values[inverse]

"""A node dataset renumbered so that every cluster is an id range."""

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
    renumber_feature_file,
    renumber_graph,
)

log = logging.getLogger(__name__)

__all__ = ["renumbered", "to_original"]


def renumbered(dataset: NodeDataset, clusters: torch.Tensor,
               tag: str) -> NodeDataset:
    """``dataset`` with node ``old`` renamed so clusters are contiguous.

    The graph, labels, split and feature file are in the new ids; the
    rewritten feature file is cached beside the original under
    ``renumbered-<tag>/`` and reused while its permutation matches. The
    returned dataset's ``info`` holds ``perm`` (new -> old) and ``inverse``
    (old -> new); `to_original` maps per-node outputs back, so predictions
    and evaluation stay in the user's ids.

    Parameters
    ----------
    dataset : NodeDataset
        In original ids.
    clusters : torch.Tensor
        Cluster id per original node.
    tag : str
        Names the cache folder (e.g. ``"metis-188"``).
    """
    perm, inverse = cluster_permutation(clusters)
    folder = Path(dataset.feature_path).parent / f"renumbered-{tag}"
    perm_path = folder / "perm.npy"
    target = folder / FEATURE_FILE
    if perm_path.is_file() and not np.array_equal(np.load(perm_path),
                                                  perm.numpy()):
        log.info("%s holds another permutation; rewriting it", folder)
        perm_path.unlink()
        target.unlink(missing_ok=True)
    if not perm_path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        renumber_feature_file(dataset.feature_path, target, perm)
        with atomic_path(perm_path) as tmp:  # written last: the marker
            with open(tmp, "wb") as f:
                np.save(f, perm.numpy())
    graph = renumber_graph(dataset.graph, perm, inverse)
    split = {k: inverse[v] for k, v in dataset.split.items()}
    info = dict(dataset.info, perm=perm, inverse=inverse, folder=folder)
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

"""What `hmgraph.DataLoader` is given: indices, device, feature rows.

Checked and normalised as DGL 2.1's loader takes them (its default
device, any index container), with one-line errors for what cannot be
used: ids out of range for the sampler's meaning of them, features whose
row count does not match the graph. On CUDA, DGL's ``gpu_cache`` as the
device tier's budget, and UVA's pinned rows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.feature import Feature, TensorFeature, torch_dtype
from hmgraph.cache.format import FeatureFileError, with_remedy
from hmgraph.cache.storage import StorageFeature

__all__ = ["ArrayFeature", "as_feature", "as_indices", "feature_sources",
           "gpu_cache_budget", "loader_device", "pin_sources"]


def loader_device(device, graph, use_uva: bool) -> torch.device:
    """DGL's default device: the graph's, or CUDA's current with UVA."""
    if use_uva:
        if not torch.cuda.is_available():
            raise ValueError("use_uva=True needs CUDA (the device reads "
                             "pinned host memory); this machine has none")
        if graph.device.type != "cpu":
            raise ValueError("Graph must be on CPU if UVA sampling is "
                             "enabled.")
    if device is None:
        device = torch.cuda.current_device() if use_uva else graph.device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def as_indices(indices, graph, graph_sampler):
    """Indices as tensors of the graph's id type, checked where the
    sampler's meaning of them is known (node or edge ids)."""
    if isinstance(indices, Mapping):
        return {key: _index_tensor(value, graph, graph_sampler, key)
                for key, value in indices.items()}
    return _index_tensor(indices, graph, graph_sampler, None)


def _index_tensor(values, graph, graph_sampler, key):
    values = torch.as_tensor(np.asarray(values) if isinstance(
        values, (list, tuple)) else values)
    if values.numel() == 0:
        values = values.to(graph.idtype)
    if values.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape "
                         f"{tuple(values.shape)}")
    if values.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"indices must be integer ids, got {values.dtype}")
    values = values.to(graph.idtype)
    limit = _index_limit(graph, graph_sampler, key)
    if limit is not None and values.numel():
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= limit[0]:
            bad = low if low < 0 else high
            raise ValueError(
                f"{limit[1]} id {bad} out of range: the graph has "
                f"{limit[0]} {limit[1]}s")
    return values


def _index_limit(graph, graph_sampler, key):
    """``(count, "node"|"edge")`` the sampler's indices index, if known."""
    # Lazy: DGL takes 4 s to import; hmgraph.loader imports this module.
    from dgl.dataloading import BlockSampler, ShaDowKHopSampler
    from dgl.dataloading.base import EdgePredictionSampler

    if isinstance(graph_sampler, EdgePredictionSampler):
        return graph.num_edges(key), "edge"
    if isinstance(graph_sampler, (BlockSampler, ShaDowKHopSampler)) or \
            hasattr(graph_sampler, "order_seeds"):
        return graph.num_nodes(key), "node"
    return None


def feature_sources(graph, features, name: str) -> dict[str, Feature]:
    """The cached feature's source per node type."""
    if features is None:
        found = {}
        for ntype in graph.ntypes:
            data = graph.nodes[ntype].data
            if name in data:
                found[ntype] = data[name]
        features = found
    elif not isinstance(features, Mapping):
        if len(graph.ntypes) != 1:
            raise ValueError(
                f"features for a graph with node types {graph.ntypes}: "
                f"give a dict by node type")
        features = {graph.ntypes[0]: features}
    sources = {}
    for ntype, rows in features.items():
        if ntype not in graph.ntypes:
            raise ValueError(f"features for node type {ntype!r}; the "
                             f"graph has {graph.ntypes}")
        source = as_feature(rows)
        if source.num_rows != graph.num_nodes(ntype):
            raise ValueError(
                f"features have {source.num_rows} rows, but the graph has "
                f"{graph.num_nodes(ntype)} nodes"
                + ("" if len(graph.ntypes) == 1 else f" of type {ntype!r}"))
        sources[ntype] = source
    return sources


#: What works for a damaged feature file given by path: hmgraph makes a
#: dataset's own file again once deleted, not a file of the user's.
PATH_REMEDY = ("delete it to rebuild it if it is a dataset's file that "
               "hmgraph made, else write it again "
               "(hmgraph.cache.write_feature_file)")


def as_feature(features) -> Feature:
    """The feature source: in memory, a Feature, or a feature file."""
    if isinstance(features, Feature):
        return features
    if isinstance(features, (str, os.PathLike)):
        try:
            feature = StorageFeature(Path(features))
        except FeatureFileError as err:
            raise with_remedy(err, PATH_REMEDY) from None
        feature.remedy = PATH_REMEDY
        return feature
    if isinstance(features, np.ndarray):
        return ArrayFeature(features)
    return TensorFeature(features)


class ArrayFeature(Feature):
    """Rows of a NumPy array or memmap, gathered on read (CPU)."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.num_rows = rows.shape[0]
        self.row_shape = tuple(rows.shape[1:])
        self.dtype = torch_dtype(rows.dtype)

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.rows[ids.numpy()]))


def gpu_cache_budget(gpu_cache, budget: int, device: torch.device,
                     feature_name: str, sources: dict) -> int:
    """The device tier's budget: ``budget``, or more where DGL's
    ``gpu_cache`` (``{"node": {feature_name: rows}}``) asks for more.

    Raises
    ------
    ValueError
        ``gpu_cache`` off CUDA, or naming another feature.
    """
    if not gpu_cache:
        return budget
    if device.type != "cuda":
        raise ValueError(f"gpu_cache needs a CUDA device; the loader's "
                         f"device is {device}")
    extra = set(gpu_cache) - {"node"}
    names = set(gpu_cache.get("node", {}))
    if extra or names - {feature_name}:
        raise ValueError(
            f"gpu_cache {gpu_cache!r}: hmgraph caches one node feature "
            f"({feature_name!r}); give {{'node': "
            f"{{{feature_name!r}: rows}}}}")
    rows = int(gpu_cache["node"].get(feature_name, 0))
    row_bytes = max((s.row_bytes for s in sources.values()), default=0)
    return max(budget, rows * row_bytes)


def pin_sources(graph, sources: dict) -> None:
    """UVA: the graph and in-memory rows in pinned host memory (the
    sources are replaced in place)."""
    graph.create_formats_()
    graph.pin_memory_()
    for ntype, source in sources.items():
        if isinstance(source, TensorFeature) and \
                source.device.type == "cpu":
            sources[ntype] = TensorFeature(source.rows.pin_memory())

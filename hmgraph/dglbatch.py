"""DGL's batch contract, for `hmgraph.DataLoader`.

What `dgl.dataloading.DataLoader` 2.1 does around a sampler, kept exactly
so a DGL script sees the same batches:

- the seeds are DGL's own tensorized datasets (`seed_dataset`: batches
  cut in order, ``use_ddp`` splitting the seeds across ranks, worker
  processes each taking a contiguous run of batches), and `set_order`
  lets hmgraph choose an epoch's order instead of NumPy's global shuffle;
- a sampled batch is any structure of tensors and graphs; the features a
  sampler asks for are `dgl.frame.LazyFeature` columns, found by
  `find_lazy` and filled in by `assign` once read;
- `to_device` moves the batch as DGL does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["Lazy", "find_lazy", "assign", "graphs", "to_device",
           "seed_dataset", "set_order", "local_seeds"]


@dataclass
class Lazy:
    """One feature column a sampled graph asks for.

    Attributes
    ----------
    graph : int
        Index of the graph in the batch (`graphs` order).
    kind : str
        ``"node"`` or ``"edge"``.
    frame : int
        Index of the graph's node (or edge) frame.
    key : str
        Column name in the sampled graph.
    name : str
        Column name in the parent graph (`LazyFeature.name`).
    type : str or tuple
        Node type, or canonical edge type.
    ids : torch.Tensor
        Parent ids of the rows (int64, CPU).
    """

    graph: int
    kind: str
    frame: int
    key: str
    name: str
    type: object
    ids: torch.Tensor


def graphs(item) -> list:
    """The DGL graphs of a batch, depth first (tuples, lists, dicts).

    A loop over a stack, not a recursive closure: a nested function that
    calls itself is a reference cycle, and the cycle held ``found``, so a
    dropped batch's graphs and features waited for the garbage collector
    (synth-igb, 1.2 GB of rows per batch: a loader-only pass peaked at
    15.1 GB instead of 7.6).
    """
    # Lazy, as every DGL import here: DGL takes 4 s to import, and
    # hmgraph.loader imports this module.
    from dgl import DGLGraph

    found, stack = [], [item]
    while stack:
        x = stack.pop()
        if isinstance(x, DGLGraph):
            found.append(x)
        elif isinstance(x, Mapping):
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return found


def find_lazy(batch) -> list[Lazy]:
    """Every `LazyFeature` column of the batch's graphs, as DGL finds them.

    Raises
    ------
    ValueError
        If a lazy column has no ids and its graph no ``dgl.NID`` /
        ``dgl.EID`` column.
    """
    # Lazy: DGL (see `graphs`).
    from dgl import EID, NID
    from dgl.frame import LazyFeature

    found = []
    for index, graph in enumerate(graphs(batch)):
        for kind, frames, types, id_name in (
            ("node", graph._node_frames, graph.ntypes, NID),
            ("edge", graph._edge_frames, graph.canonical_etypes, EID),
        ):
            for number, frame in enumerate(frames):
                default_ids = frame.get(id_name, None)
                for key in frame.keys():
                    column = frame._columns[key]
                    if not isinstance(column, LazyFeature):
                        continue
                    ids = column.id_ if column.id_ is not None \
                        else default_ids
                    if ids is None:
                        raise ValueError(
                            f"lazy feature {key!r} has no ids and its "
                            f"graph no {id_name} column")
                    found.append(Lazy(index, kind, number, key,
                                      column.name or key, types[number],
                                      ids.long()))
    return found


def assign(batch, lazy: Lazy, value: torch.Tensor) -> None:
    """Put ``value`` where ``lazy`` was, in ``batch``'s graphs."""
    graph = graphs(batch)[lazy.graph]
    frames = graph._node_frames if lazy.kind == "node" else \
        graph._edge_frames
    frames[lazy.frame][lazy.key] = value


def to_device(batch, device: torch.device):
    """``batch`` with its tensors and graphs on ``device`` (as DGL).

    Graphs stay on the CPU where DGL was built without CUDA (its CPU
    wheel); their features are then read from the batch's attributes.
    """
    # Lazy: DGL (see `graphs`).
    from dgl import DGLGraph
    from dgl.utils import recursive_apply

    if device.type == "cpu":
        return batch

    def move(x):
        if isinstance(x, DGLGraph):
            try:
                return x.to(device)
            except Exception:  # noqa: BLE001 - DGL without CUDA
                return x
        return x.to(device, non_blocking=True)

    return recursive_apply(batch, move)


def seed_dataset(indices, batch_size: int, drop_last: bool, use_ddp: bool,
                 ddp_seed: int, shuffle: bool, persistent_workers: bool):
    """DGL's own dataset of seed batches (`TensorizedDataset` or, with
    ``use_ddp``, `DDPTensorizedDataset`).

    Raises
    ------
    RuntimeError
        ``use_ddp`` without an initialized ``torch.distributed``.
    """
    # Lazy: DGL (see `graphs`).
    from dgl.dataloading.dataloader import create_tensorized_dataset

    if use_ddp and not (torch.distributed.is_available()
                        and torch.distributed.is_initialized()):
        raise RuntimeError(
            "use_ddp=True needs torch.distributed initialized "
            "(torch.distributed.init_process_group) before the DataLoader")
    return create_tensorized_dataset(indices, batch_size, drop_last,
                                     use_ddp, ddp_seed, shuffle,
                                     persistent_workers)


def local_seeds(dataset) -> torch.Tensor:
    """This rank's seeds in the dataset's unshuffled order (no padding)."""
    count = getattr(dataset, "local_num_indices", dataset._indices.numel())
    return dataset._id_tensor[:count]


def set_order(dataset, positions: torch.Tensor) -> None:
    """Iterate ``dataset``'s seeds in ``positions`` order this epoch.

    ``positions`` permutes ``range(len(local_seeds(dataset)))``; as in
    DGL's ``DDPTensorizedDataset.shuffle``, a rank's padding repeats its
    first seeds in the new order. Written in place, so persistent worker
    processes see it (the index is in shared memory).
    """
    indices = dataset._indices
    count = positions.numel()
    indices[:count] = positions
    if count < indices.numel():
        indices[count:] = indices[:indices.numel() - count]

"""`hmgraph.DataLoader`: DGL's mini-batch contract over hmgraph's stages.

A mini-batch goes through numbered stages:

1. **sample**: the seeds of the batch are drawn (seeded ``seed + epoch``
   shuffle, as GraphBolt's ``ItemSampler``) and handed to any DGL
   ``BlockSampler``, which returns ``input_nodes, output_nodes, blocks``
   (DGL's generator is seeded ``seed + epoch`` too);
2. **fetch**: the rows of ``input_nodes`` are read from the feature source;
3. **transfer**: rows and labels move to the training device.

Each stage's seconds are counted in `LoaderStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["DataLoader", "LoaderStats", "MiniBatch"]


class MiniBatch(tuple):
    """``(input_nodes, output_nodes, blocks)``, plus the batch's tensors.

    Unpacks exactly like a batch of `dgl.dataloading.DataLoader`. On the CPU
    the input rows are also in ``blocks[0].srcdata["feat"]`` and the labels
    in ``blocks[-1].dstdata["label"]``; on other devices (DGL's wheel has no
    CUDA, so blocks stay on the CPU) read them from the attributes.

    Attributes
    ----------
    x : torch.Tensor
        Rows of ``input_nodes``, on the loader's device.
    y : torch.Tensor or None
        Labels of ``output_nodes``, on the loader's device.
    """

    x: torch.Tensor
    y: torch.Tensor | None

    def __new__(cls, input_nodes, output_nodes, blocks, x, y=None):
        batch = super().__new__(cls, (input_nodes, output_nodes, blocks))
        batch.x = x
        batch.y = y
        return batch

    @property
    def input_nodes(self) -> torch.Tensor:
        """Ids whose rows the first layer reads (CPU)."""
        return self[0]

    @property
    def output_nodes(self) -> torch.Tensor:
        """The seeds of the batch (CPU)."""
        return self[1]

    @property
    def blocks(self) -> list:
        """DGL blocks, one per layer (CPU)."""
        return self[2]


@dataclass
class LoaderStats:
    """Counters of one loader, reset with `reset`.

    Attributes
    ----------
    batches : int
        Mini-batches produced.
    rows_requested : int
        Input rows asked of the feature source.
    seconds : dict of str to float
        Seconds per stage: ``sample``, ``fetch``, ``transfer``.
    """

    batches: int = 0
    rows_requested: int = 0
    seconds: dict = field(default_factory=lambda: {
        "sample": 0.0, "fetch": 0.0, "transfer": 0.0,
    })

    def reset(self) -> None:
        """Zero every counter."""
        self.batches = 0
        self.rows_requested = 0
        self.seconds = {key: 0.0 for key in self.seconds}

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        return {
            "batches": self.batches,
            "rows_requested": self.rows_requested,
            "seconds": dict(self.seconds),
        }


class DataLoader:
    """Mini-batches of seeds, sampled blocks and their input rows.

    Iterates exactly like `dgl.dataloading.DataLoader`::

        for input_nodes, output_nodes, blocks in loader:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph (CPU).
    indices : torch.Tensor
        Seed node ids (int64) to iterate over.
    graph_sampler : dgl.dataloading.BlockSampler
        Any DGL block sampler, e.g. ``NeighborSampler([15, 10, 5])``.
    features : torch.Tensor or numpy.ndarray, optional
        Rows indexed by node id; default ``graph.ndata["feat"]``. A
        ``numpy.memmap`` of a feature file works too.
    labels : torch.Tensor, optional
        Labels indexed by node id; default ``graph.ndata["label"]`` if
        present.
    batch_size : int
        Seeds per batch.
    shuffle : bool
        Shuffle seeds each epoch with a generator seeded ``seed + epoch``.
    drop_last : bool
        Drop the last, smaller batch.
    device : str or torch.device
        Where ``x`` and ``y`` of each batch go.
    seed : int
        Base seed of the shuffle.
    """

    def __init__(
        self,
        graph,
        indices,
        graph_sampler,
        *,
        features=None,
        labels=None,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        device="cpu",
        seed: int = 0,
    ):
        indices = torch.as_tensor(indices)
        if indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"indices must be an integer tensor, got {indices.dtype}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if indices.numel() and (
            int(indices.min()) < 0 or int(indices.max()) >= graph.num_nodes()
        ):
            bad = int(indices.max()) if int(indices.min()) >= 0 else int(
                indices.min())
            raise ValueError(
                f"seed id {bad} out of range: the graph has "
                f"{graph.num_nodes()} nodes"
            )
        if features is None:
            features = graph.ndata["feat"]
        if labels is None and "label" in graph.ndata:
            labels = graph.ndata["label"]
        if len(features) != graph.num_nodes():
            raise ValueError(
                f"features have {len(features)} rows, but the graph has "
                f"{graph.num_nodes()} nodes"
            )
        self.graph = graph
        self.indices = indices.long()
        self.graph_sampler = graph_sampler
        self.features = features
        self.labels = labels
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.device = torch.device(device)
        self.seed = seed
        self.epoch = 0
        self.stats = LoaderStats()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle the next iteration uses."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = self.indices.numel()
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        import dgl

        # DGL's samplers draw from DGL's global generator: seed it too, so
        # an epoch's blocks depend only on (seed, epoch).
        dgl.seed(self.seed + self.epoch)
        order = self.indices
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = order[torch.randperm(order.numel(), generator=generator)]
        for i in range(len(self)):
            seeds = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self._make_batch(seeds)

    def _make_batch(self, seeds: torch.Tensor) -> MiniBatch:
        seconds = self.stats.seconds
        # (1) Sample blocks with the user's DGL sampler.
        start = time.perf_counter()
        input_nodes, output_nodes, blocks = self.graph_sampler.sample(
            self.graph, seeds
        )
        # (2) Fetch the input rows.
        mid = time.perf_counter()
        x = self._fetch(input_nodes)
        y = None if self.labels is None else self.labels[output_nodes]
        # (3) Transfer to the training device.
        end = time.perf_counter()
        if self.device.type == "cpu":
            blocks[0].srcdata["feat"] = x
            if y is not None:
                blocks[-1].dstdata["label"] = y
        else:
            x = x.to(self.device, non_blocking=True)
            y = None if y is None else y.to(self.device, non_blocking=True)
        done = time.perf_counter()
        seconds["sample"] += mid - start
        seconds["fetch"] += end - mid
        seconds["transfer"] += done - end
        self.stats.batches += 1
        self.stats.rows_requested += int(input_nodes.numel())
        return MiniBatch(input_nodes, output_nodes, blocks, x, y)

    def _fetch(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.features, torch.Tensor):
            return self.features[ids]
        return torch.from_numpy(np.ascontiguousarray(
            self.features[ids.numpy()]
        ))

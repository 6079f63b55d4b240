"""The typed batches that pass between the stages.

``SampledBatch`` (sampling -> fetching) -> ``ReadyBatch`` (fetching ->
finishing) -> ``MiniBatch`` (what training gets: DGL's tuple).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from hmgraph.cache.engine import argsort

__all__ = ["MiniBatch", "ReadyBatch", "SampledBatch", "blocks_of"]


@dataclass
class SampledBatch:
    """A batch after sampling (CPU).

    Attributes
    ----------
    index : int
        Position in the epoch.
    batch : object
        What the sampler returned (tuple of ids and graphs, or a graph).
    reads : list of hmgraph.dglbatch.Lazy
        The cached feature's rows the batch needs.
    others : list of hmgraph.dglbatch.Lazy
        Other lazy features the sampler asked for.
    sample_seconds : float
        Time in the sampler.
    sample_cpu_seconds : float
        CPU time of the sampling thread meanwhile.
    """

    index: int
    batch: object
    reads: list
    others: list
    sample_seconds: float
    sample_cpu_seconds: float = 0.0

    @functools.cached_property
    def unique_inputs(self) -> dict:
        """Sorted unique ids of `reads` per node type (the lookahead);
        computed when first asked."""
        ids = {}
        for read in self.reads:
            ids.setdefault(read.type, []).append(read.ids)
        # A compiled radix sort: torch's default CPU sort of 160,000
        # int64 ids took 97 ms, NumPy's 4 ms; of a synth-products batch's
        # 543,000 ids NumPy's 30 ms, the radix sort and a take 5 ms.
        return {key: torch.from_numpy(_sorted(parts[0].numpy()))
                if len(parts) == 1 else torch.unique(torch.cat(parts))
                for key, parts in ids.items()}


def _sorted(ids: np.ndarray) -> np.ndarray:
    """``np.sort(ids)`` of non-negative ids, by a radix sort."""
    if not len(ids):
        return ids.copy()
    return ids[argsort(ids, int(ids.max()) + 1)]


@dataclass
class ReadyBatch:
    """A batch with its rows read (on the training device).

    Attributes
    ----------
    sampled : SampledBatch
        The batch as sampled.
    values : list of torch.Tensor
        Rows of ``sampled.reads`` then of ``sampled.others``, in order.
    y : torch.Tensor or None
        Labels of a node batch's output nodes.
    fetch_seconds : float
        Time reading the rows.
    fetch_cpu_seconds : float
        CPU time of the fetching thread meanwhile (the storage tier's
        threads count their own: `hmgraph.cache.StorageStats`).
    """

    sampled: SampledBatch
    values: list
    y: torch.Tensor | None
    fetch_seconds: float
    fetch_cpu_seconds: float = 0.0


class MiniBatch(tuple):
    """A sampler's batch, plus the cached feature's rows and the labels.

    Unpacks exactly like a batch of `dgl.dataloading.DataLoader`: for a
    block sampler ``(input_nodes, output_nodes, blocks)``; for edge
    prediction ``(input_nodes, pair_graph, blocks)`` or ``(input_nodes,
    pair_graph, neg_pair_graph, blocks)``; for other samplers whatever
    tuple they return. The input rows are also in
    ``blocks[0].srcdata[feature_name]`` and, for node batches, the labels
    in ``blocks[-1].dstdata["label"]`` (on other devices, where DGL's
    wheel has no CUDA and blocks stay on the CPU, read the attributes).

    Attributes
    ----------
    x : torch.Tensor, dict or None
        Rows of ``input_nodes`` (per node type on heterographs), on the
        loader's device; None where the batch has no blocks.
    y : torch.Tensor or None
        Labels of the output nodes of a node batch, on the device.
    """

    x: torch.Tensor | dict | None
    y: torch.Tensor | None

    def __new__(cls, items, x=None, y=None):
        batch = super().__new__(cls, items)
        batch.x = x
        batch.y = y
        return batch

    @property
    def input_nodes(self):
        """Ids whose rows the first layer reads."""
        return self[0]

    @property
    def output_nodes(self):
        """The seeds of a node batch (the pair graph of an edge batch)."""
        return self[1]

    @property
    def blocks(self) -> list:
        """DGL blocks, one per layer."""
        return self[-1]


def blocks_of(batch) -> list | None:
    """The list of blocks a block or edge-prediction batch ends with."""
    if isinstance(batch, tuple) and batch and isinstance(batch[-1], list) \
            and batch[-1] and all(getattr(b, "is_block", False)
                                  for b in batch[-1]):
        return batch[-1]
    return None

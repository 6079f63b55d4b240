"""Finishing: a `ReadyBatch` into DGL's batch on the device ->
`MiniBatch`, counted (runs in the training thread)."""

from __future__ import annotations

from hmgraph import dglbatch
from hmgraph.stages.base import Stage
from hmgraph.stages.batches import MiniBatch, ReadyBatch, blocks_of
from hmgraph.stages.stats import LoaderStats

__all__ = ["FinishStage"]


class FinishStage(Stage):
    """Put the rows read where the sampler asked for them, and count.

    Parameters
    ----------
    device : torch.device
        Where batches land.
    homogeneous : bool
        The graph has one node type (``MiniBatch.x`` is then a tensor,
        else a dict by node type).
    stats : LoaderStats
        The loader's counters, added to per batch.
    other_storages : dict
        Storages of data attached by name (`DataLoader.attach_data`),
        read by the batch's top-level `dgl.frame.LazyFeature` items.
    pin : bool
        CUDA: copy those from pinned memory.
    """

    def __init__(self, device, homogeneous: bool, stats: LoaderStats,
                 other_storages: dict, pin: bool = False):
        self.device = device
        self.homogeneous = homogeneous
        self.stats = stats
        self.other_storages = other_storages
        self.pin = pin
        self.trace: list | None = None

    def reset(self, trace: list | None = None) -> None:
        """Record each batch's unique input ids into ``trace`` (a list)
        this epoch, or nothing (None)."""
        self.trace = trace

    def __call__(self, ready: ReadyBatch):
        """DGL's batch, as a `MiniBatch` where it is a tuple."""
        sampled = ready.sampled
        self.stats.batches += 1
        self.stats.rows_requested += sum(r.ids.numel() for r in sampled.reads)
        self.stats.seconds["sample"] += sampled.sample_seconds
        self.stats.seconds["fetch"] += ready.fetch_seconds
        self.stats.cpu_seconds["sample"] += sampled.sample_cpu_seconds
        self.stats.cpu_seconds["fetch"] += ready.fetch_cpu_seconds
        if self.trace is not None:
            unique = sampled.unique_inputs
            self.trace.append(next(iter(unique.values()))
                              if len(unique) == 1 else unique)
        batch = self._resolve_other(
            dglbatch.to_device(sampled.batch, self.device))
        found = dglbatch.graphs(batch)
        blocks = blocks_of(batch)
        first = next(i for i, g in enumerate(found) if g is blocks[0]) \
            if blocks is not None else None
        x = {}
        for number, (lazy, value) in enumerate(zip(
                sampled.reads + sampled.others, ready.values, strict=True)):
            if found[lazy.graph].device == self.device:
                dglbatch.assign(batch, lazy, value)
            if number < len(sampled.reads) and lazy.graph == first and \
                    lazy.frame < len(blocks[0].srctypes):
                x[lazy.type] = value
        if ready.y is not None and blocks[-1].device == self.device:
            blocks[-1].dstdata["label"] = ready.y
        if not isinstance(batch, tuple):
            return batch
        if self.homogeneous:
            return MiniBatch(batch, next(iter(x.values()), None), ready.y)
        return MiniBatch(batch, x if len(x) else None, ready.y)

    def _resolve_other(self, batch):
        """Top-level `LazyFeature` items, from `attach_data` storages."""
        if not self.other_storages:
            return batch
        # Lazy: DGL takes 4 s to import (see `hmgraph.dglbatch.graphs`).
        from dgl.frame import LazyFeature
        from dgl.utils import recursive_apply

        def resolve(item):
            if isinstance(item, LazyFeature):
                return self.other_storages[item.name].fetch(
                    item.id_, self.device, self.pin)
            return item

        return recursive_apply(batch, resolve)

    def state_dict(self) -> dict:
        """The loader's counters (`LoaderStats.as_dict`)."""
        return self.stats.as_dict()

"""Sampling: DGL's seed batches through the sampler -> `SampledBatch`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import torch

from hmgraph import dglbatch
from hmgraph.stages.base import Stage
from hmgraph.stages.batches import SampledBatch

__all__ = ["SampleStage", "torch_loader"]

_END = object()

#: torch's DataLoader keywords that DGL's loader sets itself.
_SET_BY_DGL = ("batch_size", "shuffle", "sampler", "batch_sampler",
               "collate_fn", "pin_memory", "drop_last")


def torch_loader(dataset, graph, graph_sampler, use_uva: bool,
                 device: torch.device, kwargs: dict
                 ) -> torch.utils.data.DataLoader:
    """DGL's sampling loader over ``dataset``: its collate runs the
    sampler (here or in ``num_workers`` worker processes).

    Raises
    ------
    TypeError
        A keyword that DGL's loader sets itself (``batch_size``...).
    """
    # Lazy: DGL takes 4 s to import (see `hmgraph.dglbatch.graphs`).
    from dgl.dataloading.dataloader import (
        CollateWrapper,
        WorkerInitWrapper,
    )

    kwargs = dict(kwargs)
    for key in _SET_BY_DGL:
        if key in kwargs:
            raise TypeError(
                f"DataLoader got an unexpected keyword {key!r}: DGL's "
                f"loader sets it itself")
    if int(kwargs.get("num_workers", 0)) > 0:
        graph.create_formats_()
    else:  # torch asserts it away without workers; hmgraph's threads
        kwargs.pop("timeout", None)  # honour it (DataLoader.timeout)
    return torch.utils.data.DataLoader(
        dataset, batch_size=None,
        worker_init_fn=WorkerInitWrapper(kwargs.pop("worker_init_fn", None)),
        collate_fn=CollateWrapper(graph_sampler.sample, graph, use_uva,
                                  device), **kwargs)


class SampleStage(Stage):
    """Each epoch's batches from DGL's sampling loader, their reads found.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The parent graph (its storages return to graphs from workers).
    graph_sampler : dgl.dataloading.Sampler
        The sampler; one with ``order_seeds`` chooses the epoch's order.
    dataset : DGL's tensorized dataset
        The seed batches (`hmgraph.dglbatch.seed_dataset`).
    batches : torch.utils.data.DataLoader
        DGL's sampling loader over ``dataset`` (`torch_loader`).
    find_reads : callable
        ``batch -> (reads, others)`` (`hmgraph.stages.FindReads`).
    shuffle : bool
        Reshuffle every epoch.
    generator : torch.Generator, optional
        Draws the order where no seed is given.
    num_workers : int
        Worker processes sampling (then DGL seeds them itself).
    """

    def __init__(self, graph, graph_sampler, dataset, batches, find_reads,
                 shuffle: bool, generator=None, num_workers: int = 0):
        self.graph = graph
        self.graph_sampler = graph_sampler
        self.dataset = dataset
        self.batches = batches
        self.find_reads = find_reads
        self.shuffle = shuffle
        self.generator = generator
        self.num_workers = num_workers
        self.sampled = 0

    def reset(self, seed: int | None = None, epoch: int = 0) -> int | None:
        """Choose the epoch's order of the seeds (in DGL's dataset).

        Returns
        -------
        int or None
            Seed of DGL's generators in the sampling thread: ``seed +
            epoch`` when ``seed`` is given (and no worker processes
            sample). DGL 2.1 seeds a thread's generator with the seed
            plus the thread's number (threads are numbered as they first
            draw), so with ``seed`` every pass samples in a sampling
            thread of its own, seeded first: the blocks then repeat at
            any ``prefetch``, 0 included.
        """
        self.sampled = 0
        ordered = hasattr(self.graph_sampler, "order_seeds")
        if self.shuffle or ordered:
            self._order(seed, epoch, ordered)
        if seed is None or self.num_workers:
            return None
        return seed + epoch

    def _order(self, seed, epoch, ordered: bool) -> None:
        if not ordered and seed is None and self.generator is None:
            self.dataset.shuffle()  # DGL: np.random.shuffle, in place
            return
        seeds = dglbatch.local_seeds(self.dataset)
        generator = torch.Generator().manual_seed(seed + epoch) \
            if seed is not None else self.generator
        if not ordered:
            positions = torch.randperm(seeds.numel(), generator=generator)
        else:
            epoch_seed = (seed or 0) if not self.shuffle else int(
                torch.randint(2**31 - 1, (), generator=generator))
            order = self.graph_sampler.order_seeds(seeds.long(), epoch_seed)
            where = torch.full((int(seeds.max()) + 1,), -1,
                               dtype=torch.int64)
            where[seeds.long()] = torch.arange(seeds.numel())
            positions = where[order]
        dglbatch.set_order(self.dataset, positions)

    def run(self, seed: int | None = None) -> Iterator[SampledBatch]:
        """The epoch's sampled batches, in order.

        DGL's loader starts here (drawing torch's base seed, as DGL);
        the sampler runs on each ``next`` of the returned iterator.

        Parameters
        ----------
        seed : int, optional
            Seed DGL's generators (of the thread that iterates) before
            the first batch (`reset` returns it).
        """
        return self._sampled(iter(self.batches), seed)

    def _sampled(self, batches, seed) -> Iterator[SampledBatch]:
        # Lazy: DGL takes 4 s to import (see `hmgraph.dglbatch.graphs`).
        import dgl
        from dgl.dataloading.dataloader import (
            restore_parent_storage_columns,
        )
        from dgl.utils import recursive_apply

        if seed is not None:
            dgl.seed(seed)
        for index in itertools.count():
            start, cpu = time.perf_counter(), time.thread_time()
            batch = next(batches, _END)
            if batch is _END:
                return
            batch = recursive_apply(batch, restore_parent_storage_columns,
                                    self.graph)
            reads, others = self.find_reads(batch)
            self.sampled = index + 1
            yield SampledBatch(index, batch, reads, others,
                               time.perf_counter() - start,
                               time.thread_time() - cpu)

    def state_dict(self) -> dict:
        """Batches sampled this epoch, of how many."""
        return {"sampled": self.sampled, "batches": len(self.dataset)}

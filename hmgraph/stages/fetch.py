"""Fetching: a batch's rows through the cache -> `ReadyBatch`.

The cached feature's rows come through its cache, which is told the
unique input ids of the batches already sampled ahead (its lookahead
window); the other lazy features are gathered as DGL gathers them; the
labels of a node batch come along. On CUDA the copies may run on a
stream of their own, synchronized before the batch is handed on.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Iterator

import torch

from hmgraph import dglbatch
from hmgraph.stages.base import Stage
from hmgraph.stages.batches import ReadyBatch, SampledBatch, blocks_of

__all__ = ["FetchStage"]


class FetchStage(Stage):
    """Read each sampled batch's rows, ``window`` batches ahead.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The parent graph (storages of the features not cached).
    feature_name : str
        The node feature that goes through the cache.
    sources : dict
        Per node type, the cached feature's source (`Feature`).
    features : dict
        Per node type, what the batch's rows are read from: the cache
        (or batch reuse over it), or the source itself (caching off).
    labels : torch.Tensor, optional
        Labels by node id (homogeneous graphs).
    device : torch.device
        Where the rows land.
    window : int
        Sampled batches looked ahead.
    side_stream : bool
        CUDA: copy on a stream of its own.
    pin : bool
        CUDA: copy gathered rows from pinned memory (``pin_prefetcher``).
    """

    def __init__(self, graph, feature_name: str, sources: dict,
                 features: dict, labels,
                 device: torch.device, window: int,
                 side_stream: bool = False, pin: bool = False):
        self.graph = graph
        self.feature_name = feature_name
        self.sources = sources
        self.features = features
        self.labels = labels
        self.device = device
        self.window = window
        self.side_stream = side_stream and device.type == "cuda"
        self.pin = pin
        self._homogeneous = len(graph.ntypes) == 1
        self.fetched = 0

    def reset(self, keep_batches: int = 2) -> None:
        """Keep buffers for ``keep_batches`` batches alive at once (the
        batch training, those prefetched, the one being read)."""
        self.fetched = 0
        self._each_tier("keep_buffers", keep_batches)

    def release(self) -> None:
        """Free the buffers kept for reuse (at an epoch's end), through
        every tier (`Feature.release_buffers`)."""
        self._each_tier("release_buffers")

    def _each_tier(self, method: str, *args) -> None:
        """Call ``method`` of every tier of every cached feature that has
        it (a user's own tier may lack it)."""
        for feature in self.features.values():
            seen = set()
            while feature is not None and id(feature) not in seen:
                seen.add(id(feature))
                call = getattr(feature, method, None)
                if call is not None:
                    call(*args)
                feature = getattr(feature, "inner", None) or getattr(
                    feature, "source", None)

    @property
    def interleaves(self) -> bool:
        """Whether batches are read interleaved: one node type whose rows
        come through a cache that reads a batch while it looks up the
        next (`FeatureCache.submit`)."""
        return len(self.features) == 1 and all(
            getattr(feature, "interleaves", False)
            for feature in self.features.values())

    def run(self, sampled: Iterator[SampledBatch]) -> Iterator[ReadyBatch]:
        """``ReadyBatch`` of each sampled batch, in order.

        Where the stage `interleaves`, batch i + 1 is submitted before
        batch i is handed on: its rows are looked up while batch i's
        reads end, and its reads run while batch i is trained on."""
        ahead: collections.deque[SampledBatch] = collections.deque()
        stream = torch.cuda.Stream(self.device) if self.side_stream \
            else None
        if not self.interleaves:
            for batch in sampled:
                ahead.append(batch)
                if len(ahead) > self.window:
                    yield self._ready(self._submit(ahead, stream), stream)
            while ahead:
                yield self._ready(self._submit(ahead, stream), stream)
            return
        pending = None
        try:
            for batch in itertools.chain(sampled, [None]):
                if batch is not None:
                    ahead.append(batch)
                while ahead and (batch is None or len(ahead) > self.window):
                    started = self._submit(ahead, stream)
                    if pending is not None:
                        yield self._ready(pending, stream)
                    pending = started
            if pending is not None:
                pending, last = None, pending
                yield self._ready(last, stream)
        finally:
            if pending is not None:  # left early: finish the read in flight
                with contextlib.suppress(Exception):
                    self._each_tier("_drain")

    def _submit(self, ahead, stream) -> tuple:
        """Start the next batch's read: ``(batch, rows or pending reads,
        labels, seconds, CPU seconds)``."""
        batch = ahead.popleft()
        future = [later.unique_inputs for later in ahead]
        start, cpu = time.perf_counter(), time.thread_time()
        with self._on(stream):
            values, y = self.fetch(batch, future)
        return (batch, values, y, time.perf_counter() - start,
                time.thread_time() - cpu)

    def _ready(self, started: tuple, stream) -> ReadyBatch:
        batch, values, y, seconds, cpu = started
        start, began = time.perf_counter(), time.thread_time()
        with self._on(stream):
            values = [v.result() if hasattr(v, "result") else v
                      for v in values]
        if stream is not None:
            stream.synchronize()
            # Made on the side stream, used on the default one: tell the
            # allocator, or it may reuse the memory while kernels read it.
            consumer = torch.cuda.default_stream(stream.device)
            for tensor in [*values, y]:
                if tensor is not None and tensor.is_cuda:
                    tensor.record_stream(consumer)
        self.fetched += 1
        return ReadyBatch(batch, values, y,
                          seconds + time.perf_counter() - start,
                          cpu + time.thread_time() - began)

    @staticmethod
    def _on(stream):
        """The CUDA stream's context, or none."""
        return torch.cuda.stream(stream) if stream is not None else \
            contextlib.nullcontext()

    def fetch(self, sampled: SampledBatch, future: list) -> tuple:
        """``(values, labels)`` of one batch: the cached feature's rows
        through the cache (``future``: later batches' reads by type),
        the rest gathered. Where the stage `interleaves`, the cached
        rows are a `PendingRead` (its ``result()`` gives them)."""
        values = []
        for read in sampled.reads:
            ahead = [f[read.type] for f in future if read.type in f]
            feature = self.features[read.type]
            if feature is self.sources[read.type]:  # caching off
                rows = feature.read(read.ids).to(
                    self.device, non_blocking=self.pin)
            elif self.interleaves:
                rows = feature.submit(read.ids, ahead)
            else:
                rows = feature.read(read.ids, ahead)
            values.append(rows)
        for lazy in sampled.others:
            values.append(self.gather(lazy))
        y = None
        output = sampled.batch[1] if isinstance(sampled.batch, tuple) \
            else None
        if self.labels is not None and torch.is_tensor(output) and \
                blocks_of(sampled.batch) is not None:
            y = self.labels[output.long()].to(self.device,
                                              non_blocking=True)
        return values, y

    def gather(self, lazy: dglbatch.Lazy) -> torch.Tensor:
        """A lazy feature other than the cached one, as DGL gathers it."""
        if lazy.kind == "node":
            if lazy.name == "label" and self.labels is not None and \
                    self._homogeneous:
                return self.labels[lazy.ids].to(self.device)
            if lazy.name == self.feature_name and \
                    lazy.type in self.sources:
                return self.sources[lazy.type].read(lazy.ids).to(
                    self.device)
            storage = self.graph.get_node_storage(lazy.name, lazy.type)
        else:
            storage = self.graph.get_edge_storage(lazy.name, lazy.type)
        return storage.fetch(lazy.ids.to(self.graph.idtype), self.device,
                             self.pin)

    def state_dict(self) -> dict:
        """Batches fetched this epoch, and the lookahead."""
        return {"fetched": self.fetched, "window": self.window}

    def close(self) -> None:
        """Close every feature read from (files, threads)."""
        for feature in self.features.values():
            feature.close()

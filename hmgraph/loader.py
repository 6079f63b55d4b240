"""`hmgraph.DataLoader`: DGL's mini-batch contract over hmgraph's stages.

A mini-batch goes through the stages of `hmgraph.pipeline`:

1. **sample**: seeds drawn with a generator seeded ``seed + epoch`` (as
   GraphBolt's ``ItemSampler``; DGL's generator is seeded alike) and handed
   to any DGL ``BlockSampler``;
2. **fetch**: input rows read through the feature cache (device -> host ->
   storage), with the batches already sampled ahead as lookahead;
3. **transfer**: rows and labels land on the training device.

With ``prefetch > 0`` sampling and fetching run in background threads,
``prefetch`` batches ahead of training.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.coordinated import CacheStats, FeatureCache
from hmgraph.cache.feature import Feature, TensorFeature
from hmgraph.cache.plan import CachePlan, build_cache, make_plan
from hmgraph.cache.policies import layer_aware_score
from hmgraph.cache.reuse import REUSE_LEVELS, BatchReuse
from hmgraph.pipeline import Prefetcher, fetch_stage, sample_stage

log = logging.getLogger(__name__)

__all__ = ["DataLoader", "LoaderStats", "MiniBatch"]

# Policies planned from a profiling pass with the real sampler.
_PROFILED = ("presample", "layer-aware", "hmgraph")

#: Share of the host budget staged for window read planning by default
#: (features on the storage tier, lookahead on).
STAGING_SHARE = 0.5


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
    """Counters of one loader; `reset` zeroes them all.

    Attributes
    ----------
    batches : int
        Mini-batches produced.
    rows_requested : int
        Input rows of all batches.
    seconds : dict of str to float
        Per stage: ``sample`` and ``fetch`` (in their threads when
        prefetching), ``wait`` (training waiting for a batch).
    cache : CacheStats
        Hits per tier, admissions, bytes per link.
    storage : object or None
        The storage tier's counters (pages and bytes read), if any.
    reuse : ReuseStats or None
        Rows reused per level, bytes saved, seconds finding duplicates.
    """

    batches: int = 0
    rows_requested: int = 0
    seconds: dict = field(default_factory=lambda: {
        "sample": 0.0, "fetch": 0.0, "wait": 0.0})
    cache: CacheStats | None = None
    storage: object = None
    reuse: object = None

    def reset(self) -> None:
        """Zero every counter, the cache's and storage's included."""
        self.batches = 0
        self.rows_requested = 0
        self.seconds = {key: 0.0 for key in self.seconds}
        if self.cache is not None:
            self.cache.reset()
        if self.storage is not None:
            self.storage.reset()
        if self.reuse is not None:
            self.reuse.reset()

    def hit_rate(self, tier: str) -> float:
        """Share of input rows served by ``tier`` (0.0 before any)."""
        return self.cache.hit_rate(tier) if self.cache else 0.0

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        record = {"batches": self.batches,
                  "rows_requested": self.rows_requested,
                  "seconds": dict(self.seconds)}
        if self.cache is not None:
            record["cache"] = self.cache.as_dict()
        if self.storage is not None:
            record["storage"] = self.storage.as_dict()
        if self.reuse is not None:
            record["reuse"] = self.reuse.as_dict()
        return record


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
    features : tensor, numpy array, Feature or path, optional
        Rows by node id: in memory (tensor, array, memmap), any
        `hmgraph.cache.Feature` (e.g. the O_DIRECT storage tier), or the
        path of a feature file (opened as the storage tier). Default
        ``graph.ndata["feat"]``.
    labels : torch.Tensor, optional
        Labels by node id; default ``graph.ndata["label"]`` if present.
    batch_size, shuffle, drop_last, device, seed
        As in `dgl.dataloading.DataLoader`; the shuffle of epoch ``e``
        uses a generator seeded ``seed + e`` (see `set_epoch`), and DGL's
        generator is seeded alike. DGL samples with one generator per
        OpenMP thread, so sampled blocks repeat exactly only with
        ``OMP_NUM_THREADS=1``; the seed order always repeats.
    cache : str, CachePlan or None
        ``None`` switches caching off; a policy name (``hmgraph``,
        ``presample``, ``degree``, ``lru``, ``clock``, ``none``) is
        planned from a profiling pass of ``profile_batches`` batches with
        this sampler; a `CachePlan` is used as given.
    device_budget_bytes, host_budget_bytes : int
        Memory for cached rows on the device and in host memory.
    prefetch : int
        Batches sampled and fetched ahead in background threads; 0 runs
        every stage in the training thread.
    window : int, optional
        Lookahead batches given to the cache (default: the plan's).
    profile_batches : int
        Batches sampled to profile row accesses for the plan.
    reuse : str
        Batch reuse: ``"none"``, ``"one-level"`` (rows of the previous
        batch stay on the device) or ``"two-level"`` (and those of the
        batch before it). Works with any sampler and cache, ``None``
        included; its buffers come out of the device budget.
    placement : str
        How profiled rows rank for static placement in ``hmgraph`` and
        ``presample``: ``"frequency"`` (batches that read the row) or
        ``"layer-aware"`` (per-hop need, hops near the seeds first).
    staging : float, optional
        Share of the host budget for window read planning: rows the next
        ``window`` batches need that this batch's block reads bring along
        are kept until used, so a block is read once per window. Default
        `STAGING_SHARE` when features come from the storage tier and the
        loader looks ahead, else 0.
    profile : hmgraph.samplers.presample.Profile, optional
        A profile of this loader's batches (same seeds, sampler, batch
        size and seed), e.g. the one a hot-first layout was ordered by:
        used instead of a profiling pass.
    """

    def __init__(self, graph, indices, graph_sampler, *, features=None,
                 labels=None, batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, device="cpu", seed: int = 0,
                 cache=None, device_budget_bytes: int = 0,
                 host_budget_bytes: int = 0, prefetch: int = 0,
                 window: int | None = None, profile_batches: int = 32,
                 reuse: str = "none", placement: str = "frequency",
                 staging: float | None = None, profile=None):
        indices = torch.as_tensor(indices)
        if indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"indices must be an integer tensor, got {indices.dtype}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if placement not in ("frequency", "layer-aware"):
            raise ValueError(f"unknown placement {placement!r}; available: "
                             f"frequency, layer-aware")
        self.placement = placement
        if reuse not in REUSE_LEVELS:
            raise ValueError(f"unknown reuse {reuse!r}; available: "
                             f"{', '.join(REUSE_LEVELS)}")
        if indices.numel() and (
            int(indices.min()) < 0 or int(indices.max()) >= graph.num_nodes()
        ):
            bad = int(indices.max()) if int(indices.min()) >= 0 else int(
                indices.min())
            raise ValueError(
                f"seed id {bad} out of range: the graph has "
                f"{graph.num_nodes()} nodes"
            )
        source = _as_feature(graph.ndata["feat"] if features is None
                             else features)
        if source.num_rows != graph.num_nodes():
            raise ValueError(
                f"features have {source.num_rows} rows, but the graph has "
                f"{graph.num_nodes()} nodes"
            )
        if labels is None and "label" in graph.ndata:
            labels = graph.ndata["label"]
        self.graph = graph
        self.indices = indices.long()
        self.graph_sampler = graph_sampler
        self.labels = labels
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.device = torch.device(device)
        self.seed = seed
        self.prefetch = prefetch
        self.epoch = 0
        if profile is not None and profile.counts.numel() != \
                graph.num_nodes():
            raise ValueError(
                f"profile counts {profile.counts.numel()} rows, but the "
                f"graph has {graph.num_nodes()} nodes"
            )
        self.profile = profile
        if staging is None:
            looks_ahead = (4 if window is None else window) > 0
            staging = STAGING_SHARE if looks_ahead and hasattr(
                source, "read_along") else 0.0
        # (1) Plan the cache (profiling with the real sampler if asked).
        self.plan = self._plan(cache, source, device_budget_bytes,
                               host_budget_bytes, window, profile_batches,
                               REUSE_LEVELS[reuse], staging)
        # (2) Build it over the source.
        counts = self._hotness()
        self.cache: FeatureCache = build_cache(
            source, self.plan, self.device, counts=counts,
            degrees=graph.in_degrees() if self.plan.policy == "degree"
            else None,
            hop_counts=None if self.profile is None
            else self.profile.hop_counts,
        )
        # (3) Batch reuse in front of the cache.
        self.feature = self.cache
        if self.plan.reuse_levels:
            self.feature = BatchReuse(self.cache, self.plan.reuse_levels,
                                      self.plan.reuse_rows)
        self.window = self.plan.window if window is None else window
        #: Set to a list to record each batch's unique input ids (a trace
        #: for replaying policies, e.g. Belady's, on the same accesses).
        self.trace: list | None = None
        self.stats = LoaderStats(
            cache=self.cache.stats, storage=getattr(source, "stats", None),
            reuse=getattr(self.feature, "stats", None)
            if self.plan.reuse_levels else None)

    def _plan(self, cache, source, device_budget_bytes, host_budget_bytes,
              window, profile_batches, reuse_levels, staging) -> CachePlan:
        if isinstance(cache, CachePlan):
            if cache.num_rows != source.num_rows:
                raise ValueError(
                    f"plan is for {cache.num_rows} rows, features have "
                    f"{source.num_rows}"
                )
            if cache.policy in _PROFILED:
                self._profile(profile_batches)
            return cache
        policy = "none" if cache is None else cache
        if policy in _PROFILED or reuse_levels:
            self._profile(profile_batches)
        return make_plan(
            policy, source.num_rows, source.row_bytes, device_budget_bytes,
            host_budget_bytes, counts=self._hotness(),
            trace=() if self.profile is None else self.profile.trace,
            window=4 if window is None else window,
            reuse_levels=reuse_levels, staging=staging,
        )

    def _hotness(self) -> torch.Tensor | None:
        """Profiled score per row for static placement."""
        if self.profile is None:
            return None
        if self.placement == "layer-aware":
            return layer_aware_score(self.profile.hop_counts)
        return self.profile.counts

    def _profile(self, profile_batches: int) -> None:
        from hmgraph.samplers.presample import presample

        if self.profile is not None:  # given, or already taken
            return
        start = time.perf_counter()
        self.profile = presample(
            self.graph, self.graph_sampler, self.indices, self.batch_size,
            profile_batches, seed=self.seed + 7919, shuffle=self.shuffle,
        )
        log.info("profiled %d batches in %.1f s", self.profile.num_batches,
                 time.perf_counter() - start)

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

        # DGL's samplers draw from DGL's global generator: seed it too.
        dgl.seed(self.seed + self.epoch)
        order = self.indices
        epoch_seed = self.seed + self.epoch
        if hasattr(self.graph_sampler, "order_seeds"):
            # Cluster samplers order seeds by cluster (clusters shuffled).
            order = self.graph_sampler.order_seeds(
                order, epoch_seed if self.shuffle else self.seed)
        elif self.shuffle:
            generator = torch.Generator().manual_seed(epoch_seed)
            order = order[torch.randperm(order.numel(), generator=generator)]
        sampled = sample_stage(self.graph, self.graph_sampler, order,
                               self.batch_size, len(self))
        threads = []
        if self.prefetch:
            sampled = Prefetcher("hmgraph-sample", sampled,
                                 self.prefetch + self.window)
            threads.append(sampled)
        ready = fetch_stage(sampled, self.feature, self.labels, self.window,
                            self.device)
        if self.prefetch:
            ready = Prefetcher("hmgraph-fetch", ready, self.prefetch)
            threads.insert(0, ready)
        try:
            while True:
                start = time.perf_counter()
                batch = next(ready, None)
                self.stats.seconds["wait"] += time.perf_counter() - start
                if batch is None:
                    return
                yield self._finish(batch)
        finally:
            for thread in threads:
                thread.close()
            if not self.prefetch:
                ready.close()

    def _finish(self, batch) -> MiniBatch:
        sampled = batch.sampled
        self.stats.batches += 1
        self.stats.rows_requested += int(sampled.input_nodes.numel())
        self.stats.seconds["sample"] += sampled.sample_seconds
        self.stats.seconds["fetch"] += batch.fetch_seconds
        if self.trace is not None:
            self.trace.append(sampled.unique_inputs)
        blocks = sampled.blocks
        if self.device.type == "cpu":
            blocks[0].srcdata["feat"] = batch.x
            if batch.y is not None:
                blocks[-1].dstdata["label"] = batch.y
        return MiniBatch(sampled.input_nodes, sampled.output_nodes, blocks,
                         batch.x, batch.y)

    def close(self) -> None:
        """Release the feature source (files, threads)."""
        self.feature.close()


def _as_feature(features) -> Feature:
    """The feature source: in memory, a Feature, or a feature file."""
    if isinstance(features, Feature):
        return features
    if isinstance(features, (str, os.PathLike)):
        from hmgraph.cache.storage import StorageFeature

        return StorageFeature(Path(features))
    if isinstance(features, np.ndarray):
        return _ArrayFeature(features)
    return TensorFeature(features)


class _ArrayFeature(Feature):
    """Rows of a NumPy array or memmap, gathered on read (CPU)."""

    def __init__(self, rows: np.ndarray):
        from hmgraph.cache.feature import torch_dtype

        self.rows = rows
        self.num_rows = rows.shape[0]
        self.row_shape = tuple(rows.shape[1:])
        self.dtype = torch_dtype(rows.dtype)

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.rows[ids.numpy()]))

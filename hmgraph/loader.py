"""`hmgraph.DataLoader`: `dgl.dataloading.DataLoader`, with hmgraph's cache.

DGL's signature wired onto the stages of `hmgraph.stages`, which
`hmgraph.pipeline` chains (in background threads with ``prefetch > 0``);
the cache of the one node feature hmgraph caches is planned and built by
`hmgraph.cachebuild`; every other feature is gathered as DGL gathers it.
"""

from __future__ import annotations

import contextlib

from hmgraph import cachebuild, dglbatch, inputs, stages
from hmgraph.cachebuild import PROFILED_POLICIES, STAGING_SHARE
from hmgraph.inputs import as_indices, feature_sources, loader_device
from hmgraph.loaderargs import check_arguments, default_labels, gpu_options
from hmgraph.pipeline import Pipeline
from hmgraph.stages import LoaderStats, MiniBatch

__all__ = ["PROFILED_POLICIES", "STAGING_SHARE", "DataLoader",
           "LoaderStats", "MiniBatch"]


class DataLoader:
    """Mini-batches from any DGL sampler, the cached feature through
    hmgraph's tiers: `dgl.dataloading.DataLoader` with one import changed.

    Iterates exactly like DGL's loader::

        for input_nodes, output_nodes, blocks in loader:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph (CPU), homogeneous or heterogeneous, int32 or int64.
    indices : tensor, array, list or dict of them
        What the sampler samples from, with the sampler's meaning: node
        ids for block samplers, edge ids for `as_edge_prediction_sampler`,
        partition ids for ``ClusterGCNSampler``; a dict by node (edge)
        type on heterographs.
    graph_sampler : dgl.dataloading.Sampler
        Any DGL sampler (block, edge prediction, subgraph) or hmgraph's.
    device : torch.device or str, optional
        Where batches land; default the graph's device (with ``use_uva``
        the current CUDA device), as DGL.
    use_ddp : bool
        Split the indices across the ranks of ``torch.distributed`` as
        DGL's ``DDPTensorizedDataset``: each rank a contiguous share,
        padded (unless ``drop_last``), shuffled per rank every epoch.
    ddp_seed : int
        As in DGL; here also the seed of the order when `set_epoch` is
        called and no ``seed`` was given.
    batch_size, drop_last, shuffle
        As in DGL. The order is reshuffled every epoch, drawn as DGL
        draws it (NumPy's global generator), from ``generator`` if given,
        or, with ``seed``, from a generator seeded ``seed + epoch``.
    use_prefetch_thread, use_alternate_streams, pin_prefetcher : bool
        Fetch in a background thread (at least ``prefetch=1``; unlike
        DGL also on the CPU); CUDA: copy on a side stream; pin gathered
        rows before the copy. Each defaults to on with CUDA.
    use_uva : bool
        CUDA: the graph and in-memory rows stay in pinned host memory and
        are read by the device (the cache's host tier is pinned anyway).
    gpu_cache : dict, optional
        DGL's ``{"node": {name: rows}}``: rows of the cached feature held
        on the device, i.e. the device tier's budget.
    features : tensor, numpy array, Feature, path or dict, optional
        The cached feature's rows by node id: in memory, any
        `hmgraph.cache.Feature` (e.g. the O_DIRECT storage tier), or the
        path of a feature file; a dict of them by node type. Default the
        graph's ``feature_name`` node data, where it has it.
    feature_name : str
        The node feature that goes through the cache.
    labels : torch.Tensor, optional
        Labels by node id; default ``graph.ndata["label"]`` if present.
    seed : int, optional
        Draw epoch ``e``'s order from a generator seeded ``seed + e``
        (`set_epoch` sets ``e``) and sample in a thread seeded so: the
        blocks repeat at any ``prefetch`` (with ``OMP_NUM_THREADS=1``).
    cache : str, CachePlan or None
        ``None`` switches caching off; a policy name (``hmgraph``,
        ``presample``, ``degree``, ``lru``, ``clock``, ``none``) is
        planned from a profiling pass of ``profile_batches`` batches with
        this sampler (which reseeds DGL's generator from NumPy's); a
        `CachePlan` is used as given.
    device_budget_bytes, host_budget_bytes : int
        Memory for cached rows on the device and in host memory.
    prefetch : int
        Batches sampled and fetched ahead in background threads; 0 runs
        every stage in the training thread, as DGL on the CPU.
    window : int, optional
        Lookahead batches for the cache and batch reuse; default 4 where
        it pays on this machine (`hmgraph.cache.costs`), else 0.
    profile_batches : int
        Batches sampled to profile row accesses for the plan.
    reuse : str
        Batch reuse: ``"none"``, ``"one-level"`` or ``"two-level"`` (rows
        of the previous batches stay on the device), or ``"auto"``: the
        levels that pay on this machine (`hmgraph.cache.costs`).
    placement : str
        How profiled rows rank for static placement: ``"frequency"`` or
        ``"layer-aware"`` (per-hop need, hops near the seeds first).
    staging : float, optional
        Share of the host budget for window read planning, used as given;
        default `hmgraph.cachebuild.STAGING_SHARE` with the storage tier
        and lookahead where it spares more reads than it costs on the
        profile (`hmgraph.cache.staging_model`), else 0.
    profile : hmgraph.samplers.presample.Profile, optional
        A profile of this loader's batches, used instead of profiling.
    **kwargs
        ``torch.utils.data.DataLoader``'s, as DGL passes them on:
        ``num_workers`` (sampling in worker processes, each a contiguous
        run of batches), ``persistent_workers``, ``worker_init_fn``,
        ``prefetch_factor``, ``timeout`` (also bounds waiting on
        hmgraph's threads), ``generator``, ``multiprocessing_context``.

    Attributes
    ----------
    plan, cache, feature : dict
        Per node type, a homogeneous graph's one type too: `CachePlan`,
        `FeatureCache`, and what batches read (see
        `hmgraph.cachebuild.CachedFeatures`).
    stats : LoaderStats
        The counters.
    trace : list or None
        Set to a list to record each batch's unique input ids.
    """

    def __init__(self, graph, indices, graph_sampler, device=None,
                 use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, drop_last: bool = False,
                 shuffle: bool = False, use_prefetch_thread=None,
                 use_alternate_streams=None, pin_prefetcher=None,
                 use_uva: bool = False, gpu_cache=None, *, features=None,
                 feature_name: str = "feat", labels=None,
                 seed: int | None = None, cache=None,
                 device_budget_bytes: int = 0, host_budget_bytes: int = 0,
                 prefetch: int = 0, window: int | None = None,
                 profile_batches: int = 32, reuse: str = "none",
                 placement: str = "frequency",
                 staging: float | None = None, profile=None, **kwargs):
        check_arguments(batch_size, prefetch, placement, reuse)
        self.graph, self.graph_sampler = graph, graph_sampler
        self.indices = as_indices(indices, graph, graph_sampler)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, \
            drop_last
        self.use_ddp, self.ddp_seed, self.use_uva = use_ddp, ddp_seed, use_uva
        self.seed, self.epoch = seed, 0
        self.placement, self.feature_name, self.num_workers = \
            placement, feature_name, int(kwargs.get("num_workers", 0))
        self.device = loader_device(device, graph, use_uva)
        (self.use_prefetch_thread, self.use_alternate_streams,
         self.pin_prefetcher) = gpu_options(
            self.device, use_uva, self.num_workers, use_prefetch_thread,
            use_alternate_streams, pin_prefetcher)
        self.prefetch = max(prefetch, 1) if self.use_prefetch_thread \
            else prefetch
        self.timeout = float(kwargs.get("timeout", 0) or 0)
        self.other_storages: dict = {}  # `attach_data`'s, by name
        # (1) DGL's own seed batches, workers and per-rank split.
        self.dataset = dglbatch.seed_dataset(
            self.indices, batch_size, drop_last, use_ddp, ddp_seed,
            shuffle, kwargs.get("persistent_workers", False))
        self._batches = stages.torch_loader(
            self.dataset, graph, graph_sampler, use_uva, self.device, kwargs)
        # (2) The cached feature's source per node type; the labels.
        sources = feature_sources(graph, features, feature_name)
        self.labels = default_labels(graph, labels)
        device_budget_bytes = inputs.gpu_cache_budget(
            gpu_cache, device_budget_bytes, self.device, feature_name,
            sources)
        if use_uva:
            inputs.pin_sources(graph, sources)
        # (3) The cache, planned and built per node type.
        built = cachebuild.CacheBuilder(
            graph, graph_sampler, self.indices, batch_size, shuffle, seed,
            len(self.dataset), self.device, placement, profile,
            profile_batches).build(sources, cache, device_budget_bytes,
                                   host_budget_bytes, window, reuse, staging)
        # Not the profile: it is done with (352 MB on synth-igb-large).
        self.plan, self.cache, self.feature, self.window = (
            built.plan, built.cache, built.feature, built.window)
        self.trace: list | None = None
        self.stats = stages.loader_stats(
            sources, self.cache, self.feature, len(graph.ntypes) == 1)
        # (4) The stages, chained.
        self.pipeline = self._pipeline(sources, kwargs.get("generator"))

    def _pipeline(self, sources: dict, generator) -> Pipeline:
        sample = stages.SampleStage(
            self.graph, self.graph_sampler, self.dataset, self._batches,
            stages.FindReads(self.feature_name, sources), self.shuffle,
            generator, self.num_workers)
        fetch = stages.FetchStage(
            self.graph, self.feature_name, sources, self.feature,
            self.labels, self.device, self.window,
            self.use_alternate_streams, self.pin_prefetcher)
        finish = stages.FinishStage(
            self.device, len(self.graph.ntypes) == 1, self.stats,
            self.other_storages, self.pin_prefetcher)
        return Pipeline(sample, fetch, finish, self.prefetch, self.timeout)

    def set_epoch(self, epoch: int) -> None:
        """Draw the next pass's order from a generator seeded
        ``seed + epoch`` (``ddp_seed`` where no ``seed`` was given)."""
        if self.seed is None:
            self.seed = self.ddp_seed
        self.epoch = epoch

    def attach_data(self, name: str, data) -> None:
        """Add a data other than node and edge features for prefetching
        (a `dgl.frame.LazyFeature` of ``name`` in a batch), as DGL."""
        # Lazy: DGL takes 4 s to import (see `hmgraph.dglbatch.graphs`).
        from dgl.storages import wrap_storage

        self.other_storages[name] = wrap_storage(data)

    @contextlib.contextmanager
    def enable_cpu_affinity(self, loader_cores=None, compute_cores=None,
                            verbose: bool = True):
        """Pin worker processes and training threads to separate cores.

        As DGL's: CPU devices only, needs ``num_workers > 0``; by default
        the workers take the first cores of NUMA node 0 and training the
        rest; affinity and DGL's thread count are restored on exit.
        """
        # Lazy: it imports DGL, which takes 4 s (see `hmgraph.dglbatch`).
        from hmgraph.affinity import cpu_affinity

        with cpu_affinity(self, loader_cores, compute_cores, verbose):
            yield

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        batches = self.pipeline.run(self.seed, self.epoch, self.trace)
        self.epoch += 1
        yield from batches

    def state_dict(self) -> dict:
        """The epoch and each stage's state (`Pipeline.state_dict`)."""
        return {"epoch": self.epoch, **self.pipeline.state_dict()}

    def close(self) -> None:
        """Release the feature sources (files, threads)."""
        self.pipeline.close()


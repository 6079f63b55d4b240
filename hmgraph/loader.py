"""`hmgraph.DataLoader`: `dgl.dataloading.DataLoader`, with hmgraph's cache.

It takes what DGL 2.1's loader takes, with DGL's meaning, and yields what
DGL's yields: any sampler, any indices (node ids, edge ids, dicts of
types), the features the sampler asks for resolved in the blocks. The one
node feature hmgraph caches (``feature_name``, default ``"feat"``) is read
through the cache tiers (device -> host -> storage), looking ahead at the
batches already sampled; every other feature is gathered as DGL gathers
it. A batch goes through the stages of `hmgraph.pipeline`:

1. **sample**: DGL's own seed datasets cut the batches (shuffled as DGL
   shuffles, or in an order hmgraph chooses) and the sampler runs, in the
   training thread, a background thread, or DGL's worker processes;
2. **fetch**: the cached feature's rows come through the cache, the other
   lazy features from the graph, and the batch moves to the device.

With ``prefetch > 0`` the stages run in background threads, ``prefetch``
batches ahead of training.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hmgraph import dglbatch
from hmgraph.cache.coordinated import CacheStats, FeatureCache
from hmgraph.cache.feature import Feature, TensorFeature
from hmgraph.cache.plan import (
    STAGING_ROW_SHARE_MAX,
    CachePlan,
    build_cache,
    make_plan,
    row_share,
)
from hmgraph.cache.policies import layer_aware_score
from hmgraph.cache.reuse import REUSE_LEVELS, BatchReuse
from hmgraph.inputs import as_indices, feature_sources, loader_device
from hmgraph.pipeline import Prefetcher, fetch_stage, sample_stage

log = logging.getLogger(__name__)

__all__ = ["DataLoader", "LoaderStats", "MiniBatch"]

#: Policies planned from a profiling pass with the real sampler.
PROFILED_POLICIES = ("presample", "layer-aware", "hmgraph")

#: Share of the host budget staged for window read planning by default
#: (features on the storage tier, lookahead on).
STAGING_SHARE = 0.5


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


@dataclass
class LoaderStats:
    """Counters of one loader; `reset` zeroes them all.

    Attributes
    ----------
    batches : int
        Mini-batches produced.
    rows_requested : int
        Rows of the cached feature read by all batches.
    seconds : dict of str to float
        Per stage: ``sample`` and ``fetch`` (in their threads when
        prefetching), ``wait`` (training waiting for a batch).
    cache : CacheStats, dict or None
        Hits per tier, admissions, bytes per link (per node type on
        heterographs).
    storage : object or None
        The storage tier's counters (requests and bytes read), if any.
    reuse : ReuseStats or None
        Rows reused per level, bytes saved, seconds finding duplicates.
    """

    batches: int = 0
    rows_requested: int = 0
    seconds: dict = field(default_factory=lambda: {
        "sample": 0.0, "fetch": 0.0, "wait": 0.0})
    cache: CacheStats | dict | None = None
    storage: object = None
    reuse: object = None

    def _parts(self) -> list:
        return [s for s in (self.cache, self.storage, self.reuse)
                if s is not None]

    def reset(self) -> None:
        """Zero every counter, the cache's and storage's included."""
        self.batches = 0
        self.rows_requested = 0
        self.seconds = {key: 0.0 for key in self.seconds}
        for part in self._parts():
            for stats in (part.values() if isinstance(part, dict)
                          else [part]):
                stats.reset()

    def hit_rate(self, tier: str) -> float:
        """Share of input rows served by ``tier`` (0.0 before any)."""
        caches = self.cache.values() if isinstance(self.cache, dict) \
            else [self.cache] if self.cache is not None else []
        hits = sum(c.hits.get(tier, 0) for c in caches)
        asked = sum(c.rows_requested for c in caches)
        return hits / asked if asked else 0.0

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        record = {"batches": self.batches,
                  "rows_requested": self.rows_requested,
                  "seconds": dict(self.seconds)}
        for name in ("cache", "storage", "reuse"):
            part = getattr(self, name)
            if isinstance(part, dict):
                record[name] = {k: v.as_dict() for k, v in part.items()}
            elif part is not None:
                record[name] = part.as_dict()
        return record


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
        Split the indices across the ranks of ``torch.distributed``, as
        DGL's ``DDPTensorizedDataset``: each rank a contiguous share,
        padded (unless ``drop_last``) so every rank has as many batches,
        shuffled per rank every epoch.
    ddp_seed : int
        As in DGL (which keeps it but does not draw from it); here also
        the seed of the reproducible order when ``seed`` is not given and
        `set_epoch` is called.
    batch_size, drop_last, shuffle
        As in DGL. The order is reshuffled every epoch, drawn as DGL
        draws it (NumPy's global generator), from ``generator`` if given,
        or, with ``seed``, from a generator seeded ``seed + epoch``.
    use_prefetch_thread : bool, optional
        Fetch in a background thread (at least ``prefetch=1``). Unlike
        DGL, also on the CPU, where hmgraph's fetch reads the disk.
    use_alternate_streams : bool, optional
        CUDA: copy to the device on a side stream (default on CUDA).
    pin_prefetcher : bool, optional
        CUDA: pin gathered rows before the copy (default on CUDA).
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
        (``e`` advances each pass, `set_epoch` sets it) and sample in a
        thread whose DGL generator is seeded ``seed + e``: the blocks
        repeat at any ``prefetch`` (with ``OMP_NUM_THREADS=1``; DGL draws
        per OpenMP thread).
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
        Lookahead batches given to the cache and to batch reuse
        (default: the plan's, and at least the reuse levels).
    profile_batches : int
        Batches sampled to profile row accesses for the plan.
    reuse : str
        Batch reuse: ``"none"``, ``"one-level"`` or ``"two-level"`` (rows
        of the previous batches stay on the device).
    placement : str
        How profiled rows rank for static placement: ``"frequency"`` or
        ``"layer-aware"`` (per-hop need, hops near the seeds first).
    staging : float, optional
        Share of the host budget for window read planning (default
        `STAGING_SHARE` with the storage tier and lookahead, else 0; and
        0 where a profiled batch asks for over
        `hmgraph.cache.plan.STAGING_ROW_SHARE_MAX` of the rows, since
        staging could hold little of the batches ahead). A share given
        here is used as given.
    profile : hmgraph.samplers.presample.Profile, optional
        A profile of this loader's batches, used instead of profiling.
    **kwargs
        ``torch.utils.data.DataLoader``'s, as DGL passes them on:
        ``num_workers`` (sampling in worker processes, each a contiguous
        run of batches), ``persistent_workers``, ``worker_init_fn``,
        ``prefetch_factor``, ``timeout`` (also bounds waiting on
        hmgraph's threads), ``generator``, ``multiprocessing_context``.
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
        if isinstance(batch_size, bool) or not isinstance(
                batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(
                f"batch_size must be an integer >= 1, got {batch_size!r}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if placement not in ("frequency", "layer-aware"):
            raise ValueError(f"unknown placement {placement!r}; available: "
                             f"frequency, layer-aware")
        if reuse not in REUSE_LEVELS:
            raise ValueError(f"unknown reuse {reuse!r}; available: "
                             f"{', '.join(REUSE_LEVELS)}")
        self.graph = graph
        self.graph_sampler = graph_sampler
        self.indices = as_indices(indices, graph, graph_sampler)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.use_ddp = use_ddp
        self.ddp_seed = ddp_seed
        self.use_uva = use_uva
        self.seed = seed
        self.epoch = 0
        self.placement = placement
        self.feature_name = feature_name
        self.num_workers = int(kwargs.get("num_workers", 0))
        self.device = loader_device(device, graph, use_uva)
        self._gpu_options(use_prefetch_thread, use_alternate_streams,
                          pin_prefetcher)
        if self.use_prefetch_thread:
            prefetch = max(prefetch, 1)
        self.prefetch = prefetch
        self.timeout = float(kwargs.get("timeout", 0) or 0)
        self.generator = kwargs.get("generator")
        self.other_storages: dict = {}
        # (1) DGL's own seed batches, workers and per-rank split.
        self.dataset = dglbatch.seed_dataset(
            self.indices, batch_size, drop_last, use_ddp, ddp_seed,
            shuffle, kwargs.get("persistent_workers", False))
        self._batches = self._torch_loader(kwargs)
        # (2) The cached feature, per node type.
        self._sources = feature_sources(graph, features, feature_name)
        if labels is None and len(graph.ntypes) == 1 \
                and "label" in graph.ndata:
            labels = graph.ndata["label"]
        self.labels = labels
        device_budget_bytes = self._device_budget(gpu_cache,
                                                  device_budget_bytes)
        if use_uva:
            self._pin()
        self.profile = profile
        if profile is not None and self._homogeneous_cache() and \
                profile.counts.numel() != graph.num_nodes():
            raise ValueError(
                f"profile counts {profile.counts.numel()} rows, but the "
                f"graph has {graph.num_nodes()} nodes")
        self.plans: dict[str, CachePlan] = {}
        self.caches: dict[str, FeatureCache] = {}
        self.features: dict[str, Feature] = {}
        total = sum(s.num_rows * s.row_bytes for s in self._sources.values())
        for ntype, source in self._sources.items():
            share = source.num_rows * source.row_bytes / max(total, 1)
            self._build(ntype, source, cache,
                        int(device_budget_bytes * share),
                        int(host_budget_bytes * share), window,
                        profile_batches, reuse, staging)
        homogeneous = self._homogeneous_cache()
        #: The plan, cache and feature path of the cached feature (of the
        #: only node type; dicts by node type on heterographs).
        self.plan = next(iter(self.plans.values()), None) if homogeneous \
            else self.plans
        self.cache = next(iter(self.caches.values()), None) \
            if homogeneous else self.caches
        self.feature = next(iter(self.features.values()), None) \
            if homogeneous else self.features
        # Batch reuse looks as far ahead as it reaches back.
        windows = [max(p.window, p.reuse_levels)
                   for p in self.plans.values()] or [0]
        self.window = windows[0] if window is None else window
        #: Set to a list to record each batch's unique input ids (a trace
        #: for replaying policies, e.g. Belady's, on the same accesses).
        self.trace: list | None = None
        self.stats = LoaderStats(
            cache=self._by_type(lambda n: self.caches[n].stats
                                if self.features[n] is not self._sources[n]
                                else None),
            storage=self._by_type(
                lambda n: getattr(self._sources[n], "stats", None)),
            reuse=self._by_type(
                lambda n: self.features[n].stats
                if isinstance(self.features[n], BatchReuse) else None))

    # -- construction ------------------------------------------------------

    def _gpu_options(self, use_prefetch_thread, use_alternate_streams,
                     pin_prefetcher) -> None:
        cuda = self.device.type == "cuda"
        for name, value in (("use_alternate_streams", use_alternate_streams),
                            ("pin_prefetcher", pin_prefetcher)):
            if value and not cuda:
                raise ValueError(
                    f"{name}=True needs a CUDA device; the loader's device "
                    f"is {self.device}")
        if self.use_uva and self.num_workers > 0:
            raise ValueError("num_workers must be 0 if UVA sampling is "
                             "enabled (as in DGL)")
        self.use_prefetch_thread = bool(
            cuda if use_prefetch_thread is None else use_prefetch_thread)
        self.use_alternate_streams = bool(
            cuda if use_alternate_streams is None else use_alternate_streams)
        self.pin_prefetcher = bool(
            cuda and not self.use_uva if pin_prefetcher is None
            else pin_prefetcher)

    def _torch_loader(self, kwargs: dict) -> torch.utils.data.DataLoader:
        """DGL's sampling loader: its collate runs the sampler."""
        from dgl.dataloading.dataloader import (
            CollateWrapper,
            WorkerInitWrapper,
        )

        kwargs = dict(kwargs)
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler",
                    "collate_fn", "pin_memory", "drop_last"):
            if key in kwargs:
                raise TypeError(
                    f"DataLoader got an unexpected keyword {key!r}: DGL's "
                    f"loader sets it itself")
        if self.num_workers > 0:
            self.graph.create_formats_()
        else:  # torch asserts it away without workers; hmgraph's threads
            kwargs.pop("timeout", None)  # honour it (self.timeout)
        self.worker_init_fn = WorkerInitWrapper(
            kwargs.pop("worker_init_fn", None))
        return torch.utils.data.DataLoader(
            self.dataset, batch_size=None, worker_init_fn=self.worker_init_fn,
            collate_fn=CollateWrapper(self.graph_sampler.sample, self.graph,
                                      self.use_uva, self.device),
            **kwargs)

    def _device_budget(self, gpu_cache, budget: int) -> int:
        if not gpu_cache:
            return budget
        if self.device.type != "cuda":
            raise ValueError(f"gpu_cache needs a CUDA device; the loader's "
                             f"device is {self.device}")
        extra = set(gpu_cache) - {"node"}
        names = set(gpu_cache.get("node", {}))
        if extra or names - {self.feature_name}:
            raise ValueError(
                f"gpu_cache {gpu_cache!r}: hmgraph caches one node feature "
                f"({self.feature_name!r}); give {{'node': "
                f"{{{self.feature_name!r}: rows}}}}")
        rows = int(gpu_cache["node"].get(self.feature_name, 0))
        row_bytes = max((s.row_bytes for s in self._sources.values()),
                        default=0)
        return max(budget, rows * row_bytes)

    def _pin(self) -> None:
        """UVA: the graph and in-memory rows in pinned host memory."""
        self.graph.create_formats_()
        self.graph.pin_memory_()
        for ntype, source in self._sources.items():
            if isinstance(source, TensorFeature) and \
                    source.device.type == "cpu":
                self._sources[ntype] = TensorFeature(
                    source.rows.pin_memory())

    def _homogeneous_cache(self) -> bool:
        return len(self.graph.ntypes) == 1

    def _by_type(self, get):
        """``get(ntype)`` of the only type, or a dict on heterographs."""
        values = {n: get(n) for n in self._sources}
        values = {n: v for n, v in values.items() if v is not None}
        if self._homogeneous_cache():
            return next(iter(values.values()), None)
        return values or None

    def _build(self, ntype, source, cache, device_budget_bytes,
               host_budget_bytes, window, profile_batches, reuse,
               staging) -> None:
        levels = REUSE_LEVELS[reuse]
        policy = cache.policy if isinstance(cache, CachePlan) else \
            "none" if cache is None else cache
        if (policy in PROFILED_POLICIES or levels) and \
                not self._homogeneous_cache():
            raise ValueError(
                f"cache {policy!r} (or reuse) profiles a homogeneous graph; "
                f"on heterographs use 'lru', 'clock', 'degree' or None")
        if policy in PROFILED_POLICIES or levels:
            self._profile(profile_batches)
        if staging is None:
            looks_ahead = (4 if window is None else window) > 0
            staging = STAGING_SHARE if looks_ahead and hasattr(
                source, "read_along") and self._staging_pays(source) else 0.0
        if isinstance(cache, CachePlan):
            if cache.num_rows != source.num_rows:
                raise ValueError(
                    f"plan is for {cache.num_rows} rows, features have "
                    f"{source.num_rows}")
            plan = cache
        else:
            plan = make_plan(
                policy, source.num_rows, source.row_bytes,
                device_budget_bytes, host_budget_bytes,
                counts=self._hotness(),
                trace=() if self.profile is None else self.profile.trace,
                window=4 if window is None else window,
                reuse_levels=levels, staging=staging,
                trace_covers_epoch=self.profile is not None
                and self.profile.num_batches >= len(self))
        degrees = None
        if plan.policy == "degree":
            degrees = sum((self.graph.in_degrees(etype=e) for e in
                           self.graph.canonical_etypes if e[2] == ntype),
                          torch.zeros(source.num_rows, dtype=torch.int64))
        built = build_cache(
            source, plan, self.device, counts=self._hotness(),
            degrees=degrees,
            hop_counts=None if self.profile is None
            else self.profile.hop_counts)
        self.plans[ntype] = plan
        self.caches[ntype] = built
        if cache is None and not plan.staging_rows and \
                not plan.reuse_levels:
            # Caching off: rows straight from the source, as DGL gathers.
            self.features[ntype] = source
        elif plan.reuse_levels:
            self.features[ntype] = BatchReuse(built, plan.reuse_levels,
                                              plan.reuse_rows)
        else:
            self.features[ntype] = built

    def _staging_pays(self, source) -> bool:
        """Whether window read planning can save reads on this workload:
        not where a profiled batch asks for most rows of the graph
        (`hmgraph.cache.plan.STAGING_ROW_SHARE_MAX`); said in one log
        line."""
        if self.profile is None:
            return True
        share = row_share(self.profile.trace, source.num_rows)
        if share <= STAGING_ROW_SHARE_MAX:
            return True
        log.info("window read planning off: a profiled batch asks for "
                 "%.0f%% of the rows, more than staging could hold for the "
                 "batches ahead (staging=%g forces it)", 100 * share,
                 STAGING_SHARE)
        return False

    def _hotness(self) -> torch.Tensor | None:
        """Profiled score per row for static placement."""
        if self.profile is None:
            return None
        if self.placement == "layer-aware":
            return layer_aware_score(self.profile.hop_counts)
        return self.profile.counts

    def _profile(self, profile_batches: int) -> None:
        import dgl

        from hmgraph.samplers.presample import presample

        if self.profile is not None:  # given, or already taken
            return
        if not torch.is_tensor(self.indices):
            raise ValueError("profiled cache policies need a tensor of "
                             "indices, not a dict")
        start = time.perf_counter()
        self.profile = presample(
            self.graph, self.graph_sampler, self.indices, self.batch_size,
            profile_batches, seed=(self.seed or 0) + 7919,
            shuffle=self.shuffle)
        # Profiling seeded DGL's generator; hand it back to the user's
        # seeds (NumPy's global generator, which DGL's shuffle follows).
        dgl.seed(int(np.random.randint(0, 2**31 - 1)))
        log.info("profiled %d batches in %.1f s", self.profile.num_batches,
                 time.perf_counter() - start)

    # -- DGL's loader API --------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Draw the next pass's order from a generator seeded
        ``seed + epoch`` (``ddp_seed`` where no ``seed`` was given)."""
        if self.seed is None:
            self.seed = self.ddp_seed
        self.epoch = epoch

    def attach_data(self, name: str, data) -> None:
        """Add a data other than node and edge features for prefetching
        (a `dgl.frame.LazyFeature` of ``name`` in a batch), as DGL."""
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
        from hmgraph.affinity import cpu_affinity

        with cpu_affinity(self, loader_cores, compute_cores, verbose):
            yield

    def __len__(self) -> int:
        return len(self.dataset)

    # -- iteration ---------------------------------------------------------

    def _order(self) -> None:
        """Choose this pass's order of the seeds (in DGL's dataset)."""
        ordered = hasattr(self.graph_sampler, "order_seeds")
        if not (self.shuffle or ordered):
            return
        if not ordered and self.seed is None and self.generator is None:
            self.dataset.shuffle()  # DGL: np.random.shuffle, in place
            return
        seeds = dglbatch.local_seeds(self.dataset)
        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        else:
            generator = self.generator
        if ordered:
            epoch_seed = (self.seed or 0) if not self.shuffle else int(
                torch.randint(2**31 - 1, (), generator=generator))
            order = self.graph_sampler.order_seeds(seeds.long(), epoch_seed)
            where = torch.full((int(seeds.max()) + 1,), -1,
                               dtype=torch.int64)
            where[seeds.long()] = torch.arange(seeds.numel())
            positions = where[order]
        else:
            positions = torch.randperm(seeds.numel(), generator=generator)
        dglbatch.set_order(self.dataset, positions)

    def _sample_seed(self) -> int | None:
        """Seed of DGL's generators in the sampling thread: ``seed +
        epoch`` when ``seed`` is given (and no worker processes sample).

        DGL 2.1 seeds a thread's generator with the seed plus the thread's
        number (threads are numbered as they first draw), so with ``seed``
        every pass samples in a sampling thread of its own, seeded first:
        the blocks then repeat at any ``prefetch``, 0 included.
        """
        if self.seed is None or self.num_workers:
            return None
        return self.seed + self.epoch

    def __iter__(self):
        self._order()
        # Rows alive at once: the batch training, those prefetched, the
        # one being read; buffers beyond that are not kept.
        self._each_tier("keep_buffers", self.prefetch + 2)
        sample_seed = self._sample_seed()
        self.epoch += 1
        batches = iter(self._batches)  # draws torch's base seed, as DGL
        sampled = sample_stage(batches, self._find_reads, self.graph,
                               sample_seed)
        threads = []
        if self.prefetch or sample_seed is not None:
            sampled = Prefetcher("hmgraph-sample", sampled,
                                 max(1, self.prefetch + self.window),
                                 self.timeout)
            threads.append(sampled)
        ready = fetch_stage(sampled, self._fetch, self.window, self.device,
                            self.use_alternate_streams)
        if self.prefetch:
            ready = Prefetcher("hmgraph-fetch", ready, self.prefetch,
                               self.timeout)
            threads.insert(0, ready)
        try:
            while True:
                start = time.perf_counter()
                batch = next(ready, None)
                self.stats.seconds["wait"] += time.perf_counter() - start
                if batch is None:
                    self._release_buffers()
                    release_freed_memory()
                    return
                yield self._finish(batch)
        finally:
            for thread in threads:
                thread.close()
            if not self.prefetch:
                ready.close()
                sampled.close()

    def _find_reads(self, batch) -> tuple[list, list]:
        """Split a batch's lazy features: the cached feature's, the rest.

        A block batch reads the cached feature for its first block's
        inputs whether or not the sampler asked for it (``MiniBatch.x``).
        """
        lazy = dglbatch.find_lazy(batch)
        cached = [r for r in lazy if r.kind == "node"
                  and r.name == self.feature_name
                  and r.type in self._sources]
        taken = {id(r) for r in cached}
        others = [r for r in lazy if id(r) not in taken]
        blocks = _blocks(batch)
        if blocks is not None:
            first = dglbatch.graphs(batch).index(blocks[0])
            asked = {(r.graph, r.frame) for r in cached}
            for number, ntype in enumerate(blocks[0].srctypes):
                if ntype not in self._sources or (first, number) in asked:
                    continue
                ids = blocks[0].srcnodes[ntype].data["_ID"].long()
                cached.append(dglbatch.Lazy(first, "node", number,
                                            self.feature_name,
                                            self.feature_name, ntype, ids))
        return cached, others

    def _fetch(self, sampled, future: list) -> tuple:
        """Rows of one batch: the cached feature's through the cache
        (``future``: later batches' reads by type), the rest gathered."""
        values = []
        for read in sampled.reads:
            ahead = [f[read.type] for f in future if read.type in f]
            feature = self.features[read.type]
            if feature is self._sources[read.type]:  # caching off
                rows = feature.read(read.ids).to(
                    self.device, non_blocking=self.pin_prefetcher)
            else:
                rows = feature.read(read.ids, ahead)
            values.append(rows)
        for lazy in sampled.others:
            values.append(self._gather(lazy))
        y = None
        output = sampled.batch[1] if isinstance(sampled.batch, tuple) \
            else None
        if self.labels is not None and torch.is_tensor(output) and \
                _blocks(sampled.batch) is not None:
            y = self.labels[output.long()].to(self.device,
                                              non_blocking=True)
        return values, y

    def _gather(self, lazy: dglbatch.Lazy) -> torch.Tensor:
        """A lazy feature other than the cached one, as DGL gathers it."""
        if lazy.kind == "node":
            if lazy.name == "label" and self.labels is not None and \
                    self._homogeneous_cache():
                return self.labels[lazy.ids].to(self.device)
            if lazy.name == self.feature_name and lazy.type in self._sources:
                return self._sources[lazy.type].read(lazy.ids).to(
                    self.device)
            storage = self.graph.get_node_storage(lazy.name, lazy.type)
        else:
            storage = self.graph.get_edge_storage(lazy.name, lazy.type)
        return storage.fetch(lazy.ids.to(self.graph.idtype), self.device,
                             self.pin_prefetcher)

    def _finish(self, ready):
        sampled = ready.sampled
        self.stats.batches += 1
        self.stats.rows_requested += sum(r.ids.numel() for r in sampled.reads)
        self.stats.seconds["sample"] += sampled.sample_seconds
        self.stats.seconds["fetch"] += ready.fetch_seconds
        if self.trace is not None:
            unique = sampled.unique_inputs
            self.trace.append(next(iter(unique.values()))
                              if len(unique) == 1 else unique)
        batch = self._resolve_other(
            dglbatch.to_device(sampled.batch, self.device))
        found = dglbatch.graphs(batch)
        blocks = _blocks(batch)
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
        if self._homogeneous_cache():
            x = next(iter(x.values()), None)
        return MiniBatch(batch, x if len(x) else None, ready.y) \
            if isinstance(x, dict) else MiniBatch(batch, x, ready.y)

    def _resolve_other(self, batch):
        """Top-level `LazyFeature` items, from `attach_data` storages."""
        from dgl.frame import LazyFeature
        from dgl.utils import recursive_apply

        def resolve(item):
            if isinstance(item, LazyFeature):
                return self.other_storages[item.name].fetch(
                    item.id_, self.device, self.pin_prefetcher)
            return item

        if not self.other_storages:
            return batch
        return recursive_apply(batch, resolve)

    def _release_buffers(self) -> None:
        """Batch buffers kept for reuse go at an epoch's end, through
        every tier of every cached feature (`Feature.release_buffers`)."""
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

    def close(self) -> None:
        """Release the feature sources (files, threads)."""
        for feature in self.features.values():
            feature.close()


def release_freed_memory() -> bool:
    """Hand memory freed by this process back to the system, at an epoch's
    end.

    Batches are freed by reference counting as soon as they are dropped
    (`tests/test_loader.py` checks it with the collector off), but two
    things keep memory: DGL's ctypes handles sit in small reference cycles
    that wait for the cycle collector; and glibc keeps freed tensors in
    its arenas (over 50 epochs on synth-small RSS grew by about 300 MB with
    no more bytes held, `bench/soak.py`). A collection of the young
    generations (where the last batches' cycles are), then glibc's
    ``malloc_trim``, hands both back. Not a full collection: that scans
    every object of the process (torch, DGL, the model) and took 0.25 s
    an epoch, 12 ms a batch on a 20-batch epoch, against DGL's 50 ms
    batches; older cycles go with Python's own full collections.

    Returns
    -------
    bool
        Whether memory was released (glibc's ``malloc_trim``; False where
        the C library has none).
    """
    gc.collect(1)
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    return bool(trim(0))


def _blocks(batch) -> list | None:
    """The list of blocks a block or edge-prediction batch ends with."""
    if isinstance(batch, tuple) and batch and isinstance(batch[-1], list) \
            and batch[-1] and all(getattr(b, "is_block", False)
                                  for b in batch[-1]):
        return batch[-1]
    return None

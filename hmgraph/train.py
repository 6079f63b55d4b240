"""Node classification with mini-batch neighbour sampling.

`train` runs the whole job: for each run, epochs of sampled mini-batches
through `hmgraph.DataLoader`, full-neighbour layer-wise evaluation, best
validation model selection (the test metric reported is the one at the
epoch of best validation, as OGB's leaderboard asks), an atomic checkpoint
after every epoch, and a JSON result file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import dgl
import dgl.utils
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hmgraph import datasets
from hmgraph.cache.budget import (
    HOST_RESERVE_BYTES,
    auto_host_budget,
    available_bytes,
    check_available,
    format_bytes,
    parse_budget,
)
from hmgraph.cache.coordinated import FrozenView
from hmgraph.cache.disk import disk_model
from hmgraph.cache.format import atomic_path
from hmgraph.cache.plan import metadata_bytes
from hmgraph.cache.policies import POLICIES, layer_aware_score
from hmgraph.datasets.renumbered import permuted
from hmgraph.loader import PROFILED_POLICIES, DataLoader
from hmgraph.models import build_model, layerwise_inference
from hmgraph.models.layers import add_gcn_degrees
from hmgraph.samplers.cluster import ClusterSampler, metis_clusters
from hmgraph.samplers.presample import presample
from hmgraph.samplers.renumber import (
    cluster_permutation,
    hot_first_permutation,
    renumber_graph,
)

log = logging.getLogger(__name__)

__all__ = ["LAYOUTS", "CheckpointError", "TrainConfig",
           "batch_input_bytes", "batches_in_flight", "check_model_memory",
           "evaluate", "loader_only_epoch", "make_loader", "make_sampler",
           "memory_promise", "peak_rss_bytes", "prefetch_depth", "prepare",
           "resolve_eval", "resolve_layout", "train", "working_set_bytes"]

# Settings a checkpoint must share with the run that resumes it.
_CHECKPOINT_KEYS = (
    "dataset", "model", "fanouts", "batch_size", "hidden", "layers",
    "dropout", "input_dropout", "attn_dropout", "lr", "weight_decay",
    "num_heads", "seed", "sampler",
    "clusters", "locality", "group_size", "renumber", "layout",
)

#: Orders of the feature file's rows (see `TrainConfig.layout`).
LAYOUTS = ("auto", "file", "hot-first")

# As `DataLoader._profile`: the layout is planned from the same batches.
_PROFILE_SEED_OFFSET = 7919


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed; the message says which setting."""


#: Copies of every parameter while training with Adam: the weights, their
#: gradients and Adam's two moment estimates.
_TRAINING_COPIES = 4


def check_model_memory(build, device, sizes: dict) -> int:
    """Refuse a model whose training state does not fit in ``device``'s
    free memory, before any of it is allocated.

    The model is built on PyTorch's ``meta`` device (shapes, no memory)
    to count its parameters; training holds `_TRAINING_COPIES` of them
    (weights, gradients, Adam's two moments) besides its buffers.

    Parameters
    ----------
    build : callable
        ``() -> torch.nn.Module``, the model as training builds it.
    device : torch.device or str
        Where it would train (``cpu``: host memory).
    sizes : dict of str to int
        The flags that size the model and their values, named in the
        error, e.g. ``{"--hidden": 100000000}``.

    Returns
    -------
    int
        Bytes of training state (0 where the model cannot be built on
        the meta device, and so is not checked).

    Raises
    ------
    ValueError
        ``--hidden 100000000: training the model needs 320000.4 TB
        (weights, gradients, Adam state), more than the 20.1 GB free on
        cpu; use a smaller --hidden``.
    """
    try:
        with torch.device("meta"):
            model = build()
    except (NotImplementedError, RuntimeError):  # an op with no meta kernel
        return 0
    need = sum(_TRAINING_COPIES * p.numel() * p.element_size()
               for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    free = available_bytes(device)
    if need > free:
        given = " ".join(f"{flag} {value}" for flag, value in sizes.items())
        raise ValueError(
            f"{given}: training the model needs {format_bytes(need)} "
            f"(weights, gradients, Adam state), more than the "
            f"{format_bytes(free)} free on {torch.device(device)}; use a "
            f"smaller {' or '.join(sizes)}")
    return need


@dataclass
class TrainConfig:
    """Settings of one training job (all JSON-serialisable).

    Attributes
    ----------
    fanouts : list of int
        Neighbours sampled per layer, first layer first; -1 takes all.
        Its length is the number of GNN layers.
    input_dropout : float
        Dropout on the input features (Kipf & Welling's GCN and GAT use
        the hidden rate on Planetoid).
    attn_dropout : float
        Dropout on GAT's attention weights.
    eval_every : int
        Evaluate (full-neighbour inference on all nodes) every this many
        epochs and after the last one.
    cache : str or None
        Cache policy (``hmgraph``, ``presample``, ...); None: no cache.
    device_budget, host_budget : str
        ``"512MB"``, ``"2GB"`` or a share of the feature bytes (``"5%"``).
        ``host_budget="auto"`` (the default) sizes the host tier from the
        free memory after the graph, less the run's working set and a
        2 GiB reserve, with features on disk; 0 with features in memory.
    eval : str
        ``"layerwise"``: full-neighbour layer-wise inference over every
        node (rows in node-id order, chunk by chunk; on disk through the
        cache without changing it). ``"sampled"``: the training fanouts
        over the validation and test nodes only, as DGL's out-of-core
        examples evaluate; the train metric is then the epoch's running
        accuracy. ``"auto"``: layer-wise, unless features are on disk and
        the disk model prices its storage reads over
        `LAYERWISE_READ_LIMIT_SECONDS`
        (see `resolve_eval`).
    features_on : str
        ``"memory"`` (rows in RAM) or ``"disk"`` (the feature file, read
        with O_DIRECT by the storage tier).
    prefetch : int or None
        Batches fetched ahead in a thread. None: 1 with features on disk
        (three batches of rows in flight: one training, one fetched, one
        being fetched, the bound the memory promise counts), 2 in memory.
    sampler : str
        ``"neighbor"`` (DGL's) or ``"cluster"`` (`ClusterSampler`).
    clusters : int
        METIS clusters for the cluster sampler and renumbering; 0 picks
        one per mini-batch of the train split.
    renumber : bool
        Renumber nodes so clusters are contiguous (graph and feature file
        rewritten once, cached); evaluation stays in original ids.
    layout : str
        Order of the rows in the feature file. ``"file"``: as stored.
        ``"hot-first"``: nodes renumbered hottest first by a profiling pass
        of the training loader's own batches (inside each cluster with
        ``renumber``), so the rows a static cache holds fill whole pages
        and storage misses fall on cold pages; the feature file is
        rewritten once and cached beside it, under a folder named by the
        order (``renumbered-hot-first-<digest>/``): another order (another
        seed or profile) gets a folder of its own, so runs sharing a root
        never rewrite each other's (the profile samples on one thread, so
        the same settings repeat it and reuse the folder).
        ``"auto"``: hot-first with features on disk and a profiled cache
        policy (``presample``, ``layer-aware``, ``hmgraph``), else file
        (see `resolve_layout`).
    loader_only : bool
        After training, time one more epoch of the loader alone
        (sampling, fetch and transfer, no model: what a GPU trainer waits
        for), recorded as ``result["loader_only"]``; it changes nothing
        the training measured.
    """

    dataset: str = "synth-small"
    root: str = "data"
    model: str = "sage"
    fanouts: list = field(default_factory=lambda: [15, 10, 5])
    batch_size: int = 1024
    hidden: int = 256
    dropout: float = 0.5
    input_dropout: float = 0.0
    attn_dropout: float = 0.0
    lr: float = 0.003
    weight_decay: float = 0.0
    num_heads: int = 4
    epochs: int = 5
    runs: int = 1
    seed: int = 0
    device: str = "cpu"
    eval_every: int = 1
    eval_batch_size: int = 8192
    out: str = "runs/latest"
    cache: str | None = None
    device_budget: str = "0"
    host_budget: str = "auto"
    features_on: str = "memory"
    eval: str = "auto"
    prefetch: int | None = None
    window: int = 4
    profile_batches: int = 32
    reuse: str = "none"
    placement: str = "frequency"
    sampler: str = "neighbor"
    clusters: int = 0
    locality: float = 1.0
    group_size: int = 4
    renumber: bool = False
    layout: str = "auto"
    resume: bool = False
    verify: bool = True
    progress: bool = True
    loader_only: bool = False

    @property
    def layers(self) -> int:
        """Number of GNN layers (one per fanout)."""
        return len(self.fanouts)

    def as_dict(self) -> dict:
        """The settings as a plain dict."""
        return dataclasses.asdict(self)


def train(config: TrainConfig, dataset=None) -> dict:
    """Train and evaluate; write ``result.json`` under ``config.out``.

    Parameters
    ----------
    config : TrainConfig
        The settings.
    dataset : hmgraph.datasets.NodeDataset, optional
        Already loaded data; loaded from ``config`` when omitted.

    Returns
    -------
    dict
        The result: ``config``, ``dataset``, ``metric``, ``layout`` (the
        resolved name, its ``seconds``, whether the rewritten file was
        ``reused``, the feature file ``path``), ``runs`` (per run:
        per-epoch loss, metrics and seconds; best epoch; test metric at best
        validation), ``summary`` (mean and std over runs) and ``path``.
    """
    if config.eval not in ("auto", "layerwise", "sampled"):
        raise ValueError(f"eval must be auto, layerwise or sampled, got "
                         f"{config.eval!r}")
    resolve_layout(config)  # a bad layout fails before any loading
    for name in ("device_budget", "host_budget"):  # and a bad budget
        text = getattr(config, name)
        if text != "auto":
            try:
                parse_budget(text, 1)
            except ValueError as err:
                raise ValueError(f"{name.replace('_', ' ')}: {err}") from None
    if dataset is None:
        dataset = datasets.load(config.dataset, config.root, config.verify,
                                features_on=config.features_on,
                                progress=config.progress)
    check_model_memory(lambda: _build_model(config, dataset), config.device,
                       _model_sizes(config))
    out = Path(config.out)
    checkpoint_path = out / "checkpoint.pt"
    state = _load_checkpoint(checkpoint_path, config) if config.resume \
        else None
    completed = state["completed"] if state else []
    device = torch.device(config.device)
    dataset, sampler, layout, profile = prepare(config, dataset)
    if config.model == "gcn":
        # The graph's degrees, for every block's GCN normalisation.
        add_gcn_degrees(dataset.graph)
    log.info("%s", dataset)
    loader, memory = make_loader(config, dataset, sampler, device, profile)
    try:  # once every setting fitted
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(err.errno, f"--out {out}: cannot make the folder: "
                      f"{err.strerror}") from None
    eval_mode = resolve_eval(config, dataset, loader)
    log.info("evaluation: %s", eval_mode)
    metric = dataset.evaluator.eval_metric
    try:
        for run in range(len(completed), config.runs):
            record = _train_run(config, dataset, loader, run, state, device,
                                checkpoint_path, completed, eval_mode)
            completed.append(record)
            state = None
        loader_only = loader_only_epoch(config, loader) \
            if config.loader_only else None
    finally:
        loader.close()
    peak = peak_rss_bytes()
    result = {
        "config": config.as_dict(),
        "dataset": repr(dataset),
        "metric": metric,
        "plan": loader.plan.as_dict(),
        "eval": eval_mode,
        "layout": layout,
        "memory": dict(memory, peak_rss_bytes=peak,
                       within_promise=peak <= memory["promise_bytes"]),
        "runs": completed,
        "summary": summarize(completed),
    }
    if loader_only is not None:
        result["loader_only"] = loader_only
    result_path = out / "result.json"
    with atomic_path(result_path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    result["path"] = str(result_path)
    return result


def resolve_layout(config) -> str:
    """``file`` or ``hot-first``, resolving ``auto``.

    ``auto`` is hot-first when features are on disk and the cache policy
    is planned from a profile (``presample``, ``layer-aware``,
    ``hmgraph``): its static tiers then hold whole blocks of hot rows and
    misses cluster in cold blocks. Measured with window read planning
    (``bench/results/cache_policies*.md``): on synth-papers (sparse) it
    cut storage requests 30x and the epoch from 43.2 s to 28.8 s at the
    same bytes; on synth-products and synth-igb (dense) bytes and epoch
    time stayed within 2-3 %. In memory, or with a policy that is not
    profiled, the order of the rows buys nothing and costs a rewrite.
    """
    if config.layout not in LAYOUTS:
        raise ValueError(f"unknown layout {config.layout!r}; available: "
                         f"{', '.join(LAYOUTS)}")
    if config.layout != "auto":
        return config.layout
    return "hot-first" if config.features_on == "disk" and \
        config.cache in PROFILED_POLICIES else "file"


def make_sampler(config, dataset):
    """The sampler ``config`` asks for, and the dataset in the ids it uses.

    What `train` prepares before its loader, without the loader: METIS
    clusters for the cluster sampler or ``renumber``, the dataset
    renumbered by cluster and/or rewritten hot-first as `resolve_layout`
    decides, and the sampler over the final graph.

    Parameters
    ----------
    config : TrainConfig
        ``sampler``, ``fanouts``, ``batch_size``, ``clusters``,
        ``locality``, ``group_size``, ``renumber``, ``layout`` and what the
        layout depends on are read.
    dataset : hmgraph.datasets.NodeDataset
        As `hmgraph.datasets.load` returns it.

    Returns
    -------
    dataset : hmgraph.datasets.NodeDataset
        ``dataset`` itself, or a renumbered copy (its feature file
        rewritten once and reused).
    sampler : dgl.dataloading.Sampler
        DGL's ``NeighborSampler`` (fanouts 0 for an MLP) or
        `hmgraph.samplers.cluster.ClusterSampler`.

    Raises
    ------
    ValueError
        An unknown sampler or layout.
    """
    dataset, sampler, _, _ = prepare(config, dataset)
    return dataset, sampler


def prepare(config, dataset):
    """The dataset in the ids training uses, its sampler, a layout record
    and, for hot-first, the profile it was ordered by (in the final ids,
    for the loader to plan from instead of profiling again; else None).

    (1) METIS clusters for the cluster sampler or ``renumber``; (2) with
    layout ``file``, the dataset renumbered by cluster if asked; (3) with
    ``hot-first``, a profile of the loader's batches (on the graph
    renumbered by cluster if asked) and one rewrite of the feature file in
    the final order, cluster renumbering and hot-first composed.
    """
    if config.sampler not in ("neighbor", "cluster"):
        raise ValueError(f"unknown sampler {config.sampler!r}; available: "
                         f"neighbor, cluster")
    layout = resolve_layout(config)
    # (1) Clusters.
    clusters, tag = None, None
    if config.sampler == "cluster" or config.renumber:
        count = config.clusters or max(1, math.ceil(
            dataset.split["train"].numel() / config.batch_size))
        clusters = metis_clusters(
            dataset.graph, count,
            Path(dataset.feature_path).parent / f"metis-{count}.npy")
        tag = f"metis-{count}" if config.renumber else None
    # (2) The file's order, clusters as id ranges if asked.
    start = time.perf_counter()
    if layout == "file":
        if tag is not None:
            first, _ = cluster_permutation(clusters)
            dataset = permuted(dataset, first, tag, config.verify)
            clusters = clusters[first]
        record = {"name": layout, "seconds": time.perf_counter() - start,
                  "reused": bool(dataset.info.get("reused", False)),
                  "path": str(dataset.feature_path)}
        return dataset, _build_sampler(config, dataset.graph, clusters), \
            record, None
    # (3) Hot first: profile the batches the loader will profile, in the
    # ids it will see them in (only the graph renumbered by cluster: the
    # rows are rewritten once, in the final order).
    graph, seeds, first = dataset.graph, dataset.split["train"], None
    if tag is not None:
        first, inverse = cluster_permutation(clusters)
        graph = renumber_graph(graph, first, inverse)
        seeds, clusters = inverse[seeds], clusters[first]
    sampler = _build_sampler(config, graph, clusters)
    # DGL samples with one generator per OpenMP thread: on one thread the
    # profile repeats exactly, so a rerun finds the same order and reuses
    # the rewritten file.
    threads = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        profile = presample(graph, sampler, seeds, config.batch_size,
                            config.profile_batches,
                            seed=config.seed + _PROFILE_SEED_OFFSET,
                            shuffle=True)
    finally:
        dgl.utils.set_num_threads(threads)
    if getattr(sampler, "prob", None) is not None:
        graph.edata.pop(sampler.prob)  # the profiling sampler's weights
    del graph, sampler  # at most two graphs alive while renumbering
    hot, _ = hot_first_permutation(
        _hotness(config, profile), clusters if tag is not None else None)
    perm = hot if first is None else first[hot]
    dataset = permuted(dataset, perm, "hot-first" if tag is None
                       else f"{tag}-hot-first", config.verify)
    if clusters is not None:
        clusters = clusters[hot]
    record = {"name": layout, "seconds": time.perf_counter() - start,
              "reused": bool(dataset.info["reused"]),
              "path": str(dataset.feature_path),
              "profile_batches": profile.num_batches}
    log.info("layout: hot-first from %d profiled batches in %.1f s (%s %s)",
             profile.num_batches, record["seconds"],
             "reused" if record["reused"] else "wrote",
             dataset.feature_path)
    return dataset, _build_sampler(config, dataset.graph, clusters), \
        record, profile.renamed(hot)


def _hotness(config, profile) -> torch.Tensor:
    """Profiled score per row, as the loader ranks rows for its cache."""
    if config.cache == "layer-aware" or config.placement == "layer-aware":
        return layer_aware_score(profile.hop_counts)
    return profile.counts


def _build_sampler(config, graph, clusters):
    """The sampler asked for over ``graph`` (clusters in its ids)."""
    if config.model == "mlp":
        # An MLP reads no neighbours: empty blocks of the same depth
        # (DGL 2.1's fused sampler drops the source nodes at fanout 0).
        return dgl.dataloading.NeighborSampler([0] * config.layers,
                                               fused=False)
    if config.sampler == "cluster":
        return ClusterSampler(graph, config.fanouts, clusters,
                              locality=config.locality,
                              group_size=config.group_size)
    return dgl.dataloading.NeighborSampler(config.fanouts)


def make_loader(config, dataset, sampler, device, profile=None):
    """The training loader with the cache and feature source asked for.

    ``profile`` (a `hmgraph.samplers.presample.Profile` of the loader's own
    batches) spares the loader its profiling pass.

    Returns the loader and a record of the memory it was sized with:
    graph bytes, feature bytes, working set and the budgets in bytes.
    """
    if config.features_on not in ("memory", "disk"):
        raise ValueError(f"features_on must be 'memory' or 'disk', got "
                         f"{config.features_on!r}")
    disk = config.features_on == "disk"
    feature_bytes = dataset.feature_bytes
    device_budget = parse_budget(config.device_budget, feature_bytes)
    check_available("device", device_budget, device)
    batch_bytes = batch_input_bytes(config, dataset, sampler)
    working = working_set_bytes(config, dataset, sampler, device_budget,
                                device, batch_bytes)
    if str(config.host_budget).strip().lower() == "auto":
        # Up to every row with its bookkeeping: the file read once.
        policy = config.cache if config.cache in POLICIES else "none"
        whole = feature_bytes + metadata_bytes(
            policy, dataset.num_nodes, 0, dataset.num_nodes)
        host_budget = auto_host_budget(whole, working) if disk else 0
    else:
        host_budget = parse_budget(config.host_budget, feature_bytes)
        free = available_bytes("cpu")
        if disk and host_budget + working > free:
            raise ValueError(
                f"host budget {format_bytes(host_budget)} plus the run's "
                f"working set {format_bytes(working)} exceeds the "
                f"{format_bytes(free)} available; use at most "
                f"{format_bytes(max(0, free - working))} or --host-budget "
                f"auto"
            )
        check_available("host", host_budget, "cpu")
    memory = {"graph_bytes": dataset.graph_bytes,
              "feature_bytes": feature_bytes, "working_set_bytes": working,
              "device_budget_bytes": device_budget,
              "host_budget_bytes": host_budget,
              "batch_input_bytes": batch_bytes,
              "batches_in_flight": batches_in_flight(config)}
    memory["promise_bytes"] = memory_promise(memory, config.features_on)
    log.info("memory: graph %s, features %s (%s), working set %s, device "
             "budget %s, host budget %s", format_bytes(memory["graph_bytes"]),
             format_bytes(feature_bytes), config.features_on,
             format_bytes(working), format_bytes(device_budget),
             format_bytes(host_budget))
    features = dataset.feature_path if disk else dataset.features
    loader = DataLoader(
        dataset.graph, dataset.split["train"], sampler, features=features,
        labels=dataset.labels, batch_size=config.batch_size, shuffle=True,
        device=device, seed=config.seed, cache=config.cache,
        device_budget_bytes=device_budget, host_budget_bytes=host_budget,
        prefetch=prefetch_depth(config), window=config.window,
        profile_batches=config.profile_batches, reuse=config.reuse,
        placement=config.placement, profile=profile,
    )
    return loader, memory


_WORKING_SET_BATCHES = 4
# Per-node state of profile and policies (hop counts, trace, slot tables).
_BYTES_PER_NODE = 64


def prefetch_depth(config) -> int:
    """Batches fetched ahead: ``config.prefetch``, or by default 1 with
    features on disk (the rows of three batches in flight) and 2 in
    memory."""
    if config.prefetch is not None:
        return config.prefetch
    return 1 if config.features_on == "disk" else 2


def batches_in_flight(config) -> int:
    """Batches whose input rows may be alive at once: those prefetched,
    the one being fetched and the one training (the loader keeps that
    many buffers, `hmgraph.cache.feature.Feature.keep_buffers`)."""
    return prefetch_depth(config) + 2


def batch_input_bytes(config, dataset, sampler) -> int:
    """Bytes of input rows of the largest of a few sampled batches."""
    seeds = dataset.split["train"]
    generator = torch.Generator().manual_seed(config.seed)
    order = seeds[torch.randperm(seeds.numel(), generator=generator)]
    most = 0
    for index in range(_WORKING_SET_BATCHES):
        batch = order[index * config.batch_size:
                      (index + 1) * config.batch_size]
        if batch.numel() == 0:
            break
        input_nodes, _, _ = sampler.sample(dataset.graph, batch)
        most = max(most, input_nodes.numel())
    return most * dataset.manifest.row_bytes


def working_set_bytes(config, dataset, sampler, device_budget: int,
                      device, batch_bytes: int | None = None) -> int:
    """Host memory a run needs besides the graph, the host tier and the
    2 GiB reserve (`hmgraph.cache.budget.HOST_RESERVE_BYTES`, which the
    model's step and the libraries live in).

    The rows of the batches in flight (`batch_input_bytes` times
    `batches_in_flight`: reused buffers, one per batch), 64 bytes per node
    of profile and policy state, with ``eval="layerwise"`` its buffers
    (`layerwise_buffer_bytes`; ``auto`` checks them when it resolves) and,
    on a CPU device, the device tier. ``batch_bytes``: the batch's input
    bytes where already known.
    """
    if batch_bytes is None:
        batch_bytes = batch_input_bytes(config, dataset, sampler)
    total = batch_bytes * batches_in_flight(config)
    total += _BYTES_PER_NODE * dataset.num_nodes
    if config.eval == "layerwise":
        total += layerwise_buffer_bytes(config, dataset)
    if torch.device(device).type == "cpu":
        total += device_budget
    return int(total)


def memory_promise(memory: dict, features_on: str) -> int:
    """The peak resident memory a run promises: graph + budgets (+ the
    rows, in memory) + the batches in flight + the 2 GiB reserve."""
    return int(memory["graph_bytes"] + memory["device_budget_bytes"]
               + memory["host_budget_bytes"]
               + (memory["feature_bytes"] if features_on == "memory" else 0)
               + memory["batch_input_bytes"] * memory["batches_in_flight"]
               + HOST_RESERVE_BYTES)


def layerwise_buffer_bytes(config, dataset) -> int:
    """Host memory of layer-wise inference: two layers' outputs per node."""
    width = max(config.hidden * config.num_heads, dataset.num_classes)
    return 2 * dataset.num_nodes * width * 4


#: ``eval="auto"`` picks layer-wise inference while the disk model prices
#: its estimated storage reads under this many seconds.
LAYERWISE_READ_LIMIT_SECONDS = 60.0


def layerwise_read_seconds(config, dataset, loader) -> float:
    """The disk model's seconds for layer-wise inference's storage reads.

    Layer-wise inference reads each chunk's input rows that the cache
    does not hold; a chunk's inputs (the chunk and its neighbours, random
    ids) spread over nearly every page, so each chunk reads about every
    uncached byte, in requests that each cover a break-even gap
    (`hmgraph.cache.disk.DiskModel.gap_bytes`) or a row. Priced with the
    model of the feature file's disk at the depth the storage tier keeps
    in flight.
    """
    held = loader.plan.device_rows + loader.plan.host_rows
    row_bytes = dataset.manifest.row_bytes
    uncached = max(0, dataset.num_nodes - held) * row_bytes
    chunks = math.ceil(dataset.num_nodes / config.eval_batch_size)
    model = disk_model(dataset.feature_path)
    requests = uncached / max(model.gap_bytes, row_bytes)
    return chunks * model.seconds(requests, uncached)


def resolve_eval(config, dataset, loader) -> str:
    """``layerwise`` or ``sampled``, resolving ``auto``.

    With features on disk, ``auto`` keeps layer-wise while its storage
    reads (`layerwise_read_seconds`) stay under
    `LAYERWISE_READ_LIMIT_SECONDS` and its buffers
    (`layerwise_buffer_bytes`) fit in free memory.
    """
    if config.eval != "auto":
        return config.eval
    if config.features_on == "memory":
        return "layerwise"
    fits = layerwise_buffer_bytes(config, dataset) + HOST_RESERVE_BYTES <= \
        available_bytes("cpu")
    return "layerwise" if fits and layerwise_read_seconds(
        config, dataset, loader) <= LAYERWISE_READ_LIMIT_SECONDS \
        else "sampled"


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def evaluate(config, dataset, model, loader, device, mode: str) -> dict:
    """Metric per split: ``valid`` and ``test`` (and ``train`` layer-wise).

    Layer-wise inference reads rows in node-id order, chunk by chunk: from
    memory, or through a `FrozenView` of the training cache (hits from its
    tiers, misses from storage, nothing admitted). Sampled inference runs
    DGL's ``NeighborSampler`` with the training fanouts over each split
    through the same view.
    """
    view = FrozenView(loader.cache)
    if mode == "layerwise":
        features = dataset.features if config.features_on == "memory" \
            else view
        logits = layerwise_inference(
            model, dataset.graph, features, device,
            batch_size=config.eval_batch_size,
        )
        return {split: dataset.evaluate(logits, split)
                for split in ("train", "valid", "test")}
    fanouts = [0] * config.layers if config.model == "mlp" \
        else config.fanouts
    sampler = dgl.dataloading.NeighborSampler(fanouts, fused=False) \
        if config.model == "mlp" else dgl.dataloading.NeighborSampler(fanouts)
    scores = {}
    was_training = model.training
    model.eval()
    try:
        for split in ("valid", "test"):
            ids = dataset.split[split]
            split_loader = DataLoader(
                dataset.graph, ids, sampler, features=view,
                labels=dataset.labels, batch_size=config.batch_size,
                device=device, seed=config.seed,
                prefetch=prefetch_depth(config),
            )
            parts = []
            dgl.seed(config.seed)  # the same sampled neighbours every time
            with torch.no_grad():
                for batch in split_loader:
                    parts.append(model(batch.blocks, batch.x).cpu())
            split_loader.close()
            scores[split] = dataset.score(torch.cat(parts), split)
    finally:
        model.train(was_training)
    return scores


def _train_run(config, dataset, loader, run, state, device, checkpoint_path,
               completed, eval_mode) -> dict:
    seed = config.seed + 1000 * run
    torch.manual_seed(seed)
    model = _build_model(config, dataset).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    record = {"run": run, "epochs": [], "best_epoch": -1,
              "best_valid": -math.inf, "test_at_best_valid": 0.0}
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        record = state["record"]
    for epoch in range(len(record["epochs"]), config.epochs):
        entry = _train_epoch(config, model, optimizer, loader, run, epoch)
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs:
            start = time.perf_counter()
            scores = evaluate(config, dataset, model, loader, device,
                              eval_mode)
            entry.update({"train": entry["train_running"], **scores})
            entry["seconds"]["eval"] = time.perf_counter() - start
            if entry["valid"] > record["best_valid"]:
                record.update(best_epoch=epoch, best_valid=entry["valid"],
                              test_at_best_valid=entry["test"])
            log.info(
                "run %d epoch %d: loss %.4f train %.4f valid %.4f test %.4f",
                run, epoch, entry["loss"], entry["train"], entry["valid"],
                entry["test"],
            )
        record["epochs"].append(entry)
        _save_checkpoint(checkpoint_path, config, model, optimizer, record,
                         completed)
    return record


def _build_model(config, dataset) -> torch.nn.Module:
    return build_model(
        config.model, dataset.feat_dim, config.hidden, dataset.num_classes,
        num_layers=config.layers, dropout=config.dropout,
        num_heads=config.num_heads, input_dropout=config.input_dropout,
        attn_dropout=config.attn_dropout,
    )


def _model_sizes(config) -> dict:
    """The flags that size the model, for `check_model_memory`."""
    sizes = {"--hidden": config.hidden}
    if config.model == "gat":
        sizes["--num-heads"] = config.num_heads
    return sizes


def loader_only_epoch(config, loader) -> dict:
    """One epoch of ``loader`` alone, seeded as the first training epoch:
    ``batches``, ``epoch_seconds``, ``seconds_per_batch``, the loader's
    stage ``seconds`` and ``cpu_seconds`` of the process."""
    dgl.seed(config.seed)
    loader.set_epoch(0)
    loader.stats.reset()
    batches = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in loader:
        batches += 1
    epoch = time.perf_counter() - start
    return {"batches": batches, "epoch_seconds": epoch,
            "seconds_per_batch": epoch / max(batches, 1),
            "cpu_seconds": time.process_time() - cpu,
            "seconds": dict(loader.stats.seconds)}


def _train_epoch(config, model, optimizer, loader, run, epoch) -> dict:
    torch.manual_seed(config.seed + 1000 * run + epoch)
    dgl.seed(config.seed + 1000 * run + epoch)  # the sampled neighbours
    loader.set_epoch(epoch + 1000 * run)
    loader.stats.reset()
    model.train()
    total_loss, total_seeds, train_seconds = 0.0, 0, 0.0
    total_correct = 0
    start = time.perf_counter()
    batches = tqdm(loader, desc=f"run {run} epoch {epoch}", leave=False,
                   disable=not config.progress)
    for batch in batches:
        step = time.perf_counter()
        logits = model(batch.blocks, batch.x)
        loss = F.cross_entropy(logits, batch.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_seconds += time.perf_counter() - step
        n = batch.y.numel()
        total_loss += float(loss) * n
        total_correct += int((logits.argmax(dim=-1) == batch.y).sum())
        total_seeds += n
        batches.set_postfix(loss=f"{float(loss):.3f}")
    seconds = dict(loader.stats.seconds)
    seconds["train"] = train_seconds
    seconds["epoch"] = time.perf_counter() - start
    stats = loader.stats.as_dict()
    if loader.plan.policy != "none" or loader.stats.storage is not None \
            or loader.stats.reuse is not None:
        log.info("run %d epoch %d: %s", run, epoch, describe_io(stats))
    return {"epoch": epoch, "loss": total_loss / max(total_seeds, 1),
            "train_running": total_correct / max(total_seeds, 1),
            "seconds": seconds, "loader": stats}


def describe_io(stats: dict) -> str:
    """One line of cache hits and I/O from `LoaderStats.as_dict`."""
    cache = stats.get("cache", {})
    rates = ", ".join(f"{tier} {rate:.1%}" for tier, rate in
                      cache.get("hit_rate", {}).items())
    text = f"rows from {rates}"
    link = cache.get("bytes", {}).get("host->device", 0)
    text += f"; host->device {format_bytes(link)}"
    reuse = stats.get("reuse")
    if reuse:
        text += (f"; reused {reuse['reuse_rate']:.1%} of rows, "
                 f"{format_bytes(reuse['bytes_saved'])} saved")
    storage = stats.get("storage")
    if storage:
        text += (f"; storage {storage['io_requests']} requests, "
                 f"{format_bytes(storage['bytes_read'])} "
                 f"(amplification {storage['amplification']:.2f}), "
                 f"{storage['seconds']:.1f} s (disk model "
                 f"{storage['model_seconds']:.1f} s)")
    return text


def summarize(records: list[dict]) -> dict:
    """Mean and standard deviation over runs, as OGB's leaderboard reports.

    Returns
    -------
    dict
        ``valid_mean``, ``valid_std``, ``test_mean``, ``test_std`` of the
        best-validation epoch of every run; 0.0 for an empty list.
    """
    if not records:
        return {"valid_mean": 0.0, "valid_std": 0.0,
                "test_mean": 0.0, "test_std": 0.0, "runs": 0}
    valid = torch.tensor([r["best_valid"] for r in records],
                         dtype=torch.float64)
    test = torch.tensor([r["test_at_best_valid"] for r in records],
                        dtype=torch.float64)
    std = (0.0, 0.0) if len(records) == 1 else (float(valid.std()),
                                                float(test.std()))
    return {"valid_mean": float(valid.mean()), "valid_std": std[0],
            "test_mean": float(test.mean()), "test_std": std[1],
            "runs": len(records)}


def _save_checkpoint(path, config, model, optimizer, record, completed):
    state = {
        "config": {k: getattr(config, k) for k in _CHECKPOINT_KEYS},
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "record": record,
        "completed": completed,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def check_saved_settings(what: str, saved: dict, config, keys,
                         defaults=None) -> None:
    """Refuse saved work whose settings differ from this run's.

    Parameters
    ----------
    what : str
        What was saved, for the message, e.g. ``"checkpoint out/ckpt.pt"``.
    saved : dict
        The settings the saved work was made with.
    config : object
        This run's settings, read by attribute.
    keys : sequence of str
        The settings that must agree.
    defaults : object, optional
        Values for keys ``saved`` lacks (settings newer than the file);
        without it a missing key reads as None.

    Raises
    ------
    CheckpointError
        Naming the first key that differs, both values, and the way out.
    """
    for key in keys:
        value = saved.get(key, getattr(defaults, key, None))
        if value != getattr(config, key):
            raise CheckpointError(
                f"{what} was written with {key}={value!r}, but this run has "
                f"{key}={getattr(config, key)!r}; use the same setting or "
                f"another --out")


def _load_checkpoint(path: Path, config: TrainConfig):
    if not path.is_file():
        log.info("no checkpoint at %s; starting afresh", path)
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}); "
            f"delete it or train without --resume"
        ) from None
    # A setting newer than the checkpoint: it ran with the default.
    check_saved_settings(f"checkpoint {path}", state.get("config", {}),
                         config, _CHECKPOINT_KEYS, defaults=TrainConfig())
    done = len(state["record"]["epochs"]) if state.get("record") else 0
    done = max([done] + [len(r["epochs"]) for r in state["completed"]])
    if done > config.epochs or len(state["completed"]) > config.runs:
        raise CheckpointError(
            f"checkpoint {path} already holds {done} epoch(s) and "
            f"{len(state['completed'])} finished run(s), more than --epochs "
            f"{config.epochs} --runs {config.runs}: raise them or use "
            f"another --out")
    return state

"""Settings of node classification, one dataclass per concern.

`TrainConfig` (``hmgraph train``'s settings, all JSON-serialisable) is
their union; the flags of ``hmgraph train``, ``train-dist``, ``bench``,
``analyze`` and ``partition`` are derived from the same fields
(`hmgraph.settings.fields.add_arguments`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hmgraph.args import (
    device_name,
    fraction,
    non_negative_float,
    non_negative_int,
    parse_fanouts,
    positive_float,
    positive_int,
    unit_interval,
)
from hmgraph.settings.fields import setting

__all__ = ["SHARE_BUDGETS", "TRAIN_CONCERNS", "WORKLOAD", "CacheSettings",
           "ModelSettings", "RunSettings", "SamplingSettings",
           "StorageSettings", "TrainConfig", "cache_policies",
           "node_datasets", "node_models"]


def node_datasets() -> str:
    """The help of ``--dataset``: the known node datasets."""
    # Lazy: the datasets' registry loads torch; the parser is built first.
    from hmgraph.datasets import known_datasets

    return f"one of: {', '.join(known_datasets())}"


def node_models() -> list[str]:
    """The node classification models, sorted."""
    # Lazy: the models' registry loads DGL (4 s).
    from hmgraph.models import MODELS

    return sorted(MODELS)


def cache_policies() -> list[str]:
    """The cache policies a run may ask for (not Belady's oracle)."""
    # Lazy: the policies' registry loads torch.
    from hmgraph.cache.policies import POLICIES

    return [name for name in POLICIES if name != "belady"]


@dataclass
class RunSettings:
    """The job: data, optimisation, evaluation, output.

    Attributes
    ----------
    eval_every : int
        Evaluate (full-neighbour inference on all nodes) every this many
        epochs and after the last one.
    eval : str
        ``"layerwise"``: full-neighbour layer-wise inference over every
        node (rows in node-id order, chunk by chunk; on disk through the
        cache without changing it). ``"sampled"``: the training fanouts
        over the validation and test nodes only, as DGL's out-of-core
        examples evaluate; the train metric is then the epoch's running
        accuracy. ``"auto"``: layer-wise, unless features are on disk and
        the disk model prices its storage reads over
        `hmgraph.evaluation.LAYERWISE_READ_LIMIT_SECONDS` (see
        `hmgraph.evaluation.resolve_eval`).
    loader_only : bool
        After training, time one more epoch of the loader alone
        (sampling, fetch and transfer, no model: what a GPU trainer waits
        for), recorded as ``result["loader_only"]``; it changes nothing
        the training measured.
    """

    dataset: str = setting("synth-small", node_datasets)
    root: str = setting("data", "folder holding datasets (default: data)")
    lr: float = setting(0.003, "Adam's learning rate", type=positive_float)
    weight_decay: float = setting(0.0, "Adam's weight decay",
                                  type=non_negative_float)
    epochs: int = setting(5, "epochs per run", type=positive_int)
    runs: int = setting(1, type=positive_int)
    seed: int = setting(0, type=int)
    device: str = setting("cpu", "cpu, cuda or cuda:N", type=device_name)
    eval_every: int = setting(1, type=positive_int)
    eval_batch_size: int = setting(8192, cli=False)
    eval: str = setting(
        "auto", "full-neighbour layer-wise inference on every node, or the "
        "training fanouts on valid and test nodes (auto: layer-wise unless, "
        "with features on disk, it would read over 32 GiB from storage)",
        choices=["auto", "layerwise", "sampled"])
    out: str = setting("runs/latest",
                       "output folder (default runs/DATASET-MODEL)")
    resume: bool = setting(False, "continue from OUT/checkpoint.pt")
    progress: bool = setting(True, "no progress bars")
    loader_only: bool = setting(False, cli=False)


@dataclass
class ModelSettings:
    """The GNN.

    Attributes
    ----------
    input_dropout : float
        Dropout on the input features (Kipf & Welling's GCN and GAT use
        the hidden rate on Planetoid).
    attn_dropout : float
        Dropout on GAT's attention weights.
    """

    model: str = setting("sage", choices=node_models)
    hidden: int = setting(256, "hidden features per layer",
                          type=positive_int)
    dropout: float = setting(0.5, "after each hidden layer", type=fraction)
    input_dropout: float = setting(0.0, "on the input features",
                                   type=fraction)
    attn_dropout: float = setting(0.0, "on attention weights (gat)",
                                  type=fraction)
    num_heads: int = setting(4, "attention heads (gat)", type=positive_int)


@dataclass
class SamplingSettings:
    """How mini-batches are sampled.

    Attributes
    ----------
    fanouts : list of int
        Neighbours sampled per layer, first layer first; -1 takes all.
        Its length is the number of GNN layers.
    sampler : str
        ``"neighbor"`` (DGL's) or ``"cluster"``
        (`hmgraph.samplers.cluster.ClusterSampler`).
    clusters : int
        METIS clusters for the cluster sampler and renumbering; 0 picks
        one per mini-batch of the train split.
    """

    fanouts: list = setting(
        help="neighbours per layer, input layer first, e.g. 15,10,5; -1 "
        "takes all; the count sets the number of layers",
        factory=lambda: [15, 10, 5], type=parse_fanouts)
    batch_size: int = setting(1024, "seed nodes per mini-batch",
                              type=positive_int)
    sampler: str = setting(
        "neighbor", "DGL's neighbour sampler, or cluster sampling (2PGraph)",
        choices=["neighbor", "cluster"])
    clusters: int = setting(0, "METIS clusters (default: one per batch)",
                            type=non_negative_int)
    locality: float = setting(
        1.0, "0: uniform neighbours .. 1: only inside the cluster",
        type=unit_interval)
    group_size: int = setting(4, "clusters mixed into the same batches",
                              type=positive_int)


@dataclass
class CacheSettings:
    """The feature cache.

    Attributes
    ----------
    cache : str or None
        Cache policy (``hmgraph``, ``presample``, ...); None: no cache.
    device_budget, host_budget : str
        ``"512MB"``, ``"2GB"`` or a share of the feature bytes (``"5%"``).
        ``host_budget="auto"`` (the default) sizes the host tier from the
        free memory after the graph, less the run's working set and a
        2 GiB reserve, with features on disk; 0 with features in memory.
    """

    cache: str | None = setting(None, "cache policy (default: no cache)",
                                choices=cache_policies)
    device_budget: str = setting(
        "0", "device tier memory: 512MB, 2GB or 5%% of the feature bytes")
    host_budget: str = setting(
        "auto", "host tier memory, same forms, or auto (default: with "
        "features on disk, what is free after the graph, the working set "
        "and 2 GiB; with features in memory, 0)")
    # None: 4 (bench/results/cache_policies-synth-papers-windows.md) where
    # staging or reuse needs it or its hits pay for its work on this
    # machine (hmgraph.cache.costs), else 0.
    window: int | None = setting(
        None, "lookahead batches for the hmgraph cache (default: 4 where "
        "it pays on this machine, else 0)", type=non_negative_int)
    reuse: str = setting("none", "keep rows of recent batches on the device "
                         "(auto: the levels that pay on this machine)",
                         choices=["none", "one-level", "two-level", "auto"])
    placement: str = setting("frequency", "rank of rows for static placement",
                             choices=["frequency", "layer-aware"])
    profile_batches: int = setting(32, "batches sampled to plan the cache",
                                   type=positive_int)


@dataclass
class StorageSettings:
    """Where the feature rows live and in what order.

    Attributes
    ----------
    features_on : str
        ``"memory"`` (rows in RAM) or ``"disk"`` (the feature file, read
        with O_DIRECT by the storage tier).
    prefetch : int or None
        Batches fetched ahead in a thread. None: 1 with features on disk
        (three batches of rows in flight: one training, one fetched, one
        being fetched, the bound the memory promise counts), 2 in memory.
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
        (see `hmgraph.layout.resolve_layout`).
    verify : bool
        Check the feature file's checksum when the dataset loads.
    """

    features_on: str = setting(
        "memory", "rows in memory, or read from the feature file with "
        "O_DIRECT", choices=["memory", "disk"])
    prefetch: int | None = setting(
        None, "batches sampled and fetched ahead in threads (default: 1 "
        "with features on disk, three batches of rows in flight; 2 in "
        "memory)", type=non_negative_int)
    renumber: bool = setting(
        False, "make clusters contiguous id ranges (feature file rewritten "
        "once)")
    layout: str = setting(
        "auto", "order of the feature file's rows: as stored, or hot-first "
        "(nodes renumbered hottest first by a profile of the training "
        "batches, inside each cluster with --renumber, so cached rows fill "
        "whole pages and misses fall on cold ones; the file is rewritten "
        "once and cached beside it). auto: hot-first with features on disk "
        "and a profiled cache (presample, layer-aware, hmgraph), else file",
        choices=["auto", "file", "hot-first"])
    verify: bool = setting(True, "skip the feature file's checksum")


@dataclass
class TrainConfig(StorageSettings, CacheSettings, SamplingSettings,
                  ModelSettings, RunSettings):
    """Settings of one training job (all JSON-serialisable): the fields
    of `RunSettings`, `ModelSettings`, `SamplingSettings`,
    `CacheSettings` and `StorageSettings`, in that order.

    Examples
    --------
    >>> config = TrainConfig(dataset="synth-tiny", fanouts=[5, 5])
    >>> config.layers, config.batch_size
    (2, 1024)
    """

    @property
    def layers(self) -> int:
        """Number of GNN layers (one per fanout)."""
        return len(self.fanouts)

    def as_dict(self) -> dict:
        """The settings as a plain dict."""
        return dataclasses.asdict(self)


#: The concerns of `TrainConfig` by title, as ``hmgraph train --help``
#: groups their flags.
TRAIN_CONCERNS = {"run": RunSettings, "model": ModelSettings,
                  "sampling": SamplingSettings,
                  "feature cache": CacheSettings, "storage": StorageSettings}

#: The settings that sample a dataset the way training would: the flags
#: of the commands that replay, compare or partition a training workload
#: (``analyze``, ``bench``, ``partition``).
WORKLOAD = ("dataset", "root", "fanouts", "batch_size")

#: The budgets of the commands that compare configurations or machines on
#: one dataset (``bench``, ``partition``, ``train-dist``): shares of the
#: feature bytes, as `hmgraph.settings.add_arguments` changes.
SHARE_BUDGETS = {
    "device_budget": {"default": "5%", "help": "device tier memory: 512MB, "
                      "2GB or 5%% of the feature bytes (default: 5%%)"},
    "host_budget": {"default": "20%", "help": "host tier memory, same forms "
                    "(default: 20%%)"}}

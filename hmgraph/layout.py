"""The order of the feature file's rows and the sampler over it.

`prepare` makes what training needs before its loader: METIS clusters
for the cluster sampler or renumbering, the dataset renumbered by cluster
and/or rewritten hot-first as `resolve_layout` decides, and the sampler
over the final graph.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import dgl
import dgl.utils
import torch

from hmgraph.cache.policies import layer_aware_score
from hmgraph.datasets.renumbered import permuted
from hmgraph.loader import PROFILED_POLICIES
from hmgraph.samplers.cluster import ClusterSampler, metis_clusters
from hmgraph.samplers.presample import presample
from hmgraph.samplers.renumber import (
    cluster_permutation,
    hot_first_permutation,
    renumber_graph,
)

log = logging.getLogger(__name__)

__all__ = ["LAYOUTS", "make_sampler", "prepare", "resolve_layout"]

#: Orders of the feature file's rows (see `TrainConfig.layout`).
LAYOUTS = ("auto", "file", "hot-first")

# As `DataLoader._profile`: the layout is planned from the same batches.
_PROFILE_SEED_OFFSET = 7919


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

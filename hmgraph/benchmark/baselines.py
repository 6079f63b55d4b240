"""The runs the bench scripts set up alike.

`load` (a dataset and its facts), `seeded_subset` (the same seeds for
every run), `dgl_baseline` (DGL's loader with a seeded model, the
`dgl_epoch`s of a run), `hot_first_layout` (the layout ``hmgraph train``
writes) and `loader_epoch` (an `hmgraph.DataLoader` built and timed over
one epoch).
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import torch

import hmgraph
from hmgraph import datasets
from hmgraph.benchmark.epochs import (
    DGL_WORKERS,
    DROPOUT,
    LR,
    dgl_epoch,
    hmgraph_epoch,
    new_model,
    open_memmap,
)

__all__ = [
    "dgl_baseline",
    "hot_first_layout",
    "load",
    "loader_epoch",
    "seeded_subset",
]


def load(name: str, root, **kwargs):
    """``(dataset, facts)``: `hmgraph.datasets.load` and its graph's
    sparse formats built, each timed (``load_seconds``,
    ``prepare_seconds``); ``nodes``, ``edges``, ``feat_dim``,
    ``feature_path``, ``feature_bytes`` and ``row_bytes`` (None without a
    feature file)."""
    began = time.perf_counter()
    data = datasets.load(name, root, verify=False, **kwargs)
    loaded = time.perf_counter()
    data.graph.create_formats_()
    manifest = getattr(data, "manifest", None)
    return data, {"load_seconds": loaded - began,
                  "prepare_seconds": time.perf_counter() - loaded,
                  "nodes": data.num_nodes, "edges": data.graph.num_edges(),
                  "feat_dim": data.feat_dim,
                  "feature_path": data.feature_path and str(
                      data.feature_path),
                  "feature_bytes": manifest and manifest.data_bytes,
                  "row_bytes": manifest and manifest.row_bytes}


def seeded_subset(seeds, max_batches: int | None, batch_size: int,
                  seed: int):
    """``seeds``, or a seeded random subset of ``max_batches`` x
    ``batch_size`` of them in their order."""
    keep = (max_batches or 0) * batch_size
    if not keep or keep >= seeds.numel():
        return seeds
    generator = torch.Generator().manual_seed(seed)
    return seeds[torch.randperm(seeds.numel(), generator=generator)[:keep]
                 .sort().values]


def dgl_baseline(data, settings, features: str = "memory", *, seeds=None,
                 epochs: int = 1, loader_only: bool = False,
                 desc: str = "dgl", after=None, **options) -> list[dict]:
    """DGL's baseline as every benchmark sets it up, then `dgl_epoch`s.

    A seeded model (`new_model`: ``settings.model``, ``lr``, ``dropout``
    where it has them), DGL's ``NeighborSampler(settings.fanouts)`` and
    the rows in memory (``features="memory"``) or from `open_memmap` of
    the feature file (``memmap``; ``memmap-random``: ``MADV_RANDOM``),
    its pages dropped once before each epoch.

    Parameters
    ----------
    data : hmgraph.datasets.Dataset
        The dataset; ``seeds`` default to its train split.
    settings
        ``hidden``, ``fanouts``, ``seed`` and ``batch_size``;
        ``dgl_workers`` where given (else `DGL_WORKERS`).
    epochs : int
        Training epochs, epoch ``e`` seeded ``settings.seed + e``.
    loader_only : bool
        Then one more epoch of the loader alone (no model), seeded
        ``settings.seed``.
    desc : str
        The progress bar's label, formatted with ``epoch``.
    after : callable, optional
        ``after(model, record)`` after each training epoch.
    **options
        Passed on to `dgl_epoch` (``max_batches``, ``progress_bar``...).

    Returns
    -------
    list of dict
        `dgl_epoch`'s record of each training epoch, then the loader-only
        epoch's.
    """
    import dgl  # lazy: 4 s to import

    model, optimizer = new_model(
        data, settings.hidden, len(settings.fanouts), settings.seed,
        getattr(settings, "model", "sage"), getattr(settings, "lr", LR),
        getattr(settings, "dropout", DROPOUT))
    memmap = features != "memory"
    rows = open_memmap(data.feature_path, features.endswith("random")) \
        if memmap else data.features
    options.update(
        batch_size=settings.batch_size, cold=data.feature_path if memmap
        else None, num_workers=getattr(settings, "dgl_workers", DGL_WORKERS))
    run = partial(
        dgl_epoch, data.graph, data.split["train"] if seeds is None else
        seeds, dgl.dataloading.NeighborSampler(settings.fanouts), rows,
        data.labels, **options)
    records = []
    for epoch in range(epochs):
        records.append(run(model, optimizer, seed=settings.seed + epoch,
                           desc=desc.format(epoch=epoch)))
        if after is not None:
            after(model, records[-1])
    if loader_only:
        records.append(run(seed=settings.seed, desc=desc.format(
            epoch="loader")))
    return records


def hot_first_layout(name: str, dataset, seeds, args,
                     profile_batches: int):
    """``dataset`` in the hot-first layout ``hmgraph train`` writes with
    features on disk and a cache (`hmgraph.train.prepare` on a view whose
    train split is ``seeds``): ``(dataset, seeds, profile, record)`` in
    the new ids. The loaders plan from ``profile`` as training's do: the
    static rows are then the file's first rows (a loader that profiled
    again, with other batches, held rows spread over the whole file).
    ``record``: ``seconds`` (profile and rewrite, or reuse of an earlier
    one), ``reused``, ``path``, ``profile_batches``, ``formats_seconds``
    (the graph's sparse formats)."""
    from hmgraph.train import TrainConfig, prepare  # lazy: loads DGL

    graph = dataset.graph.local_var()
    graph.ndata.pop("feat", None)
    view = dataclasses.replace(dataset, graph=graph, features_on="disk",
                               split=dict(dataset.split, train=seeds))
    config = TrainConfig(
        dataset=name, root=str(args.root), features_on="disk",
        cache="hmgraph", layout="hot-first", fanouts=list(args.fanouts),
        batch_size=args.batch_size, profile_batches=profile_batches,
        seed=args.seed)
    start = time.perf_counter()
    renumbered, _, _, profile = prepare(config, view)
    record = {"name": "hot-first", "seconds": time.perf_counter() - start,
              "reused": bool(renumbered.info.get("reused")),
              "path": str(renumbered.feature_path),
              "profile_batches": profile.num_batches}
    start = time.perf_counter()
    renumbered.graph.create_formats_()
    record["formats_seconds"] = time.perf_counter() - start
    return renumbered, renumbered.split["train"], profile, record


def loader_epoch(dataset, seeds, args, desc: str, trace: bool = False,
                 loader_only: bool = False, **options) -> dict:
    """One training epoch of an `hmgraph.DataLoader` over the dataset's
    feature file (DGL's ``NeighborSampler``, ``options`` passed on),
    construction timed apart; every run samples the same batches.

    Returns `hmgraph_epoch`'s record and ``construct_seconds``,
    ``warm_storage`` (the static fill's reads), ``source`` (the storage
    tier) and the closed ``loader`` (its ``plan``, ``trace``); with
    ``loader_only``, ``loader_only``: `hmgraph_epoch`'s record of the
    same batches again with no model (the cache as training left it).
    """
    import dgl  # lazy: 4 s to import

    model, optimizer = new_model(dataset, args.hidden, len(args.fanouts),
                                 args.seed)
    began = time.perf_counter()
    loader = hmgraph.DataLoader(
        dataset.graph, seeds, dgl.dataloading.NeighborSampler(args.fanouts),
        features=dataset.feature_path, labels=dataset.labels,
        batch_size=args.batch_size, seed=args.seed, **options)
    construct = time.perf_counter() - began
    try:
        warm = loader.stats.storage and loader.stats.storage.as_dict()
        (cache,) = loader.cache.values()  # the one node type's
        source = cache.source
        dgl.seed(args.seed)  # every configuration samples the same batches
        loader.trace = [] if trace else None
        run = hmgraph_epoch(loader, model, optimizer, desc=desc)
        if loader_only:  # the same batches again, no model
            trace_kept, loader.trace = loader.trace, None
            dgl.seed(args.seed)
            loader.set_epoch(0)
            run["loader_only"] = hmgraph_epoch(loader, desc=desc + " alone")
            loader.trace = trace_kept
    finally:
        loader.close()
    return dict(run, construct_seconds=construct, warm_storage=warm,
                source=source, loader=loader)

"""``hmgraph bench`` and the baselines every benchmark shares.

``hmgraph bench`` trains the same model for the same epochs under every
configuration, each in its own process (so its peak resident memory is its
own), and reports epoch seconds and their ratio to DGL's in-memory loader
with the configuration's construction seconds beside it (and the ratio
amortized over `AMORTIZE_EPOCHS`), seconds per stage, hit rates per tier,
storage and host-to-device bytes, peak memory and test accuracy.

Configurations: DGL's ``DataLoader`` with its defaults and the features in
memory; the same loader gathering rows from an ``np.memmap`` of the
feature file, its pages dropped once before each epoch (outside the
timing); then hmgraph with features on disk and each cache policy,
``hmgraph`` with two-level reuse, and that with cluster sampling and
renumbering.

The second half of this module is the harness the ``bench/`` scripts
share through ``bench/common.py``: `dgl_epoch` (the one DGL baseline),
`hmgraph_epoch`, `isolated`, peak memory sampled with psutil, `commit`,
`write_results` and `markdown_table`; then the parts two or more scripts
run: `load`, `seeded_subset`, `loader_epoch`, `environment`, the targets
table (`target`, `targets_table`), `finish` and `metis_parts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import mmap
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from functools import cache, partial
from pathlib import Path

# Before torch: sets OMP_WAIT_POLICY for the benches that import this.
import hmgraph.openmp  # noqa: F401  # isort: skip
import numpy as np
import psutil
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import hmgraph
from hmgraph import datasets
from hmgraph.cache.budget import format_bytes
from hmgraph.cache.disk import DiskModel
from hmgraph.cache.format import atomic_path, open_feature_file

log = logging.getLogger(__name__)

__all__ = [
    "AMORTIZE_EPOCHS", "CONFIGS", "DGL_WORKERS", "DROPOUT", "LR",
    "ConfigurationFailed", "amortized", "built_note", "commit",
    "dgl_baseline",
    "dgl_epoch", "disk_text", "drop_page_cache", "environment",
    "environment_text", "finish", "hmgraph_epoch", "hot_first_layout",
    "isolated", "load", "loader_epoch", "markdown_table", "metis_parts",
    "metis_text", "new_model", "open_memmap", "peak_rss_bytes", "progress",
    "read_bytes", "run", "run_one", "seeded_subset", "target",
    "targets_table", "train_step", "watch_memory", "write_results",
]

#: DGL ``DataLoader(num_workers=...)`` of every DGL baseline: DGL's
#: default. Its CPU prefetch (``num_workers=1``, two batches ahead) was
#: slower on this 2-core machine: 0.60 s against 0.31 s an epoch of 8
#: batches of 128 on synth-tiny, 6.9 s against 5.7 s for 10 batches of
#: 1024 on synth-small (bench/README.md).
DGL_WORKERS = 0
#: Epochs a configuration's construction is amortized over in reports.
AMORTIZE_EPOCHS = 10
LR, DROPOUT = 0.003, 0.5

_HMGRAPH = {"features_on": "disk"}
CONFIGS = {
    "dgl-memory": {"dgl": "memory"},
    "dgl-memmap-cold": {"dgl": "memmap"},
    "none": dict(_HMGRAPH, cache=None),
    "degree": dict(_HMGRAPH, cache="degree"),
    "presample": dict(_HMGRAPH, cache="presample"),
    "layer-aware": dict(_HMGRAPH, cache="layer-aware"),
    "lru": dict(_HMGRAPH, cache="lru"),
    "clock": dict(_HMGRAPH, cache="clock"),
    "hmgraph": dict(_HMGRAPH, cache="hmgraph"),
    "hmgraph+reuse": dict(_HMGRAPH, cache="hmgraph", reuse="two-level"),
    "hmgraph+reuse+cluster": dict(_HMGRAPH, cache="hmgraph",
                                  reuse="two-level", sampler="cluster",
                                  renumber=True, locality=0.5),
}


class ConfigurationFailed(RuntimeError):
    """One configuration's process failed; ``stderr`` holds its trace."""

    def __init__(self, name: str, stderr: str):
        last = (stderr.strip().splitlines() or [""])[-1]
        super().__init__(f"configuration {name} failed: {last}")
        self.name = name
        self.stderr = stderr


# --------------------------------------------------------------------------
# hmgraph bench


def run_one(name: str, settings: dict) -> dict:
    """Train one configuration; return its row of the table."""
    # Lazy, as every DGL import in this module: importing hmgraph.benchmark
    # stays 4 s lighter for the tables and the process runner.
    import hmgraph.samplers.cluster as clustering
    import hmgraph.train as training

    watch_memory()
    overrides = CONFIGS[name]
    config = training.TrainConfig(**{
        k: v for k, v in settings.items()
        if k in training.TrainConfig.__dataclass_fields__})
    if "dgl" in overrides:
        result, built = _dgl_run(config, overrides["dgl"]), {}
    else:
        for key, value in overrides.items():
            setattr(config, key, value)
        config.out = str(Path(settings["work"]) / name)
        # Construction: METIS, the layout and renumbering (train's own
        # record), profiling, plan and static fill (`make_loader`).
        with _timed({"metis": (clustering, "metis_clusters"),
                     "loader": (training, "make_loader")}) as built:
            result = training.train(config)
        built["layout"] = result["layout"]["seconds"]
    epochs = [e for r in result["runs"] for e in r["epochs"]]
    last = epochs[-1]
    alone = result.get("loader_only") or {}
    loader = last.get("loader", {})
    cache = loader.get("cache", {})
    storage = loader.get("storage") or {}

    def mean(key: str) -> float:
        return sum(e["seconds"].get(key, 0.0) for e in epochs) / len(epochs)

    return {
        "name": name,
        "epoch_seconds": mean("epoch"),
        "loader_only_seconds": alone.get("epoch_seconds"),
        "loader_only_cpu_seconds": alone.get("cpu_seconds"),
        "construct_seconds": sum(built.values(), 0.0),
        "construct": built,
        "seconds": {k: mean(k) for k in ("sample", "fetch", "wait",
                                         "train")},
        "hit_rate": cache.get("hit_rate", {}),
        "storage_bytes": storage.get("bytes_read", 0),
        "storage_requests": storage.get("io_requests", 0),
        "amplification": storage.get("amplification"),
        "host_to_device_bytes": cache.get("bytes", {}).get(
            "host->device", last.get("host_to_device_bytes", 0)),
        "reuse_rate": (loader.get("reuse") or {}).get("reuse_rate", 0.0),
        "peak_rss_mb": peak_rss_bytes() / 2**20,
        "test": result["summary"]["test_mean"],
        "plan": result.get("plan"),
    }


@contextlib.contextmanager
def _timed(functions: dict):
    """Seconds spent, while inside, in each ``{key: (module, name)}``
    function, called through its module."""
    seconds = dict.fromkeys(functions, 0.0)
    originals = {key: getattr(*where) for key, where in functions.items()}

    def wrap(key, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start
        return timed

    for key, (module, name) in functions.items():
        setattr(module, name, wrap(key, originals[key]))
    try:
        yield seconds
    finally:
        for key, (module, name) in functions.items():
            setattr(module, name, originals[key])


def _dgl_run(config, features_kind: str) -> dict:
    """`dgl_baseline` for ``config.epochs`` epochs, evaluated after each."""
    from hmgraph.models import layerwise_inference  # lazy: loads DGL

    data = datasets.load(config.dataset, config.root, config.verify)
    best = {"valid": -1.0, "test": 0.0}

    def evaluate(model, record):
        logits = layerwise_inference(model, data.graph, data.features)
        valid = data.evaluate(logits, "valid")
        if valid > best["valid"]:
            best.update(valid=valid, test=data.evaluate(logits, "test"))

    *records, alone = dgl_baseline(
        data, config, features_kind, epochs=config.epochs, after=evaluate,
        progress_bar=False, loader_only=True)
    epochs = [{"seconds": r["seconds"],
               "host_to_device_bytes": r["input_bytes"]} for r in records]
    return {"runs": [{"epochs": epochs}],
            "summary": {"test_mean": best["test"]},
            "loader_only": {"epoch_seconds": alone["seconds"]["epoch"],
                            "cpu_seconds": alone.get("cpu_seconds")}}


def run(args) -> list[dict]:
    """Run every configuration in its own process; write JSON/md/PNG."""
    settings = {
        "dataset": args.dataset, "root": args.root, "fanouts": args.fanouts,
        "batch_size": args.batch_size, "epochs": args.epochs,
        "hidden": args.hidden, "lr": args.lr, "seed": args.seed,
        "device_budget": args.device_budget,
        "host_budget": args.host_budget, "progress": False,
        "loader_only": True,
        "work": str(Path(args.out) / ".bench-runs"),
    }
    names = args.configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration {unknown[0]!r}; "
                         f"available: {', '.join(CONFIGS)}")
    epochs = getattr(args, "amortize_epochs", None) or AMORTIZE_EPOCHS
    result = {"commit": commit(), "settings": settings,
              "amortize_epochs": epochs, "rows": []}
    path = Path(args.out) / f"bench-{args.dataset}.json"
    for name in names:
        log.info("bench: %s", name)
        try:
            result["rows"].append(isolated(run_one, name, settings))
        except ConfigurationFailed as failure:
            raise ConfigurationFailed(name, failure.stderr) from None
        table = format_table(result["rows"], args, epochs)
        write_results(result, table + "\n", path)
    _plot(result["rows"], path.with_suffix(".png"))
    print(table)
    return result["rows"]


def format_table(rows: list[dict], args, epochs: int) -> str:
    """The side-by-side markdown table."""
    base = next((r["epoch_seconds"] for r in rows
                 if r["name"] == "dgl-memory"), None)
    alone = next((r.get("loader_only_seconds") for r in rows
                  if r["name"] == "dgl-memory"), None)
    table = []
    for row in rows:
        s, hits = row["seconds"], row["hit_rate"]
        built = row.get("construct_seconds", 0.0)
        table.append([
            row["name"], row["epoch_seconds"],
            f"{row['epoch_seconds'] / base:.2f}x" if base else "-", built,
            f"{amortized(built, row['epoch_seconds'], base, epochs):.2f}x"
            if base else "-", row.get("loader_only_seconds"),
            f"{row['loader_only_seconds'] / alone:.2f}x"
            if alone and row.get("loader_only_seconds") else "-",
            s["sample"], s["fetch"], s["wait"], s["train"],
            f"{hits.get('device', 0):.1%}", f"{hits.get('host', 0):.1%}",
            format_bytes(row["storage_bytes"]),
            row.get("storage_requests") or "-", row.get("amplification"),
            format_bytes(row["host_to_device_bytes"]),
            round(row["peak_rss_mb"]), f"{row['test']:.4f}"])
    return "\n".join([
        f"# hmgraph bench: {args.dataset}", "",
        f"fanouts {','.join(map(str, args.fanouts))}, batch "
        f"{args.batch_size}, {args.epochs} epoch(s), device budget "
        f"{args.device_budget}, host budget {args.host_budget}; hmgraph "
        f"configurations read features from disk with O_DIRECT; DGL's "
        f"loader with its defaults (num_workers={DGL_WORKERS}), the memmap's "
        f"pages dropped once before each epoch. Construct s: METIS, "
        f"layout, profiling, plan and static fill, outside the epoch; "
        f"amortized: (construct + {epochs} epochs) / {epochs} DGL "
        f"in-memory epochs. Loader only: one more epoch after training, "
        f"sampling and fetch with no model (what a GPU trainer waits "
        f"for), against DGL's loader with features in memory.", "",
        markdown_table(
            ["config", "epoch s", "vs DGL in-memory", "construct s",
             f"vs DGL amortized over {epochs} epochs", "loader only s",
            "loader only vs DGL's", "sample s",
             "fetch s (incl. transfer)", "wait s", "train s", "device hit",
             "host hit", "storage read", "storage requests",
             "read amplification", "host->device", "peak RSS MB",
             "test acc"], table)])


def _plot(rows: list[dict], path: Path) -> None:
    # Lazy: matplotlib (0.7 s) for the plot alone, its backend set first.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is set

    figure, axis = plt.subplots(figsize=(8, 4))
    names = [r["name"] for r in rows]
    bottom = [0.0] * len(rows)
    for stage in ("sample", "fetch", "wait", "train"):
        values = [r["seconds"][stage] for r in rows]
        axis.barh(names, values, left=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    axis.set_xlabel("seconds per epoch (stages overlap when prefetching)")
    axis.legend()
    axis.invert_yaxis()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(figure)


# --------------------------------------------------------------------------
# The shared harness: baselines


def new_model(data, hidden: int, layers: int, seed: int, model="sage",
              lr: float = LR, dropout: float = DROPOUT):
    """A seeded model and its Adam optimizer, the same for every run."""
    import dgl  # lazy: 4 s to import

    from hmgraph.models import build_model  # lazy: loads DGL

    torch.manual_seed(seed)
    dgl.seed(seed)
    net = build_model(model, data.feat_dim, hidden, data.num_classes,
                      num_layers=layers, dropout=dropout)
    return net, torch.optim.Adam(net.parameters(), lr=lr)


def train_step(model, optimizer, blocks, x, y) -> float:
    """Forward, cross-entropy loss, backward and step; the loss."""
    loss = F.cross_entropy(model(blocks, x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss)


def open_memmap(path, random: bool = False) -> np.memmap:
    """The feature file's rows as ``np.memmap``, as a DGL user maps them.

    ``random`` also tells the kernel the access is random
    (``madvise(MADV_RANDOM)``): a page fault then reads its page alone
    instead of the device's read-ahead window.
    """
    rows = open_feature_file(path)[1]
    if random:
        rows._mmap.madvise(mmap.MADV_RANDOM)
    return rows


def drop_page_cache(path, rows: np.memmap | None = None) -> None:
    """Evict ``path``'s pages from memory (no root needed).

    ``rows``, a map of the file, releases its pages first
    (``madvise(MADV_DONTNEED)``): ``posix_fadvise(DONTNEED)`` alone keeps
    every page a map still holds.
    """
    if getattr(rows, "_mmap", None) is not None:
        rows._mmap.madvise(mmap.MADV_DONTNEED)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dgl_epoch(graph, seeds, sampler, features, labels, model=None,
              optimizer=None, *, batch_size: int, seed: int = 0,
              max_batches: int = 0, max_seconds: float = 0.0,
              num_workers: int = DGL_WORKERS, cold=None, desc: str = "dgl",
              progress_bar: bool = True) -> dict:
    """One epoch of DGL's own loader, as a DGL user writes it.

    ``dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size,
    shuffle=True, num_workers=num_workers)``, every other keyword at DGL's
    default; rows gathered with ``features[input_nodes]`` from a tensor in
    memory or an ``np.memmap``, labels likewise.

    Parameters
    ----------
    model, optimizer : optional
        The model step (`train_step`); without them the loader alone is
        timed (sample + gather), the regime of a GPU trainer.
    seed : int
        Seeds torch and DGL before the loader is built.
    max_batches : int
        Stop after this many batches (0: the whole epoch).
    max_seconds : float
        Stop after the batch that ends past this many seconds (0: no cap);
        ``capped`` says whether it did.
    cold : path, optional
        The feature file: its pages (and ``features``' map's) are dropped
        once before the epoch, outside its seconds (``seconds["drop"]``).

    Returns
    -------
    dict
        ``batches``, ``epoch_batches`` (of a whole epoch),
        ``input_rows``, ``output_rows``, ``input_bytes``,
        ``seconds`` (``drop``, ``sample``, ``fetch``, ``train``,
        ``epoch``), ``seconds_per_batch``, ``first_sample_seconds``,
        ``mean_loss``, ``capped`` and ``read_bytes`` from block devices.
    """
    import dgl  # lazy: 4 s to import

    seconds = dict.fromkeys(("drop", "sample", "fetch", "train"), 0.0)
    if cold is not None:
        start = time.perf_counter()
        drop_page_cache(cold, features)
        seconds["drop"] = time.perf_counter() - start
    torch.manual_seed(seed)
    dgl.seed(seed)
    loader = dgl.dataloading.DataLoader(graph, seeds, sampler,
                                        batch_size=batch_size, shuffle=True,
                                        num_workers=num_workers)
    total = min(max_batches or len(loader), len(loader))
    if model is not None:
        model.train()
    before = read_bytes()
    bar = progress(total, desc, progress_bar)
    start = time.perf_counter()
    batches = iter(loader)
    n, loss, first, capped = _time_batches(
        batches, total, features, labels, model, optimizer, seconds,
        start, max_seconds, bar)
    seconds["epoch"] = time.perf_counter() - start
    bar.close()
    del batches
    return dict(n, seconds=seconds, capped=capped, epoch_batches=len(loader),
                seconds_per_batch=seconds["epoch"] / max(n["batches"], 1),
                first_sample_seconds=first or 0.0,
                mean_loss=loss / max(n["batches"], 1),
                read_bytes=read_bytes() - before)


def _time_batches(batches, total: int, features, labels, model, optimizer,
                  seconds: dict, start: float, max_seconds: float,
                  bar) -> tuple:
    """Take ``total`` batches of DGL's loader, each step timed.

    Adds each batch's ``sample``, ``fetch`` and ``train`` seconds to
    ``seconds``; stops early once ``max_seconds`` (0: no cap) have passed
    since ``start``.

    Returns
    -------
    tuple
        ``(counts, loss, first, capped)``: ``batches``, ``input_rows``,
        ``output_rows`` and ``input_bytes``; the summed loss; the first
        batch's sampling seconds (None without a batch); whether the cap
        stopped it.
    """
    memmap = isinstance(features, np.ndarray)
    n = {"batches": 0, "input_rows": 0, "output_rows": 0, "input_bytes": 0}
    loss, first, capped = 0.0, None, False
    while n["batches"] < total:
        if max_seconds and time.perf_counter() - start > max_seconds:
            capped = True
            break
        t0 = time.perf_counter()
        input_nodes, output_nodes, blocks = next(batches)
        t1 = time.perf_counter()
        x = torch.from_numpy(features[input_nodes.numpy()]) if memmap \
            else features[input_nodes]
        y = labels[output_nodes]
        t2 = time.perf_counter()
        if model is not None:
            loss += train_step(model, optimizer, blocks, x, y)
        t3 = time.perf_counter()
        first = t1 - t0 if first is None else first
        seconds["sample"] += t1 - t0
        seconds["fetch"] += t2 - t1
        seconds["train"] += t3 - t2
        n["batches"] += 1
        n["input_rows"] += int(input_nodes.numel())
        n["output_rows"] += int(output_nodes.numel())
        n["input_bytes"] += x.numel() * x.element_size()
        bar.update(1)
    return n, loss, first, capped


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


def hmgraph_epoch(loader, model=None, optimizer=None, *,
                  max_batches: int = 0, desc: str = "hmgraph",
                  progress_bar: bool = True) -> dict:
    """One epoch of an `hmgraph.DataLoader`, timed like `dgl_epoch`.

    The loader's counters are reset first; without a model the loader
    alone is timed. Returns `dgl_epoch`'s keys (``seconds`` adds the
    loader's ``wait``; ``sample`` and ``fetch`` run in its threads) and
    ``stats``, the loader's counters.
    """
    loader.stats.reset()
    total = min(max_batches or len(loader), len(loader))
    if model is not None:
        model.train()
    train = loss = 0.0
    batches = rows = 0
    before = read_bytes()
    bar = progress(total, desc, progress_bar)
    start = time.perf_counter()
    for batch in loader:
        step = time.perf_counter()
        if model is not None:
            loss += train_step(model, optimizer, batch.blocks, batch.x,
                               batch.y)
        train += time.perf_counter() - step
        batches += 1
        rows += int(batch.input_nodes.numel())
        bar.update(1)
        if max_batches and batches == total:
            break
    seconds = {"epoch": time.perf_counter() - start}
    bar.close()
    stats = loader.stats.as_dict()
    seconds.update(stats["seconds"], train=train)
    return {"batches": batches, "epoch_batches": len(loader),
            "input_rows": rows, "seconds": seconds,
            "seconds_per_batch": seconds["epoch"] / max(batches, 1),
            "mean_loss": loss / max(batches, 1), "capped": False,
            "read_bytes": read_bytes() - before, "stats": stats}


def amortized(construct: float, epoch: float, base: float | None,
              epochs: int = AMORTIZE_EPOCHS) -> float | None:
    """``(construct + epochs x epoch) / (epochs x base)``; None without a
    base."""
    if not base or not epochs:
        return None
    return (construct + epochs * epoch) / (epochs * base)


# --------------------------------------------------------------------------
# The shared harness: processes, memory, results


def isolated(function, *args, timeout: float | None = None, **kwargs):
    """``function(*args, **kwargs)`` in a fresh process; its return value.

    ``spawn``: the child imports anew and shares no memory; its peak
    memory is sampled from its start (`watch_memory`). An exception in the
    child, its death (the OOM killer's SIGKILL), or a child still running
    after ``timeout`` seconds (then killed, e.g. a memmap gather stuck in
    page faults) raises `ConfigurationFailed` here with the child's
    traceback, exit code or block-device reads.
    """
    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child,
                            args=(send, function, args, kwargs))
    child.start()
    send.close()
    name = function.__name__
    try:
        if not receive.poll(timeout):
            read = psutil.Process(child.pid).io_counters().read_bytes
            child.kill()
            child.join()
            raise ConfigurationFailed(
                name, f"killed after its limit of {timeout:.0f} s, having "
                f"read {read / 1e9:.1f} GB from block devices")
        ok, value = receive.recv()
    except EOFError:
        child.join()
        raise ConfigurationFailed(
            name, f"died with exit code {child.exitcode} (-9: killed, e.g. "
            f"by the OOM killer)") from None
    child.join()
    if not ok:
        raise ConfigurationFailed(name, value)
    return value


def _child(send, function, args, kwargs) -> None:
    watch_memory()
    try:
        send.send((True, function(*args, **kwargs)))
    except Exception:  # noqa: BLE001 - carried to the parent
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


_peak = {"bytes": 0, "thread": None}


def watch_memory(interval: float = 0.01) -> None:
    """Sample this process's resident memory (psutil) every ``interval``
    seconds from now on, in a daemon thread; idempotent.

    psutil has no peak on Linux, and ``ru_maxrss`` of a spawned process
    starts at its parent's peak: a child of a 300 MB parent reports 300
    MB. A peak sampled here misses spikes shorter than ``interval``.
    """
    if _peak["thread"] is not None:
        return
    process = psutil.Process()

    def sample() -> None:
        while True:
            _peak["bytes"] = max(_peak["bytes"], process.memory_info().rss)
            time.sleep(interval)

    _peak["thread"] = threading.Thread(target=sample, daemon=True,
                                       name="peak-rss")
    _peak["thread"].start()


def peak_rss_bytes() -> int:
    """Most resident memory seen since `watch_memory` (started here if
    not yet)."""
    watch_memory()
    _peak["bytes"] = max(_peak["bytes"], psutil.Process().memory_info().rss)
    return _peak["bytes"]


def read_bytes() -> int:
    """Bytes this process has had read from block devices."""
    return int(psutil.Process().io_counters().read_bytes)


def progress(total: int, desc: str, enabled: bool = True):
    """A progress bar on stderr that leaves no line behind."""
    return tqdm(total=total, desc=desc, unit="batch", leave=False,
                mininterval=2.0, disable=not enabled)


@cache
def commit() -> dict:
    """The commit of this checkout (``git rev-parse HEAD``) and ``dirty``:
    whether tracked or untracked files differ from it, results folders
    left out. Taken once per process; None where git cannot tell."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, text=True,
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", ".",
                 ":(exclude)bench/results") if sha else None
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def write_results(result: dict, markdown: str, path) -> Path:
    """Write ``result`` to ``path`` (JSON) and ``markdown`` beside it
    (``.md``), each atomically, both naming the commit that wrote them.

    ``result["commit"]`` is set to `commit` unless present; the markdown's
    second line names it (or each of ``merged``, for a result put together
    from runs of several commits). Returns the JSON's path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.setdefault("commit", commit())
    sha, dirty = result["commit"]["sha"], result["commit"]["dirty"]
    merged = [c["sha"] for c in result["commit"].get("merged", [])]
    line = (f"Written by commit `{sha}`"
            + (" with uncommitted changes" if dirty else "") + "."
            if sha else "Written by commits " + ", ".join(
                f"`{c}`" for c in merged) + " (the parts are named below)."
            if merged else
            "Commit unknown (not recorded, or no git checkout).")
    head, _, rest = markdown.partition("\n")
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    with atomic_path(path.with_suffix(".md")) as tmp:
        tmp.write_text(f"{head}\n\n{line}\n{rest}")
    return path


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; None shown as ``-``, floats to 3 significant
    digits (at most 3 decimals), columns whose first cell reads as a
    number right-aligned."""
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            digits = 2 - math.floor(math.log10(abs(value))) if value else 0
            return f"{value:,.{min(3, max(0, digits))}f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    first = [cell(v) for v in rows[0]] if rows else []
    align = ["---:" if text[:1] in "0123456789-+." else "---"
             for text in first] or ["---"] * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The shared harness: bench/ script parts (datasets, loaders, reports, METIS)


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
        source = loader.cache.source
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


def environment() -> dict:
    """Versions, CPUs, threads and the machine's load right now."""
    import dgl  # lazy: 4 s to import

    return {"hmgraph": hmgraph.__version__, "torch": torch.__version__,
            "dgl": dgl.__version__, "numpy": np.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg": os.getloadavg()}


def environment_text(env: dict) -> str:
    """`environment` in one clause of a setup line."""
    return (f"torch {env['torch']}, dgl {env['dgl']}, "
            f"{env['torch_num_threads']} threads, {env['cpu_count']} CPUs, "
            f"load average {env['loadavg'][0]:.1f} at the start")


def disk_text(model: dict) -> str:
    """`hmgraph.cache.disk.DiskModel.describe` of its ``as_dict``."""
    return DiskModel(**{k: v for k, v in model.items()
                        if k != "gap_bytes"}).describe()


def target(number, what: str, value, op: str, limit: float,
           note: str | None = None) -> dict:
    """One target: ``value op limit`` judged PASS or MISS (``not run``
    where ``value`` is None)."""
    if value is None:
        verdict = "not run"
    else:
        verdict = "PASS" if (value <= limit if op == "<=" else
                             value >= limit) else "MISS"
    return {"target": number, "what": what, "value": value, "op": op,
            "limit": limit, "verdict": verdict, "note": note}


def built_note(built: str, epochs: int, ratio: float | None) -> str:
    """A target's note: ``built`` (the construction seconds, as text) and,
    where not None, ``ratio`` `amortized` over ``epochs``."""
    return built + (f"; amortized over {epochs} epochs {ratio:.2f}"
                    if ratio is not None else "")


def targets_table(rows: list[dict]) -> str:
    """``| # | target | value | limit | verdict |``, notes in brackets."""
    return markdown_table(
        ["#", "target", "value", "limit", "verdict"],
        [[t["target"], t["what"] + (f" ({t['note']})" if t["note"] else ""),
          t["value"], f"{t['op']} {t['limit']:g}", f"**{t['verdict']}**"]
         for t in rows])


def finish(result: dict, markdown: str, out) -> int:
    """Write the results (`write_results`), print the markdown; 0."""
    path = write_results(result, markdown, out)
    print(markdown, end="" if markdown.endswith("\n") else "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0
METIS_TIMEOUT_SECONDS = 1800


def metis_parts(dataset, root, num_parts: int,
                timeout: float = METIS_TIMEOUT_SECONDS) -> tuple:
    """METIS parts of ``dataset``'s graph, cached next to its feature file
    as ``metis-<num_parts>.npy``.

    Read from `metis_clusters`' cache where its key (graph and run) is
    this one; else `metis_clusters` runs in a child process (`isolated`:
    METIS's memory, several GB on synth-products, is never this
    process's, and a run past ``timeout`` seconds is killed).

    Returns
    -------
    (torch.Tensor or None, dict)
        The part of every node (None where METIS failed) and its record:
        ``path``, ``num_parts``, ``key``, ``status`` (``cached``,
        ``computed`` or ``failed``), ``seconds`` (wall time, the child's
        loading included), ``metis_seconds`` and ``child_peak_rss_mb``
        when computed, ``error`` when failed; with parts,
        ``nodes_per_part`` and ``train_seeds_per_part`` (min, mean, max),
        ``parts_with_train_seeds`` and ``edges_inside_share``.
    """
    # Lazy: loads DGL.
    from hmgraph.samplers.cluster import cached_clusters, metis_key

    graph = dataset.graph
    path = Path(dataset.feature_path).parent / f"metis-{num_parts}.npy"
    key = metis_key(graph, num_parts)
    info = {"path": str(path), "num_parts": num_parts, "key": key,
            "status": "cached", "timeout_seconds": timeout}
    began = time.perf_counter()
    parts = cached_clusters(path, key)
    if parts is None:
        print(f"METIS: {num_parts} parts of {graph.num_nodes():,} nodes in a"
              f" child process (timeout {timeout:.0f} s)", file=sys.stderr)
        try:
            info.update(isolated(_metis_child, dataset.name, str(root),
                                 num_parts, timeout=timeout),
                        status="computed")
            parts = cached_clusters(path, key)
        except ConfigurationFailed as err:
            info.update(status="failed", error=str(err))
    info["seconds"] = time.perf_counter() - began
    if parts is None:
        info.setdefault("error", "the child's assignment is not this graph's")
        info["status"] = "failed"
        return None, info
    train = torch.bincount(parts[dataset.split["train"]],
                           minlength=num_parts).double()
    nodes = torch.bincount(parts, minlength=num_parts).double()
    src, dst = graph.edges()
    return parts, dict(
        info, edges_inside_share=float((parts[src] == parts[dst]).double()
                                       .mean()),
        parts_with_train_seeds=int((train > 0).sum()),
        **{name: {"min": int(c.min()), "mean": float(c.mean()),
                  "max": int(c.max())}
           for name, c in (("nodes_per_part", nodes),
                           ("train_seeds_per_part", train))})


def _metis_child(name: str, root: str, num_parts: int) -> dict:
    """`metis_parts`' child: load the dataset, run `metis_clusters`."""
    from hmgraph.samplers.cluster import metis_clusters  # lazy: loads DGL

    dataset = datasets.load(name, root, verify=False)
    began = time.perf_counter()
    metis_clusters(dataset.graph, num_parts, Path(dataset.feature_path)
                   .parent / f"metis-{num_parts}.npy")
    return {"metis_seconds": time.perf_counter() - began,
            "child_peak_rss_mb": peak_rss_bytes() / 2**20}


def metis_text(info: dict) -> str:
    """One markdown sentence on `metis_parts`' record."""
    text = (f"METIS ({info['num_parts']} parts, one per batch, "
            f"`{info['path']}`): **{info['status']}** in "
            f"{info['seconds']:.1f} s")
    if "metis_seconds" in info:
        text += (f" (METIS {info['metis_seconds']:.1f} s, the child's peak "
                 f"RSS {info['child_peak_rss_mb']:,.0f} MB)")
    if "error" in info:
        return f"{text}: {info['error']}."
    seeds = info["train_seeds_per_part"]
    return (f"{text}; {100 * info['edges_inside_share']:.1f} % of edges "
            f"inside a part, {seeds['min']}-{seeds['max']} train seeds per "
            f"part ({info['parts_with_train_seeds']} parts hold any).")

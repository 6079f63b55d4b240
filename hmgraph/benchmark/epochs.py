"""One timed epoch of DGL's loader and of hmgraph's, and the model step.

`dgl_epoch` is the one DGL baseline (DGL's ``DataLoader`` as a DGL user
writes it, rows from memory or an ``np.memmap`` whose pages can be dropped
first: `open_memmap`, `drop_page_cache`); `hmgraph_epoch` times an
`hmgraph.DataLoader` the same way. Both train with `new_model`'s seeded
model through `train_step`, or time the loader alone.
"""

from __future__ import annotations

import mmap
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hmgraph.benchmark.process import read_bytes
from hmgraph.cache.format import open_feature_file

__all__ = [
    "DGL_WORKERS",
    "DROPOUT",
    "LR",
    "dgl_epoch",
    "drop_page_cache",
    "hmgraph_epoch",
    "new_model",
    "open_memmap",
    "progress",
    "train_step",
]


#: DGL ``DataLoader(num_workers=...)`` of every DGL baseline: DGL's
#: default. Its CPU prefetch (``num_workers=1``, two batches ahead) was
#: slower on this 2-core machine: 0.60 s against 0.31 s an epoch of 8
#: batches of 128 on synth-tiny, 6.9 s against 5.7 s for 10 batches of
#: 1024 on synth-small (bench/README.md).
DGL_WORKERS = 0

LR, DROPOUT = 0.003, 0.5


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


def progress(total: int, desc: str, enabled: bool = True):
    """A progress bar on stderr that leaves no line behind."""
    return tqdm(total=total, desc=desc, unit="batch", leave=False,
                mininterval=2.0, disable=not enabled)


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

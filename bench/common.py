"""Shared parts of the benchmarks: workloads, baselines, isolation, tables.

Every bench script builds on this module instead of its own copies:

* `add_workload_arguments`: the workload flags (root, fanouts parsed by
  the CLI's own `parse_fanouts`, batch size, hidden width, seed,
  batches);
* `dgl_epoch`: the baseline a DGL user runs today, DGL's own
  ``dgl.dataloading.DataLoader`` with its defaults, rows gathered from an
  in-memory tensor or from an ``np.memmap`` of the feature file (pages
  dropped once before the epoch, as on a file larger than RAM);
* `isolated`: one configuration per fresh process, so peak RSS and the
  page cache are each configuration's own;
* `disk_limits`: the disk's measured random-read and sequential limits;
* `markdown_table` and `write_results`: one table format, files written
  to a temporary name and renamed.

Counters (bytes, requests, rows) are exact; times are ratios within one
invocation.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from hmgraph.cli import parse_fanouts
from hmgraph.train import peak_rss_bytes

__all__ = [
    "add_workload_arguments",
    "dgl_epoch",
    "disk_limits",
    "drop_page_cache",
    "isolated",
    "markdown_table",
    "parse_fanouts",
    "peak_rss_bytes",
    "read_bytes",
    "write_results",
]

RESULTS = Path(__file__).resolve().parent / "results"


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every benchmark shares, with the project's defaults."""
    parser.add_argument("--root", default="data",
                        help="folder holding datasets (default: data)")
    parser.add_argument("--fanouts", type=parse_fanouts, default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, default=0,
                        help="batches timed per configuration (0: the "
                        "whole epoch); the same for every configuration")


def read_bytes() -> int:
    """Bytes this process has read from block devices (``/proc/self/io``)."""
    return int(psutil.Process().io_counters().read_bytes)


def drop_page_cache(path: str | os.PathLike) -> None:
    """Evict ``path``'s pages from the OS page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def isolated(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a fresh process; its return value.

    ``spawn``: the child imports anew and shares no memory, so its peak
    RSS is its own. An exception in the child is raised here as a
    ``RuntimeError`` naming it; a child that dies (the OOM killer's
    SIGKILL) is reported with its exit code instead of waited on.
    """
    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child,
                            args=(send, function, args, kwargs))
    child.start()
    send.close()
    try:
        ok, value = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(
            f"{function.__name__} died with exit code {child.exitcode} "
            f"(-9: killed, e.g. by the OOM killer)") from None
    child.join()
    if not ok:
        raise RuntimeError(value)
    return value


def _child(send, function, args, kwargs) -> None:
    try:
        send.send((True, function(*args, **kwargs)))
    except Exception as err:  # noqa: BLE001 - carried to the parent
        send.send((False, f"{type(err).__name__}: {err}"))
    finally:
        send.close()


def dgl_epoch(dataset, sampler, model, optimizer, features, *,
              batch_size: int, seed: int, max_batches: int = 0,
              max_seconds: float = 0.0, train: bool = True,
              desc: str = "dgl") -> dict:
    """One epoch of DGL's own loader, as a DGL user writes it.

    ``dgl.dataloading.DataLoader(graph, train_ids, sampler, batch_size,
    shuffle=True)`` with every other keyword at DGL's default; the input
    rows are gathered with ``features[input_nodes]`` (a tensor in memory
    or an ``np.memmap``) and labels likewise.

    Parameters
    ----------
    train : bool
        Run the model step (forward, backward, Adam); False times the
        loader alone (sample + gather), the regime of a GPU trainer.
    max_batches : int
        Stop after this many batches (0: the whole epoch).
    max_seconds : float
        Stop after the batch that ends past this many seconds (0: no cap);
        ``capped`` says whether it did.

    Returns
    -------
    dict
        ``batches``, ``input_rows``, ``seconds`` (``sample``, ``fetch``,
        ``train``, ``epoch``), ``seconds_per_batch``, ``capped`` and
        ``read_bytes`` from block devices.
    """
    import dgl
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    dgl.seed(seed)
    loader = dgl.dataloading.DataLoader(
        dataset.graph, dataset.split["train"], sampler,
        batch_size=batch_size, shuffle=True)
    total = len(loader) if not max_batches else min(max_batches,
                                                     len(loader))
    seconds = dict.fromkeys(("sample", "fetch", "train"), 0.0)
    batches = rows = 0
    before = read_bytes()
    start = time.perf_counter()
    bar = tqdm(total=total, desc=desc, leave=False)
    it = iter(loader)
    capped = False
    while batches < total:
        if max_seconds and time.perf_counter() - start > max_seconds:
            capped = True
            break
        t0 = time.perf_counter()
        input_nodes, output_nodes, blocks = next(it)
        t1 = time.perf_counter()
        x = torch.as_tensor(np.asarray(features[input_nodes.numpy()])) \
            if isinstance(features, np.ndarray) else features[input_nodes]
        y = dataset.labels[output_nodes]
        t2 = time.perf_counter()
        if train:
            loss = F.cross_entropy(model(blocks, x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        t3 = time.perf_counter()
        seconds["sample"] += t1 - t0
        seconds["fetch"] += t2 - t1
        seconds["train"] += t3 - t2
        batches += 1
        rows += int(input_nodes.numel())
        bar.update(1)
    bar.close()
    seconds["epoch"] = time.perf_counter() - start
    return {"batches": batches, "input_rows": rows, "seconds": seconds,
            "seconds_per_batch": seconds["epoch"] / max(batches, 1),
            "capped": capped, "read_bytes": read_bytes() - before}


def disk_limits(path: str | os.PathLike, seconds: float = 3.0,
                threads: int = 4) -> dict:
    """Measured limits of the disk that holds ``path`` (O_DIRECT reads).

    Random 4 KiB reads at queue depth ``threads`` for about ``seconds``,
    then sequential 4 MiB reads for about as long, both bypassing the page
    cache, and the logical block size O_DIRECT must align to.

    Returns
    -------
    dict
        ``random_4k_iops``, ``sequential_bytes_per_second``,
        ``logical_block_bytes``, ``threads``.
    """
    size = os.path.getsize(path)
    pages = max(1, size // 4096 - 1)
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)

    def random_reads(count: list, stop: float, seed: int) -> None:
        fd = os.open(path, flags)
        buffer = mmap.mmap(-1, 4096)
        rng = np.random.default_rng(seed)
        try:
            while time.perf_counter() < stop:
                for page in rng.integers(0, pages, 64):
                    os.preadv(fd, [buffer], int(page) * 4096)
                count[0] += 64
        finally:
            os.close(fd)

    stop = time.perf_counter() + seconds / 2
    counts = [[0] for _ in range(threads)]
    began = time.perf_counter()
    workers = [threading.Thread(target=random_reads, args=(c, stop, i))
               for i, c in enumerate(counts)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    iops = sum(c[0] for c in counts) / (time.perf_counter() - began)

    fd = os.open(path, flags)
    buffer = mmap.mmap(-1, 4 << 20)
    done, offset = 0, 0
    began = time.perf_counter()
    try:
        while time.perf_counter() - began < seconds / 2 and offset < size:
            done += os.preadv(fd, [buffer], offset)
            offset += 4 << 20
    finally:
        os.close(fd)
    bandwidth = done / (time.perf_counter() - began)
    block = int(Path(f"/sys/dev/block/{_device_of(path)}/queue/"
                     f"logical_block_size").read_text()) \
        if _device_of(path) else 512
    return {"random_4k_iops": round(iops), "threads": threads,
            "sequential_bytes_per_second": round(bandwidth),
            "logical_block_bytes": block}


def _device_of(path) -> str | None:
    """``major:minor`` of the block device holding ``path`` (or None)."""
    dev = os.stat(path).st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    if Path(f"/sys/dev/block/{name}/queue").is_dir():
        return name
    parent = Path(f"/sys/dev/block/{name}/..").resolve()
    if (parent / "queue").is_dir():
        return f"{os.major(dev)}:0"
    return None


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; numbers right-aligned, None shown as ``-``."""
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        return str(value)

    align = ["---:" if rows and isinstance(rows[0][i], (int, float))
             else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(result: dict, markdown: str, stem: str,
                  folder: str | os.PathLike = RESULTS) -> Path:
    """Write ``stem.json`` and ``stem.md`` atomically; the JSON's path."""
    from hmgraph.cache.format import atomic_path

    folder = Path(folder)
    json_path = folder / f"{stem}.json"
    with atomic_path(json_path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    with atomic_path(folder / f"{stem}.md") as tmp:
        tmp.write_text(markdown)
    return json_path

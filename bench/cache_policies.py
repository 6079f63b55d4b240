"""Cache policies with features on disk, judged in the disk's units.

One dataset, one invocation, one training epoch per configuration. The
node features are read from the dataset's feature file by hmgraph's
storage tier (``O_DIRECT``, so the OS page cache never serves them, in
the disk's logical blocks, planned and priced with its measured
`hmgraph.cache.disk.DiskModel`) through a feature cache of a device budget
(default 5 % of the feature bytes) and a host budget (default 10 % and
20 %). For each layout of the feature file (``--layouts``, default
``file,hot-first``), each host budget and each cache policy (``degree``,
``presample``, ``lru``, ``clock``, ``hmgraph``; ``none`` once per layout,
as it holds nothing) it builds an `hmgraph.DataLoader` (prefetch 2,
lookahead window 4, 32 profiling batches, window read planning with
``--staging`` of the host budget, default the loader's), records the
epoch's access trace and trains one epoch of GraphSAGE, the model and
optimizer of ``bench/baseline.py``.

Layouts: ``file`` reads the rows as stored; ``hot-first`` renumbers the
nodes hottest first by a profile of the epoch's batches
(`hmgraph.train._prepare`, as ``--layout hot-first`` of the CLI; the
rewritten file is kept under ``renumbered-hot-first/`` beside the feature
file and reused while the profile orders it the same). Layouts are built
before any epoch, and a layout's construction seconds (profile and
rewrite) are recorded beside every record and target of that layout.

Per configuration it records

* storage, per epoch, in the disk's units (`StorageStats`): **bytes
  read**, **I/O requests** (``preadv`` calls), **read amplification**
  (bytes read / bytes of the rows served), **storage seconds** (wall time
  in the tier's reads) and the disk model's **model seconds** for the
  same requests and bytes, and their ratio; **bytes vs none**: the storage
  bytes over those of the ``none`` run in the same layout;
* as a proxy in rows, hit rates per tier: **device**, **host**,
  **staged** (rows an earlier batch's block reads brought along) and
  **storage** (rows read from the feature file), as shares of the unique
  input rows of each batch;
* **Belady** (rows): the hit rate of Belady's optimal offline policy
  replayed on the same run's trace with the plan's device + host rows as
  capacity, and the policy's storage row reads over Belady's,
  ``(1 - hit) / (1 - belady_hit)``;
* the plan's staging rows, host->device bytes (rows not served by the
  device tier);
* seconds per stage: **sample** and **fetch** (in the loader's threads),
  **wait** (training waiting for a batch), **train** (forward, loss,
  backward, step) and the epoch's wall time; the loader's construction
  (profiling, plan, filling static caches) and the layout's are timed
  apart;
* the plan (`hmgraph.cache.plan.CachePlan.as_dict`), the disk model
  (`DiskModel.as_dict`) and the loader's counters.

Two baselines run once, in the file layout, with DGL's own
`dgl.dataloading.DataLoader` + `NeighborSampler` and the same training
step:

* **dgl in-memory**: features indexed in memory (the speed ceiling, as
  ``bench/baseline.py``);
* **dgl memmap floor**: features gathered from the same feature file
  through ``numpy.memmap``, with the file's pages dropped from memory
  before every batch (the out-of-core floor). ``posix_fadvise(DONTNEED)``
  alone leaves pages that the map still holds, so the map's pages are
  released first with ``madvise(MADV_DONTNEED)``. The drop itself is
  timed apart and not counted in the epoch; bytes read from disk come
  from ``/proc/self/io`` (requests are not known there).

Every configuration's epoch seconds are also given as a ratio to the
in-memory baseline and as a speedup over the memmap floor. The "Targets"
section judges hmgraph at the 20 % host budget in bytes and seconds: T1
storage bytes <= 0.70 x the no-cache run's (best layout), T2 read
amplification <= 1.5 (per layout), T3 storage seconds <= 1.25 x model
seconds (every hmgraph configuration), and its epoch time against both
baselines (per layout).

Output: ``--out`` (default ``bench/results/cache_policies.json``): the
configuration (the disk model included), the environment, the layouts and
one record per configuration, rewritten atomically after each
configuration (partial results survive a crash), and a markdown report
next to it with the same stem, whose table is also printed at the end.

Examples
--------
From the repository root::

    python bench/cache_policies.py          # synth-products, ~1 h a layout
    python bench/cache_policies.py --policies none,lru,hmgraph \\
        --host-budgets 20% --layouts hot-first --max-batches 20 \\
        --out /tmp/cp.json
    mkdir -p /tmp/hmg && python bench/cache_policies.py --quick \\
        --root /tmp/hmg
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import mmap
import os
import platform
import resource
import sys
import time
from pathlib import Path

# DGL's OpenMP runtime and torch's spin against each other on few cores;
# passive waiting keeps them from doing so. Must precede torch's import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dgl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

import hmgraph  # noqa: E402
from hmgraph import datasets  # noqa: E402
from hmgraph.cache.budget import parse_budget  # noqa: E402
from hmgraph.cache.disk import DiskModel  # noqa: E402
from hmgraph.cache.format import atomic_path, open_feature_file  # noqa: E402
from hmgraph.cache.plan import replay  # noqa: E402
from hmgraph.cache.policies import BeladyPolicy  # noqa: E402
from hmgraph.loader import STAGING_SHARE  # noqa: E402
from hmgraph.models import build_model  # noqa: E402
from hmgraph.train import TrainConfig, _prepare  # noqa: E402

SEED = 0
MODEL = "sage"
DROPOUT = 0.5
LR = 0.003
PREFETCH = 2
WINDOW = 4
PROFILE_BATCHES = 32
POLICY_NAMES = ("none", "degree", "presample", "lru", "clock", "hmgraph")
LAYOUT_NAMES = ("file", "hot-first")
IN_MEMORY = "dgl in-memory"
MEMMAP_FLOOR = "dgl memmap floor"
BASELINES = {"in-memory": IN_MEMORY, "memmap-floor": MEMMAP_FLOOR}
DEFAULT_OUT = "bench/results/cache_policies.json"
QUICK_OUT = "/tmp/cache_policies_quick.json"
#: Defaults of a full run and of ``--quick``, for options left unset.
DEFAULTS = {"dataset": "synth-products", "batch_size": 1024,
            "max_batches": None, "out": DEFAULT_OUT}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 5,
         "out": QUICK_OUT}
#: Limits of the "Targets" section, judged at `TARGET_HOST_BUDGET`.
TARGET_HOST_BUDGET = "20%"
BYTES_VS_NONE_MAX = 0.70
AMPLIFICATION_MAX = 1.5
SECONDS_VS_MODEL_MAX = 1.25
VS_IN_MEMORY_MAX = 1.5
VS_FLOOR_MIN = 3.0

TABLE_COLUMNS = (
    "config", "host budget", "storage GB", "I/O requests",
    "read amp (x)", "storage s", "model s", "storage / model (x)",
    "bytes vs none (x)", "staging rows", "device hit % (rows)",
    "host hit % (rows)", "staged hit % (rows)", "storage hit % (rows)",
    "Belady hit %", "storage rows vs Belady (x)", "host->device GB",
    "epoch s", "vs in-memory (x)", "vs memmap floor (x faster)",
    "build s (layout + loader)",
)


class UsageError(ValueError):
    """A command-line value is unusable; the message says which and why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name. Default: ``sys.argv[1:]``.

    Returns
    -------
    argparse.Namespace
        With ``fanouts``, ``policies``, ``host_budgets`` and ``layouts`` as
        lists (budgets as given, e.g. ``"10%"``), ``staging`` a float or
        None (the loader's default), and unset options filled in from
        `DEFAULTS` or, with ``--quick``, from `QUICK`.

    Raises
    ------
    UsageError
        A value is out of range or malformed, a dataset or policy unknown,
        or the root missing.
    """
    parser = argparse.ArgumentParser(
        description="Cache policies with features on disk (O_DIRECT): "
        "storage bytes, requests and seconds against the disk's model and "
        "the no-cache run, per layout; hit rates against Belady; epoch "
        "time against DGL in memory and DGL over a page-cache-dropped "
        "memmap.",
    )
    parser.add_argument("--dataset", default=None,
                        help="dataset name (default: synth-products; "
                        "--quick: synth-tiny)")
    parser.add_argument("--root", default="data",
                        help="folder holding the datasets (default: data)")
    parser.add_argument("--device-budget", default="5%",
                        help="device cache budget: a share of the feature "
                        "bytes (5%%) or bytes with a unit (default: 5%%)")
    parser.add_argument("--host-budgets", default="10%,20%",
                        help="comma-separated host cache budgets, each a "
                        "share or bytes (default: 10%%,20%%)")
    parser.add_argument("--policies", default=",".join(POLICY_NAMES),
                        help="comma-separated cache policies of "
                        f"{', '.join(POLICY_NAMES)} (default: all)")
    parser.add_argument("--layouts", default=",".join(LAYOUT_NAMES),
                        help="comma-separated layouts of the feature file, "
                        "one pass over the configurations each: file (as "
                        "stored), hot-first (renumbered hottest first by a "
                        "profile; rewritten once) (default: file,hot-first)")
    parser.add_argument("--baselines", default="in-memory,memmap-floor",
                        help="comma-separated DGL baselines to run: "
                        "in-memory, memmap-floor, or none (default: both; "
                        "the memmap floor takes minutes a batch where a "
                        "batch touches most of a large file)")
    parser.add_argument("--staging", type=float, default=None,
                        help="share of the host budget in [0, 1) staged for "
                        "window read planning (default: the loader's, "
                        f"{STAGING_SHARE:g} with features on disk)")
    parser.add_argument("--fanouts", default="15,10,5",
                        help="neighbours per layer, input layer first as in "
                        "DGL (default: 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="seed nodes per batch (default: 1024; "
                        "--quick: 128)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="batches per epoch: trains on a seeded random "
                        "subset of max-batches x batch-size train seeds, "
                        "so every epoch is whole (default: all seeds; "
                        "--quick: 5)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden feature size (default: 256)")
    parser.add_argument("--out", default=None,
                        help=f"JSON result file (default: {DEFAULT_OUT}; "
                        f"--quick: {QUICK_OUT}); the markdown report goes "
                        "next to it")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: synth-tiny, batch 128, 5 batches")
    args = parser.parse_args(argv)

    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dataset not in datasets.known_datasets():
        raise UsageError(
            f"unknown dataset {args.dataset!r}; known: "
            f"{', '.join(datasets.known_datasets())}"
        )
    args.fanouts = parse_fanouts(args.fanouts)
    args.policies = parse_choices("--policies", args.policies, "policy",
                                  POLICY_NAMES)
    args.layouts = parse_choices("--layouts", args.layouts, "layout",
                                 LAYOUT_NAMES)
    args.baselines = [] if args.baselines == "none" else parse_choices(
        "--baselines", args.baselines, "baseline", [*BASELINES, "none"])
    if args.staging is not None and not 0.0 <= args.staging < 1.0:
        raise UsageError(
            f"--staging must be a share of the host budget in [0, 1); got "
            f"{args.staging:g}"
        )
    args.host_budgets = parse_list("--host-budgets", args.host_budgets)
    for flag, text in [("--device-budget", args.device_budget),
                       *(("--host-budgets", t) for t in args.host_budgets)]:
        try:
            parse_budget(text, 1)
        except ValueError as err:
            raise UsageError(f"{flag}: {err}") from None
    for flag, value in [("--batch-size", args.batch_size),
                        ("--hidden", args.hidden),
                        ("--max-batches", args.max_batches or 1)]:
        if value < 1:
            raise UsageError(f"{flag} must be a positive int; got {value}")
    if not Path(args.root).is_dir():
        raise UsageError(
            f"dataset root {args.root!r} does not exist; pass an existing "
            f"--root"
        )
    if Path(args.out).suffix != ".json":
        raise UsageError(f"--out must end in .json; got {args.out!r}")
    return args


def parse_list(flag: str, text: str) -> list[str]:
    """Split a comma-separated option; refuse an empty list or repeats."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UsageError(f"{flag} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} repeats a value: {text!r}")
    return items


def parse_choices(flag: str, text: str, kind: str, names) -> list[str]:
    """A comma-separated list of ``names``; a one-line error otherwise."""
    chosen = parse_list(flag, text)
    for name in chosen:
        if name not in names:
            raise UsageError(
                f"unknown {kind} {name!r} in {flag}; available: "
                f"{', '.join(names)}"
            )
    return chosen


def parse_fanouts(text: str) -> list[int]:
    """Parse ``"15,10,5"`` into ``[15, 10, 5]`` (as bench/baseline.py).

    Raises
    ------
    UsageError
        If a part is not an int, is 0 or below -1, or there is none.
    """
    try:
        fanouts = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--fanouts must be comma-separated ints such as 15,10,5; "
            f"got {text!r}"
        ) from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise UsageError(
            f"--fanouts must be positive ints (or -1 for all neighbours); "
            f"got {text!r}"
        )
    return fanouts


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (2**20 bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def disk_read_bytes() -> int:
    """Bytes this process has had read from storage (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes line")


# --------------------------------------------------------------------------
# Training


def new_model(dataset, args) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A freshly seeded model and optimizer, as in bench/baseline.py."""
    torch.manual_seed(SEED)
    dgl.seed(SEED)
    model = build_model(
        MODEL, dataset.feat_dim, args.hidden, dataset.num_classes,
        num_layers=len(args.fanouts), dropout=DROPOUT,
    )
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def train_step(model, optimizer, blocks, x, y) -> float:
    """Forward, cross-entropy loss, backward and step; returns the loss."""
    logits = model(blocks, x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss)


def progress(total: int, desc: str) -> tqdm:
    """A progress bar on stderr."""
    return tqdm(total=total, desc=desc, unit="batch", mininterval=5.0,
                file=sys.stderr)


class MemmapRows:
    """Rows gathered from a feature file's memmap, cold on every batch.

    `drop` releases the map's pages (``madvise(MADV_DONTNEED)``) and then
    the file's page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``): the
    fadvise alone keeps every page that the map still holds.
    """

    def __init__(self, path: Path):
        self.manifest, self.rows = open_feature_file(path)
        self._fd = os.open(path, os.O_RDONLY)

    def drop(self) -> None:
        """Drop the file's pages from memory."""
        self.rows._mmap.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.rows[ids.numpy()])

    def close(self) -> None:
        """Drop the pages and close the file."""
        self.drop()
        os.close(self._fd)
        del self.rows


def run_dgl(dataset, seeds, args, memmap: bool) -> dict:
    """One epoch with DGL's loader; features in memory or on a memmap.

    Parameters
    ----------
    dataset : hmgraph.datasets.NodeDataset
    seeds : torch.Tensor
        Train seeds of the epoch.
    args : argparse.Namespace
    memmap : bool
        Gather rows from the feature file through a memmap whose pages
        are dropped before every batch (else index the in-memory tensor).

    Returns
    -------
    dict
        One record (see the module docstring); ``seconds`` holds
        ``sample`` (DGL's ``next()``), ``fetch``, ``train``, ``drop``
        (page dropping, memmap only) and ``epoch`` (wall time less
        ``drop``).
    """
    name = MEMMAP_FLOOR if memmap else IN_MEMORY
    model, optimizer = new_model(dataset, args)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    loader = dgl.dataloading.DataLoader(
        dataset.graph, seeds, sampler, batch_size=args.batch_size,
        shuffle=True, drop_last=False, num_workers=0, device="cpu",
    )
    feat = MemmapRows(dataset.feature_path) if memmap else dataset.features
    label = dataset.labels
    row_bytes = dataset.manifest.row_bytes
    seconds = dict.fromkeys(("sample", "fetch", "train", "drop"), 0.0)
    batches = input_rows = 0
    loss_sum = 0.0
    model.train()
    bar = progress(len(loader), name)
    read_before = disk_read_bytes()
    start = time.perf_counter()
    it = iter(loader)
    try:
        while True:
            # (1) sample: DGL's iterator draws seeds and samples blocks.
            t0 = time.perf_counter()
            try:
                input_nodes, output_nodes, blocks = next(it)
            except StopIteration:
                seconds["sample"] += time.perf_counter() - t0
                break
            # (2) drop (memmap only): no page of the file left in memory.
            t1 = time.perf_counter()
            if memmap:
                feat.drop()
            # (3) fetch: gather the input rows and the labels.
            t2 = time.perf_counter()
            x = feat[input_nodes]
            y = label[output_nodes]
            # (4) train.
            t3 = time.perf_counter()
            loss_sum += train_step(model, optimizer, blocks, x, y)
            t4 = time.perf_counter()
            seconds["sample"] += t1 - t0
            seconds["drop"] += t2 - t1
            seconds["fetch"] += t3 - t2
            seconds["train"] += t4 - t3
            batches += 1
            input_rows += int(input_nodes.numel())
            bar.update(1)
        seconds["epoch"] = time.perf_counter() - start - seconds["drop"]
        read_bytes = disk_read_bytes() - read_before
    finally:
        bar.close()
        if memmap:
            feat.close()
    rates = {"device": 0.0, "host": 0.0 if memmap else 1.0,
             "staged": 0.0, "storage": 1.0 if memmap else 0.0}
    # The floor's reads, from the kernel's per-process counter: bytes
    # only (the page cache's readahead decides the requests).
    storage = {
        "rows_read": input_rows,
        "bytes_read": read_bytes,
        "useful_bytes": input_rows * row_bytes,
        "amplification": read_bytes / (input_rows * row_bytes)
        if input_rows else 0.0,
        "io_requests": None,
        "seconds": None,
        "model_seconds": None,
        "seconds_vs_model": None,
        "source": "/proc/self/io read_bytes",
    } if memmap else None
    return {
        "config": name,
        "kind": "dgl",
        "policy": None,
        "layout": "file",
        "host_budget": None,
        "batches": batches,
        "rows_requested": input_rows,
        "hit_rate": rates,
        "belady": None,
        "storage_rows_vs_belady": None,
        "storage": storage,
        "staging_rows": 0,
        # Every input row crosses to the training device.
        "host_to_device_bytes": input_rows * row_bytes,
        "seconds": seconds,
        "construct_seconds": 0.0,
        "layout_seconds": 0.0,
        "mean_loss": loss_sum / batches if batches else 0.0,
        "peak_rss_mb": peak_rss_mb(),
    }


def run_hmgraph(dataset, seeds, args, policy: str, device_budget: int,
                host_budget_text: str | None, host_budget: int,
                belady_memo: dict, layout: dict) -> dict:
    """One epoch with `hmgraph.DataLoader` over the O_DIRECT storage tier.

    Parameters
    ----------
    dataset : hmgraph.datasets.NodeDataset
        The dataset in the layout's ids (its ``feature_path`` is read).
    seeds : torch.Tensor
        Train seeds of the epoch, in the layout's ids.
    args : argparse.Namespace
    policy : str
        Cache policy name.
    device_budget, host_budget : int
        Budgets in bytes.
    host_budget_text : str or None
        The host budget as given (``"10%"``); None for ``none``.
    belady_memo : dict
        Belady hit rates by (trace digest, capacity), shared across calls:
        the same trace and capacity are replayed once.
    layout : dict
        The layout's record (``name``, construction ``seconds``; see
        `prepare_layout`).

    Returns
    -------
    dict
        One record (see the module docstring).
    """
    config = f"{policy} / {layout['name']}"
    label = config if host_budget_text is None else \
        f"{config} host {host_budget_text}"
    # (1) Build the loader: profiling, plan and static fill, timed.
    model, optimizer = new_model(dataset, args)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    start = time.perf_counter()
    loader = hmgraph.DataLoader(
        dataset.graph, seeds, sampler, features=dataset.feature_path,
        labels=dataset.labels, batch_size=args.batch_size, shuffle=True,
        seed=SEED, cache=policy, device_budget_bytes=device_budget,
        host_budget_bytes=host_budget, prefetch=PREFETCH, window=WINDOW,
        profile_batches=PROFILE_BATCHES, staging=args.staging,
    )
    construct_seconds = time.perf_counter() - start
    try:
        storage = loader.stats.storage
        warm_storage = storage.as_dict() if storage is not None else None
        direct = bool(getattr(loader.cache.source, "direct", False))
        disk = getattr(loader.cache.source, "disk", None)
        # (2) Train one epoch, recording the trace.
        dgl.seed(SEED)  # every configuration samples the same batches
        loader.stats.reset()
        loader.trace = []
        model.train()
        train_seconds = loss_sum = 0.0
        batches = 0
        bar = progress(len(loader), label)
        start = time.perf_counter()
        for batch in loader:
            t0 = time.perf_counter()
            loss_sum += train_step(model, optimizer, batch.blocks, batch.x,
                                   batch.y)
            train_seconds += time.perf_counter() - t0
            batches += 1
            bar.update(1)
        epoch_seconds = time.perf_counter() - start
        bar.close()
        stats = loader.stats.as_dict()
        plan = loader.plan
        trace = loader.trace
    finally:
        loader.close()
    del loader
    # (3) Belady on this run's trace, capacity = the plan's cached rows.
    capacity = plan.device_rows + plan.host_rows
    belady = belady_hit_rate(trace, plan.num_rows, capacity, belady_memo)
    del trace
    cache = stats["cache"]
    rates = {"device": cache["hit_rate"].get("device", 0.0),
             "host": cache["hit_rate"].get("host", 0.0),
             "staged": cache["hit_rate"].get("staged", 0.0),
             "storage": cache["hit_rate"].get("source", 0.0)}
    seconds = dict(stats["seconds"], train=train_seconds,
                   epoch=epoch_seconds)
    return {
        "config": config,
        "kind": "hmgraph",
        "policy": policy,
        "layout": layout["name"],
        "host_budget": host_budget_text,
        "host_budget_bytes": host_budget if host_budget_text else 0,
        "device_budget_bytes": device_budget if policy != "none" else 0,
        "batches": batches,
        "rows_requested": cache["rows_requested"],
        "hit_rate": rates,
        "belady": belady,
        "storage_rows_vs_belady": rows_vs_belady(rates["storage"],
                                                 belady["hit_rate"]),
        "storage": stats.get("storage"),
        "staging_rows": plan.staging_rows,
        "host_to_device_bytes": cache["bytes"].get("host->device", 0),
        "seconds": seconds,
        "construct_seconds": construct_seconds,
        "layout_seconds": layout["seconds"],
        "warm_storage": warm_storage,
        "direct": direct,
        "disk": disk.as_dict() if disk is not None else None,
        "plan": plan.as_dict(),
        "loader": stats,
        "mean_loss": loss_sum / batches if batches else 0.0,
        "peak_rss_mb": peak_rss_mb(),
    }


def belady_hit_rate(trace: list, num_rows: int, capacity: int,
                    memo: dict) -> dict:
    """Belady's hit rate on ``trace`` with ``capacity`` rows.

    Returns
    -------
    dict
        ``capacity_rows``, ``hit_rate``, ``seconds`` (replay time, 0.0
        when memoised) and ``memoised``.
    """
    digest = hashlib.blake2b(digest_size=16)
    for ids in trace:
        digest.update(ids.numpy().tobytes())
        digest.update(b"|")
    key = (digest.hexdigest(), capacity)
    if key in memo:
        return {"capacity_rows": capacity, "hit_rate": memo[key],
                "seconds": 0.0, "memoised": True}
    start = time.perf_counter()
    if capacity == 0:
        rate = 0.0
    else:
        policy = BeladyPolicy(num_rows, capacity)
        policy.set_trace(trace)
        rate = replay(policy, trace)
        del policy
    memo[key] = rate
    return {"capacity_rows": capacity, "hit_rate": rate,
            "seconds": time.perf_counter() - start, "memoised": False}


def rows_vs_belady(storage_rate: float, belady_rate: float) -> float | None:
    """Storage row reads over Belady's: ``(1 - hit) / (1 - belady_hit)``."""
    if belady_rate >= 1.0:
        return None if storage_rate > 0 else 1.0
    return storage_rate / (1.0 - belady_rate)


# --------------------------------------------------------------------------
# Reporting


def add_ratios(records: list[dict]) -> None:
    """Set each record's epoch ratios and its storage bytes vs ``none``.

    ``vs_in_memory`` is the epoch over the in-memory baseline's,
    ``vs_memmap_floor`` the floor's epoch over this one, and
    ``storage_vs_none`` the storage bytes over those of the ``none`` run
    in the same layout; each None where a term is missing or zero.
    """
    epochs = {r["config"]: r["seconds"]["epoch"] for r in records
              if r["kind"] == "dgl"}
    memory, floor = epochs.get(IN_MEMORY), epochs.get(MEMMAP_FLOOR)
    none_bytes = {r["layout"]: r["storage"]["bytes_read"] for r in records
                  if r["policy"] == "none" and r["storage"]}
    for r in records:
        epoch = r["seconds"]["epoch"]
        r["vs_in_memory"] = epoch / memory if memory else None
        r["vs_memmap_floor"] = floor / epoch if floor and epoch else None
        base = none_bytes.get(r["layout"])
        r["storage_vs_none"] = r["storage"]["bytes_read"] / base \
            if r["storage"] and base else None


def _built(record: dict) -> str:
    """A record's construction seconds, for beside its ratios."""
    return (f"build {record['layout_seconds']:.1f} s layout + "
            f"{record['construct_seconds']:.1f} s loader")


def targets(records: list[dict], layouts: list[str]) -> list[dict]:
    """The targets at `TARGET_HOST_BUDGET`, each with its value and status.

    * T1: hmgraph's storage bytes per epoch over the ``none`` run's in the
      same layout, <= `BYTES_VS_NONE_MAX`, judged on the best layout;
    * T2: hmgraph's read amplification, <= `AMPLIFICATION_MAX`, per
      layout;
    * T3: storage seconds over the disk model's seconds, <=
      `SECONDS_VS_MODEL_MAX`, the worst of every hmgraph configuration
      (all host budgets and layouts);
    * hmgraph's epoch over the in-memory baseline's (<=
      `VS_IN_MEMORY_MAX`) and the memmap floor's over hmgraph's (>=
      `VS_FLOOR_MIN`), per layout.

    Each target's ``note`` gives the construction seconds (layout and
    loader) of the configurations it judges. A target whose
    configurations did not run has ``value`` None and ``status``
    ``"not run"``.
    """
    budget = TARGET_HOST_BUDGET
    ours = {r["layout"]: r for r in records if r["policy"] == "hmgraph"
            and r["host_budget"] == budget}
    ours = {name: ours[name] for name in layouts if name in ours}
    result = []
    # T1: bytes against the no-cache run, the best layout.
    ratios = {name: r["storage_vs_none"] for name, r in ours.items()
              if r["storage_vs_none"] is not None}
    best = min(ratios, key=ratios.get) if ratios else None
    result.append(_target(
        f"T1 host {budget}: hmgraph storage bytes / no-cache storage "
        f"bytes, best layout: {best or '-'}",
        ratios.get(best), "<=", BYTES_VS_NONE_MAX,
        "; ".join(f"{name} {_fmt(r['storage_vs_none'], '.3f')} "
                  f"({_built(r)})" for name, r in ours.items()) or None))
    # T2: read amplification, per layout.
    for name in layouts:
        r = ours.get(name)
        result.append(_target(
            f"T2 host {budget} {name}: hmgraph read amplification",
            r and (r["storage"] or {}).get("amplification"), "<=",
            AMPLIFICATION_MAX, r and _built(r)))
    # T3: storage seconds against the model's, the worst configuration.
    timed = [r for r in records if r["policy"] == "hmgraph"
             and (r["storage"] or {}).get("seconds_vs_model") is not None]
    worst = max(timed, key=lambda r: r["storage"]["seconds_vs_model"],
                default=None)
    result.append(_target(
        "T3 every hmgraph configuration: storage seconds / model seconds"
        + (f", worst: {worst['config']} host {worst['host_budget']}"
           if worst else ""),
        worst and worst["storage"]["seconds_vs_model"], "<=",
        SECONDS_VS_MODEL_MAX,
        worst and f"{len(timed)} configurations; worst's {_built(worst)}"))
    # Epoch time against both baselines, per layout.
    for name in layouts:
        r = ours.get(name)
        result.append(_target(
            f"host {budget} {name}: hmgraph epoch / in-memory epoch",
            r and r["vs_in_memory"], "<=", VS_IN_MEMORY_MAX,
            r and _built(r)))
        result.append(_target(
            f"host {budget} {name}: memmap floor epoch / hmgraph epoch",
            r and r["vs_memmap_floor"], ">=", VS_FLOOR_MIN,
            r and _built(r)))
    return result


def _target(name: str, value, op: str, limit: float,
            note: str | None = None) -> dict:
    if value is None:
        status = "not run"
    elif op == "<=":
        status = "PASS" if value <= limit else "MISS"
    else:
        status = "PASS" if value >= limit else "MISS"
    return {"target": name, "value": value, "op": op, "limit": limit,
            "status": status, "note": note}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _gb(nbytes) -> str:
    return _fmt(None if nbytes is None else nbytes / 1e9, ".3f")


def markdown_table(records: list[dict]) -> str:
    """One markdown row per configuration, under `TABLE_COLUMNS`."""
    lines = [
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "|".join("---" if col in ("config", "host budget") else "---:"
                       for col in TABLE_COLUMNS) + "|",
    ]
    for r in records:
        rate, storage = r["hit_rate"], r["storage"] or {}
        belady = r["belady"]
        cells = [
            r["config"], r["host_budget"] or "-",
            _gb(storage.get("bytes_read")),
            _fmt(storage.get("io_requests"), ","),
            _fmt(storage.get("amplification"), ".2f"),
            _fmt(storage.get("seconds"), ".2f"),
            _fmt(storage.get("model_seconds"), ".2f"),
            _fmt(storage.get("seconds_vs_model"), ".2f"),
            _fmt(r.get("storage_vs_none"), ".3f"),
            "-" if r["kind"] == "dgl" else f"{r['staging_rows']:,}",
            f"{100 * rate['device']:.1f}", f"{100 * rate['host']:.1f}",
            f"{100 * rate['staged']:.1f}", f"{100 * rate['storage']:.1f}",
            _fmt(belady and 100 * belady["hit_rate"], ".1f"),
            _fmt(r["storage_rows_vs_belady"], ".3f"),
            _gb(r["host_to_device_bytes"]),
            f"{r['seconds']['epoch']:.2f}",
            _fmt(r.get("vs_in_memory"), ".2f"),
            _fmt(r.get("vs_memmap_floor"), ".2f"),
            "-" if r["kind"] == "dgl" else
            f"{r['layout_seconds']:.1f} + {r['construct_seconds']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_section(rows: list[dict]) -> str:
    """The "Targets" list."""
    lines = []
    for t in rows:
        value = _fmt(t["value"], ".3f")
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"- {t['target']}: {value} (target {t['op']} "
                     f"{t['limit']:g}): **{t['status']}**{note}")
    return "\n".join(lines) + "\n"


def _layouts_text(layouts: dict) -> str:
    """The layouts run and what building each cost."""
    parts = []
    for name, record in layouts.items():
        if name == "file":
            parts.append("file (rows as stored)")
        else:
            parts.append(
                f"{name} (profile of {record['profile_batches']} batches "
                f"and {'a reused' if record['reused'] else 'a rewritten'} "
                f"file: {record['seconds']:.1f} s)")
    return ", ".join(parts) or "none yet"


def _disk_text(disk: dict | None) -> str:
    """One line on the disk model the storage tier planned with."""
    if disk is None:
        return "Disk model: none yet (no storage-tier run)."
    keys = ("block_bytes", "iops", "bandwidth", "queue_depth", "device")
    model = DiskModel(**{k: disk[k] for k in keys})
    return (f"Disk model of the storage tier: {model.describe()}; model "
            f"seconds = requests / IOPS + bytes / bandwidth.")


def markdown_report(result: dict) -> str:
    """The markdown file: setup, disk model, table, targets."""
    c, env = result["config"], result["environment"]
    fanouts = ",".join(str(f) for f in c["fanouts"])
    staging = (f"{c['staging']:g}" if c["staging"] is not None else
               f"the loader's default ({c['staging_default']:g})")
    setup = (
        f"{c['dataset']} ({c['train_seeds']:,} train seeds, "
        f"{c['batches_per_epoch']} batches of {c['batch_size']}), "
        f"NeighborSampler({fanouts}), {c['model']} hidden {c['hidden']}, "
        f"one epoch per configuration; features "
        f"{c['feature_bytes'] / 1e9:.3g} GB on disk "
        f"(O_DIRECT: {env['o_direct']}); device budget "
        f"{c['device_budget']} ({c['device_budget_bytes'] / 1e6:.1f} MB); "
        f"prefetch {c['prefetch']}, window {c['window']}, "
        f"{c['profile_batches']} profiling batches, staging {staging} of "
        f"the host budget; layouts: {_layouts_text(result['layouts'])}; "
        f"torch {env['torch']}, dgl {env['dgl']}, "
        f"{env['torch_num_threads']} threads, {env['cpu_count']} CPUs."
    )
    notes = (
        "Storage columns are per epoch, in the disk's units: bytes and I/O "
        "requests (preadv calls) of the storage tier, read amplification "
        "(bytes read / bytes of the rows served), storage seconds (wall "
        "time in the tier's reads) against the disk model's seconds for "
        "the same requests and bytes, and bytes vs none (storage bytes / "
        "the no-cache run's in the same layout). Reads while building the "
        "loader (static fill) are not counted (`warm_storage` in the "
        "JSON). Hit rates are a proxy in rows: shares of each batch's "
        "unique input rows per tier (staged: rows an earlier batch's block "
        "reads brought along); Belady: the optimal offline policy on the "
        "run's own trace with the plan's device + host rows; storage rows "
        "vs Belady is (1 - hit) / (1 - Belady hit). Epoch seconds exclude "
        "construction: build s is the layout's (profile and rewrite, once "
        "per layout) + the loader's (profiling, plan, static fill). The "
        "in-memory baseline counts every row as a host hit and reads no "
        "storage; the memmap floor reads every row through the page cache "
        "(bytes from /proc/self/io, requests unknown, page drops not "
        "timed). host->device counts every row not served by the device "
        "tier."
    )
    loads = [value for r in result["records"] if "loadavg" in r
             for value in (r["loadavg"]["before"][0],
                           r["loadavg"]["after"][0])]
    if loads:
        notes += (f" The machine is shared: its 1-minute load average was "
                  f"{min(loads):.1f} to {max(loads):.1f} around the runs "
                  f"({env['cpu_count']} CPUs); see `loadavg` per record.")
    table = markdown_table(result["records"])
    return (f"# Cache policies\n\n{setup}\n\n{_disk_text(c['disk_model'])}"
            f"\n\n{table}\n{notes}\n\n## Targets\n\n"
            f"{targets_section(result['targets'])}")


def write_results(result: dict, out: Path) -> Path:
    """Write the JSON and the markdown report, each atomically.

    Returns
    -------
    pathlib.Path
        Path of the markdown file (``out`` with suffix ``.md``).
    """
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    md = out.with_suffix(".md")
    with atomic_path(md) as tmp:
        tmp.write_text(markdown_report(result))
    return md


def summary_line(r: dict) -> str:
    """One line per finished configuration, for the log."""
    rate, storage = r["hit_rate"], r["storage"] or {}
    text = (f"{r['config']:<22} host {r['host_budget'] or '-':>4}: "
            f"epoch {r['seconds']['epoch']:.1f} s, storage "
            f"{_gb(storage.get('bytes_read'))} GB in "
            f"{_fmt(storage.get('io_requests'), ',')} requests (amp "
            f"{_fmt(storage.get('amplification'), '.2f')}), hits device "
            f"{rate['device']:.1%} host {rate['host']:.1%} staged "
            f"{rate['staged']:.1%} storage {rate['storage']:.1%}")
    if r["belady"] is not None:
        text += (f", Belady {r['belady']['hit_rate']:.1%} (x"
                 f"{_fmt(r['storage_rows_vs_belady'], '.3f')})")
    return text


# --------------------------------------------------------------------------
# Main


def configurations(args) -> list[tuple[str, str | None, str]]:
    """(name, host budget, layout) in run order.

    The DGL baselines once (file layout), then per layout ``none`` and
    every other policy at every host budget.
    """
    runs = [(BASELINES[name], None, "file") for name in args.baselines]
    for layout in args.layouts:
        if "none" in args.policies:
            runs.append(("none", None, layout))
        for budget in args.host_budgets:
            runs += [(p, budget, layout) for p in args.policies
                     if p != "none"]
    return runs


def prepare_layout(name: str, dataset, seeds: torch.Tensor, args):
    """The dataset and seeds in a layout's ids, and the layout's record.

    ``file`` is the dataset as loaded. ``hot-first`` is what training's
    ``--layout hot-first`` builds (`hmgraph.train._prepare`): nodes
    renumbered hottest first by a profile of ``PROFILE_BATCHES`` batches,
    the feature file rewritten once under ``renumbered-hot-first/`` (and
    reused while the profile orders it the same).

    Parameters
    ----------
    name : str
        A name of `LAYOUT_NAMES`.
    dataset : hmgraph.datasets.NodeDataset
        The dataset as loaded.
    seeds : torch.Tensor
        The epoch's train seeds: the profile samples batches of these, as
        the loaders' own profiles do.
    args : argparse.Namespace

    Returns
    -------
    tuple
        ``(dataset, seeds, record)``. The record has ``name`` and
        ``seconds`` (construction: 0.0 for ``file``; the profile and the
        rewrite for ``hot-first``), and for ``hot-first`` also ``reused``,
        ``path``, ``profile_batches`` and ``formats_seconds`` (building
        the renumbered graph's sparse formats, outside ``seconds`` as the
        file layout's are).
    """
    if name == "file":
        return dataset, seeds, {"name": name, "seconds": 0.0,
                                "path": str(dataset.feature_path)}
    # A view for `_prepare`: features on disk only (the graph without its
    # feature rows, which renumbering would copy) and this epoch's seeds
    # as the train split, so the profile samples the batches trained on.
    graph = dataset.graph.local_var()
    graph.ndata.pop("feat", None)
    view = dataclasses.replace(dataset, graph=graph, features_on="disk",
                               split=dict(dataset.split, train=seeds))
    config = TrainConfig(
        dataset=args.dataset, root=str(args.root), features_on="disk",
        cache="hmgraph", layout=name, fanouts=list(args.fanouts),
        batch_size=args.batch_size, profile_batches=PROFILE_BATCHES,
        seed=SEED,
    )
    renumbered, _, record, _ = _prepare(config, view)
    start = time.perf_counter()
    renumbered.graph.create_formats_()
    record["formats_seconds"] = time.perf_counter() - start
    return renumbered, renumbered.split["train"], record


def train_seeds(dataset, args) -> torch.Tensor:
    """The train split, or a seeded subset of ``max_batches`` batches."""
    seeds = dataset.split["train"]
    if args.max_batches is None:
        return seeds
    keep = args.max_batches * args.batch_size
    if keep >= seeds.numel():
        return seeds
    generator = torch.Generator().manual_seed(SEED)
    chosen = torch.randperm(seeds.numel(), generator=generator)[:keep]
    return seeds[chosen.sort().values]


def main(argv: list[str] | None = None) -> int:
    """Run every configuration; return the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"cache_policies: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    # (1) The dataset, its sparse formats, the seeds and the budgets.
    t0 = time.perf_counter()
    try:
        # Rows in memory only for the in-memory baseline: the rest reads
        # the feature file.
        dataset = datasets.load(
            args.dataset, args.root, verify=False,
            features_on="memory" if "in-memory" in args.baselines
            else "disk")
    except ValueError as err:  # hmgraph's DatasetError and the like
        print(f"cache_policies: error: {args.dataset}: {err}",
              file=sys.stderr)
        return 2
    load_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    dataset.graph.create_formats_()
    prepare_seconds = time.perf_counter() - t0
    seeds = train_seeds(dataset, args)
    feature_bytes = dataset.manifest.data_bytes
    try:
        device_budget = parse_budget(args.device_budget, feature_bytes)
        host_budgets = {b: parse_budget(b, feature_bytes)
                        for b in args.host_budgets}
    except ValueError as err:
        print(f"cache_policies: error: {err}", file=sys.stderr)
        return 2
    batches = -(-seeds.numel() // args.batch_size)
    result = {
        "config": {
            "dataset": args.dataset, "root": str(args.root),
            "feature_path": str(dataset.feature_path),
            "feature_bytes": feature_bytes,
            "nodes": dataset.num_nodes,
            "edges": dataset.graph.num_edges(),
            "feat_dim": dataset.feat_dim,
            "train_seeds": int(seeds.numel()),
            "batches_per_epoch": batches,
            "max_batches": args.max_batches,
            "device_budget": args.device_budget,
            "device_budget_bytes": device_budget,
            "host_budgets": host_budgets,
            "policies": args.policies,
            "layouts": args.layouts,
            "staging": args.staging, "staging_default": STAGING_SHARE,
            "disk_model": None,
            "target_host_budget": TARGET_HOST_BUDGET,
            "fanouts": args.fanouts, "batch_size": args.batch_size,
            "model": MODEL, "hidden": args.hidden,
            "num_layers": len(args.fanouts), "dropout": DROPOUT,
            "optimizer": "adam", "lr": LR, "seed": SEED, "epochs": 1,
            "prefetch": PREFETCH, "window": WINDOW,
            "profile_batches": PROFILE_BATCHES, "device": "cpu",
            "quick": args.quick,
            "load_seconds": load_seconds,
            "prepare_seconds": prepare_seconds,
        },
        "environment": {
            "torch": torch.__version__, "dgl": dgl.__version__,
            "numpy": np.__version__, "hmgraph": hmgraph.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "o_direct": None,
        },
        "layouts": {},
        "records": [],
        "targets": [],
    }
    print(f"{args.dataset}: loaded in {load_seconds:.1f} s, "
          f"{batches} batches per epoch, features "
          f"{feature_bytes / 1e9:.2f} GB", flush=True)
    # (2) The layouts, before any epoch: after DGL's own loader has
    # sampled in this process, the layout's profile does not always repeat
    # (so the rewritten file would not be reused).
    layouts = {}
    for layout in args.layouts:
        layouts[layout] = prepare_layout(layout, dataset, seeds, args)
        result["layouts"][layout] = layouts[layout][2]
        print(f"layout {layout}: built in "
              f"{layouts[layout][2]['seconds']:.1f} s", flush=True)
    # (3) Every configuration, results rewritten after each.
    records, memo, md = result["records"], {}, out.with_suffix(".md")
    for name, budget, layout in configurations(args):
        baseline = name in (IN_MEMORY, MEMMAP_FLOOR)
        load_before = os.getloadavg()
        if baseline:
            record = run_dgl(dataset, seeds, args, memmap=name != IN_MEMORY)
        else:
            data, layout_seeds, layout_record = layouts[layout]
            record = run_hmgraph(
                data, layout_seeds, args, name, device_budget, budget,
                host_budgets.get(budget, 0), memo, layout_record)
            if result["environment"]["o_direct"] is None:
                result["environment"]["o_direct"] = record["direct"]
            if result["config"]["disk_model"] is None:
                result["config"]["disk_model"] = record["disk"]
        # Load averages (1, 5, 15 min) around the run: the machine is
        # shared, and other work there slows every stage.
        record["loadavg"] = {"before": load_before,
                             "after": os.getloadavg()}
        records.append(record)
        gc.collect()
        add_ratios(records)
        result["targets"] = targets(records, args.layouts)
        md = write_results(result, out)
        print(summary_line(record), flush=True)
    # (4) The table and the targets.
    print(markdown_table(records), end="")
    print(targets_section(result["targets"]), end="")
    print(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cache policies with features on disk, against Belady and two baselines.

One dataset, one invocation, one training epoch per configuration. The
node features are read from the dataset's feature file by hmgraph's
storage tier (``O_DIRECT``, so the OS page cache never serves them)
through a feature cache of a device budget (default 5 % of the feature
bytes) and a host budget (default 10 % and 20 %). For each host budget
and each cache policy (``degree``, ``presample``, ``lru``, ``clock``,
``hmgraph``; ``none`` once, as it holds nothing) it builds an
`hmgraph.DataLoader` (prefetch 2, lookahead window 4, 32 profiling
batches), records the epoch's access trace and trains one epoch of
GraphSAGE, the model and optimizer of ``bench/baseline.py``.

Per configuration it records

* hit rates per tier: **device**, **host** and **storage** (rows read
  from the feature file), as shares of the unique input rows of each
  batch;
* **Belady**: the hit rate of Belady's optimal offline policy replayed on
  the same run's trace with the plan's device + host rows as capacity,
  and the policy's storage row reads over Belady's,
  ``(1 - hit) / (1 - belady_hit)``;
* storage rows, pages and bytes read in the epoch, host->device bytes
  (rows not served by the device tier);
* seconds per stage: **sample** and **fetch** (in the loader's threads),
  **wait** (training waiting for a batch), **train** (forward, loss,
  backward, step) and the epoch's wall time; the loader's construction
  (profiling, plan, filling static caches) is timed apart;
* the plan (`hmgraph.cache.plan.CachePlan.as_dict`) and the loader's
  counters.

Two baselines run in the same invocation, with DGL's own
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
  from ``/proc/self/io``.

Every configuration's epoch seconds are also given as a ratio to the
in-memory baseline and as a speedup over the memmap floor, and a
"Targets" section checks hmgraph's storage reads against Belady's and its
epoch time against both baselines.

Output: ``--out`` (default ``bench/results/cache_policies.json``): the
configuration, the environment and one record per configuration,
rewritten atomically after each configuration (partial results survive a
crash), and a markdown report next to it with the same stem, whose table
is also printed at the end.

Examples
--------
From the repository root::

    python bench/cache_policies.py                  # synth-products, ~1 h
    python bench/cache_policies.py --policies lru,hmgraph \\
        --host-budgets 20% --max-batches 20 --out /tmp/cp.json
    mkdir -p /tmp/hmg && python bench/cache_policies.py --quick \\
        --root /tmp/hmg
"""

from __future__ import annotations

import argparse
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
from hmgraph.cache.format import atomic_path, open_feature_file  # noqa: E402
from hmgraph.cache.plan import replay  # noqa: E402
from hmgraph.cache.policies import BeladyPolicy  # noqa: E402
from hmgraph.models import build_model  # noqa: E402

SEED = 0
MODEL = "sage"
DROPOUT = 0.5
LR = 0.003
PREFETCH = 2
WINDOW = 4
PROFILE_BATCHES = 32
POLICY_NAMES = ("none", "degree", "presample", "lru", "clock", "hmgraph")
IN_MEMORY = "dgl in-memory"
MEMMAP_FLOOR = "dgl memmap floor"
DEFAULT_OUT = "bench/results/cache_policies.json"
QUICK_OUT = "/tmp/cache_policies_quick.json"
#: Defaults of a full run and of ``--quick``, for options left unset.
DEFAULTS = {"dataset": "synth-products", "batch_size": 1024,
            "max_batches": None, "out": DEFAULT_OUT}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 5,
         "out": QUICK_OUT}
#: Targets of the "Targets" section: (key, host budget or None, limit).
ROWS_VS_BELADY_MAX = 1.05
TARGET_HOST_BUDGET = "20%"
VS_IN_MEMORY_MAX = 1.5
VS_FLOOR_MIN = 3.0

TABLE_COLUMNS = (
    "config", "host budget", "device hit %", "host hit %", "storage hit %",
    "Belady hit %", "storage rows vs Belady (x)", "storage GB",
    "storage pages", "host->device GB", "epoch s", "vs in-memory (x)",
    "vs memmap floor (x faster)",
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
        With ``fanouts``, ``policies`` and ``host_budgets`` as lists
        (budgets as given, e.g. ``"10%"``), and unset options filled in
        from `DEFAULTS` or, with ``--quick``, from `QUICK`.

    Raises
    ------
    UsageError
        A value is out of range or malformed, a dataset or policy unknown,
        or the root missing.
    """
    parser = argparse.ArgumentParser(
        description="Cache policies with features on disk (O_DIRECT): hit "
        "rates against Belady, epoch time against DGL in memory and DGL "
        "over a page-cache-dropped memmap.",
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
    args.policies = parse_list("--policies", args.policies)
    for name in args.policies:
        if name not in POLICY_NAMES:
            raise UsageError(
                f"unknown policy {name!r} in --policies; available: "
                f"{', '.join(POLICY_NAMES)}"
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
    row_bytes = dataset.feat_dim * dataset.features.element_size()
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
             "storage": 1.0 if memmap else 0.0}
    return {
        "config": name,
        "kind": "dgl",
        "policy": None,
        "host_budget": None,
        "batches": batches,
        "rows_requested": input_rows,
        "hit_rate": rates,
        "belady": None,
        "storage_rows_vs_belady": None,
        "storage": {
            "rows_read": input_rows if memmap else 0,
            "bytes_read": read_bytes if memmap else 0,
            "pages_read": read_bytes // 4096 if memmap else 0,
            "source": "/proc/self/io read_bytes" if memmap else None,
        },
        # Every input row crosses to the training device.
        "host_to_device_bytes": input_rows * row_bytes,
        "seconds": seconds,
        "construct_seconds": 0.0,
        "mean_loss": loss_sum / batches if batches else 0.0,
        "peak_rss_mb": peak_rss_mb(),
    }


def run_hmgraph(dataset, seeds, args, policy: str, device_budget: int,
                host_budget_text: str | None, host_budget: int,
                belady_memo: dict) -> dict:
    """One epoch with `hmgraph.DataLoader` over the O_DIRECT storage tier.

    Parameters
    ----------
    dataset : hmgraph.datasets.NodeDataset
    seeds : torch.Tensor
        Train seeds of the epoch.
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

    Returns
    -------
    dict
        One record (see the module docstring).
    """
    label = policy if host_budget_text is None else \
        f"{policy} host {host_budget_text}"
    # (1) Build the loader: profiling, plan and static fill, timed.
    model, optimizer = new_model(dataset, args)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    start = time.perf_counter()
    loader = hmgraph.DataLoader(
        dataset.graph, seeds, sampler, features=dataset.feature_path,
        labels=dataset.labels, batch_size=args.batch_size, shuffle=True,
        seed=SEED, cache=policy, device_budget_bytes=device_budget,
        host_budget_bytes=host_budget, prefetch=PREFETCH, window=WINDOW,
        profile_batches=PROFILE_BATCHES,
    )
    construct_seconds = time.perf_counter() - start
    try:
        storage = loader.stats.storage
        warm_storage = storage.as_dict() if storage is not None else None
        direct = bool(getattr(loader.cache.source, "direct", False))
        # (2) Train one epoch, recording the trace.
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
             "storage": cache["hit_rate"].get("source", 0.0)}
    seconds = dict(stats["seconds"], train=train_seconds,
                   epoch=epoch_seconds)
    return {
        "config": policy,
        "kind": "hmgraph",
        "policy": policy,
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
        "host_to_device_bytes": cache["bytes"].get("host->device", 0),
        "seconds": seconds,
        "construct_seconds": construct_seconds,
        "warm_storage": warm_storage,
        "direct": direct,
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
    """Set each record's epoch ratio to in-memory and speedup over floor."""
    epochs = {r["config"]: r["seconds"]["epoch"] for r in records
              if r["kind"] == "dgl"}
    memory, floor = epochs.get(IN_MEMORY), epochs.get(MEMMAP_FLOOR)
    for r in records:
        epoch = r["seconds"]["epoch"]
        r["vs_in_memory"] = epoch / memory if memory else None
        r["vs_memmap_floor"] = floor / epoch if floor and epoch else None


def targets(records: list[dict], host_budgets: list[str]) -> list[dict]:
    """The targets, each with its measured value and PASS / MISS.

    A target whose configuration did not run has ``value`` None and
    ``status`` ``"not run"``.
    """
    def find(budget):
        return next((r for r in records if r["policy"] == "hmgraph"
                     and r["host_budget"] == budget), None)

    result = []
    for budget in host_budgets:
        record = find(budget)
        result.append(_target(
            f"host {budget}: hmgraph storage row reads / Belady's",
            record and record["storage_rows_vs_belady"], "<=",
            ROWS_VS_BELADY_MAX))
    record = find(TARGET_HOST_BUDGET)
    result.append(_target(
        f"host {TARGET_HOST_BUDGET}: hmgraph epoch / in-memory epoch",
        record and record["vs_in_memory"], "<=", VS_IN_MEMORY_MAX))
    result.append(_target(
        f"host {TARGET_HOST_BUDGET}: memmap floor epoch / hmgraph epoch",
        record and record["vs_memmap_floor"], ">=", VS_FLOOR_MIN))
    return result


def _target(name: str, value, op: str, limit: float) -> dict:
    if value is None:
        status = "not run"
    elif op == "<=":
        status = "PASS" if value <= limit else "MISS"
    else:
        status = "PASS" if value >= limit else "MISS"
    return {"target": name, "value": value, "op": op, "limit": limit,
            "status": status}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


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
            f"{100 * rate['device']:.1f}", f"{100 * rate['host']:.1f}",
            f"{100 * rate['storage']:.1f}",
            _fmt(belady and 100 * belady["hit_rate"], ".1f"),
            _fmt(r["storage_rows_vs_belady"], ".3f"),
            f"{storage.get('bytes_read', 0) / 1e9:.2f}",
            f"{storage.get('pages_read', 0):,}",
            f"{r['host_to_device_bytes'] / 1e9:.2f}",
            f"{r['seconds']['epoch']:.1f}",
            _fmt(r.get("vs_in_memory"), ".2f"),
            _fmt(r.get("vs_memmap_floor"), ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_section(rows: list[dict]) -> str:
    """The "Targets" list."""
    lines = []
    for t in rows:
        value = _fmt(t["value"], ".3f")
        lines.append(f"- {t['target']}: {value} (target {t['op']} "
                     f"{t['limit']:g}): **{t['status']}**")
    return "\n".join(lines) + "\n"


def markdown_report(result: dict) -> str:
    """The markdown file: setup, table, targets."""
    c, env = result["config"], result["environment"]
    fanouts = ",".join(str(f) for f in c["fanouts"])
    setup = (
        f"{c['dataset']} ({c['train_seeds']:,} train seeds, "
        f"{c['batches_per_epoch']} batches of {c['batch_size']}), "
        f"NeighborSampler({fanouts}), {c['model']} hidden {c['hidden']}, "
        f"one epoch per configuration; features "
        f"{c['feature_bytes'] / 1e9:.2f} GB on disk "
        f"(O_DIRECT: {env['o_direct']}); device budget "
        f"{c['device_budget']} ({c['device_budget_bytes'] / 1e6:.1f} MB); "
        f"prefetch {c['prefetch']}, window {c['window']}, "
        f"{c['profile_batches']} profiling batches; torch "
        f"{env['torch']}, dgl {env['dgl']}, {env['torch_num_threads']} "
        f"threads, {env['cpu_count']} CPUs."
    )
    notes = (
        "Hit rates are shares of each batch's unique input rows; Belady: "
        "the optimal offline policy on the run's own trace with the "
        "plan's device + host rows. Storage rows vs Belady is "
        "(1 - hit) / (1 - Belady hit). Epoch seconds exclude the loader's "
        "construction (profiling, plan, static fill), recorded apart in "
        "the JSON. The in-memory baseline counts every row as a host hit; "
        "the memmap floor reads every row from disk (bytes from "
        "/proc/self/io, page drops not timed). host->device counts every "
        "row not served by the device tier."
    )
    loads = [value for r in result["records"] if "loadavg" in r
             for value in (r["loadavg"]["before"][0],
                           r["loadavg"]["after"][0])]
    if loads:
        notes += (f" The machine is shared: its 1-minute load average was "
                  f"{min(loads):.1f} to {max(loads):.1f} around the runs "
                  f"({env['cpu_count']} CPUs); see `loadavg` per record.")
    table = markdown_table(result["records"])
    return (f"# Cache policies\n\n{setup}\n\n{table}"
            f"\n{notes}\n\n## Targets\n\n{targets_section(result['targets'])}")


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
    rate = r["hit_rate"]
    text = (f"{r['config']:<16} host {r['host_budget'] or '-':>4}: "
            f"epoch {r['seconds']['epoch']:.1f} s, hits device "
            f"{rate['device']:.1%} host {rate['host']:.1%} storage "
            f"{rate['storage']:.1%}")
    if r["belady"] is not None:
        text += (f", Belady {r['belady']['hit_rate']:.1%} (x"
                 f"{_fmt(r['storage_rows_vs_belady'], '.3f')})")
    return text


# --------------------------------------------------------------------------
# Main


def configurations(args) -> list[tuple[str, str | None]]:
    """(name, host budget) in run order: baselines, none, then policies."""
    runs = [(IN_MEMORY, None), (MEMMAP_FLOOR, None)]
    if "none" in args.policies:
        runs.append(("none", None))
    for budget in args.host_budgets:
        runs += [(p, budget) for p in args.policies if p != "none"]
    return runs


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
        dataset = datasets.load(args.dataset, args.root, verify=False)
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
        "records": [],
        "targets": [],
    }
    print(f"{args.dataset}: loaded in {load_seconds:.1f} s, "
          f"{batches} batches per epoch, features "
          f"{feature_bytes / 1e9:.2f} GB", flush=True)
    # (2) Every configuration, results rewritten after each.
    records, memo, md = result["records"], {}, out.with_suffix(".md")
    for name, budget in configurations(args):
        load_before = os.getloadavg()
        if name in (IN_MEMORY, MEMMAP_FLOOR):
            record = run_dgl(dataset, seeds, args, memmap=name != IN_MEMORY)
        else:
            record = run_hmgraph(
                dataset, seeds, args, name, device_budget, budget,
                host_budgets.get(budget, 0), memo)
            if result["environment"]["o_direct"] is None:
                result["environment"]["o_direct"] = record["direct"]
        # Load averages (1, 5, 15 min) around the run: the machine is
        # shared, and other work there slows every stage.
        record["loadavg"] = {"before": load_before,
                             "after": os.getloadavg()}
        records.append(record)
        gc.collect()
        add_ratios(records)
        result["targets"] = targets(records, args.host_budgets)
        md = write_results(result, out)
        print(summary_line(record), flush=True)
    # (3) The table and the targets.
    print(markdown_table(records), end="")
    print(targets_section(result["targets"]), end="")
    print(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

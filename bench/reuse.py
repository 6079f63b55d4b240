"""Batch reuse against no reuse and a static cache, by seed order.

One dataset, one invocation, one training epoch per configuration. The
node features are read from the dataset's feature file by hmgraph's
storage tier (``O_DIRECT``, so the OS page cache never serves them) and
GraphSAGE trains as in ``bench/baseline.py`` (hidden 256, Adam). For each
seed order

* **shuffled**: the train split in a fresh random order (``shuffle=True``),
* **cluster**: the train split in the cluster sampler's seed order
  (`hmgraph.samplers.cluster.cluster_order`: METIS clusters, as many as
  batches, from `dgl.metis_partition_assignment`, shuffled and taken four
  at a time, the seeds of a group shuffled together; ``shuffle=False``),
  sampled with the same ``NeighborSampler``,

it runs four `hmgraph.DataLoader` configurations (prefetch 2), in this
order:

* **no reuse**: ``reuse="none"``, ``cache=None``: every unique input row
  of every batch comes from storage and crosses to the device;
* **one-level** and **two-level**: batch reuse (``cache=None``) with a
  device budget (default 60 % of the feature bytes) of which the plan
  reserves what the reuse buffers need;
* **static cache**: ``cache="presample"``, ``reuse="none"``, with a device
  budget equal to the two-level run's reuse buffers
  (``plan.as_dict()["reuse_bytes"]``): a static device cache of the same
  device memory. No host cache anywhere (host budget 0).

Per configuration it records host->device bytes (rows not served on the
device), storage bytes, pages and rows read in the epoch, rows reused per
level and bytes saved, the seconds batch reuse spent finding duplicates
(and copying the rows it found) and their share of the epoch's wall time,
the epoch seconds, the loader's construction seconds (profiling, plan,
static fill) and the plan.

The METIS assignment is computed once per dataset and part count in a
child process (it needs several GB and, on the 2.4M-node graph, minutes)
and cached next to the feature file as ``metis-<k>.npy``; if it fails or
takes longer than `METIS_TIMEOUT_SECONDS`, the cluster-ordered runs are
skipped, the reason is written to the results and the exit status is 1.

Output: ``--out`` (default ``bench/results/reuse.json``): the
configuration, the environment, the METIS step and one record per
configuration, rewritten atomically after each configuration, and a
markdown report next to it with the same stem (table and "Targets"),
which is also printed at the end.

Examples
--------
From the repository root::

    python bench/reuse.py                            # synth-products
    python bench/reuse.py --max-batches 60           # 60 batches per run
    mkdir -p /tmp/hmg && python bench/reuse.py --quick --root /tmp/hmg
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
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
from hmgraph.cache.format import atomic_path  # noqa: E402
from hmgraph.models import build_model  # noqa: E402
from hmgraph.samplers.cluster import cluster_order  # noqa: E402

SEED = 0
#: Clusters mixed into the same batches, as training's cluster sampler
#: (``hmgraph train --group-size``, default 4).
CLUSTER_GROUP_SIZE = 4
MODEL = "sage"
HIDDEN = 256
DROPOUT = 0.5
LR = 0.003
PREFETCH = 2
PROFILE_BATCHES = 32
METIS_TIMEOUT_SECONDS = 1800
DEFAULT_OUT = "bench/results/reuse.json"
QUICK_OUT = "/tmp/reuse_quick.json"
#: Defaults of a full run and of ``--quick``, for options left unset.
DEFAULTS = {"dataset": "synth-products", "batch_size": 1024,
            "max_batches": None, "out": DEFAULT_OUT}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 5,
         "out": QUICK_OUT}
ORDERS = ("shuffled", "cluster")
NO_REUSE, ONE_LEVEL, TWO_LEVEL, STATIC = (
    "no reuse", "one-level", "two-level", "static cache")
#: (configuration, reuse level, cache policy) in run order: two-level
#: before the static cache, whose device budget is two-level's buffers.
CONFIGS = ((NO_REUSE, "none", None), (ONE_LEVEL, "one-level", None),
           (TWO_LEVEL, "two-level", None), (STATIC, "none", "presample"))
#: Targets: cluster order, two-level's host->device cut vs no reuse (%),
#: and the share of the epoch spent finding duplicates (%).
H2D_CUT_MIN_PERCENT = 50.0
DEDUP_SHARE_MAX_PERCENT = 5.0

TABLE_COLUMNS = (
    "seed order", "configuration", "device memory MB", "H2D GB",
    "vs no reuse (% cut)", "storage GB", "reuse % of rows",
    "dup-detect % of epoch", "epoch s",
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
        With ``fanouts`` as a list and unset options filled in from
        `DEFAULTS` or, with ``--quick``, from `QUICK`.

    Raises
    ------
    UsageError
        A value is out of range or malformed, the dataset unknown or the
        root missing.
    """
    parser = argparse.ArgumentParser(
        description="Batch reuse (none, one-level, two-level) against a "
        "static device cache of equal memory, with shuffled and "
        "METIS-cluster-ordered seeds; features on disk (O_DIRECT).",
    )
    parser.add_argument("--dataset", default=None,
                        help="dataset name (default: synth-products; "
                        "--quick: synth-tiny)")
    parser.add_argument("--root", default="data",
                        help="folder holding the datasets (default: data)")
    parser.add_argument("--fanouts", default="15,10,5",
                        help="neighbours per layer, input layer first as in "
                        "DGL (default: 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="seed nodes per batch (default: 1024; "
                        "--quick: 128)")
    parser.add_argument("--device-budget", default="60%",
                        help="device budget of the reuse runs: a share of "
                        "the feature bytes (60%%) or bytes with a unit "
                        "(default: 60%%)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="batches per epoch: shuffled trains on a "
                        "seeded random subset of max-batches x batch-size "
                        "train seeds, cluster on the first that many seeds "
                        "of its order (default: all seeds; --quick: 5)")
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
    try:
        parse_budget(args.device_budget, 1)
    except ValueError as err:
        raise UsageError(f"--device-budget: {err}") from None
    for flag, value in [("--batch-size", args.batch_size),
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


# --------------------------------------------------------------------------
# Seed orders


def metis_path(dataset, num_parts: int) -> Path:
    """Where the METIS assignment of ``num_parts`` parts is cached."""
    return dataset.feature_path.parent / f"metis-{num_parts}.npy"


def read_parts(path: Path, num_nodes: int, num_parts: int):
    """A cached assignment, or None if missing or not one of this graph.

    Returns
    -------
    torch.Tensor or None
        int64 part id per node (CPU).
    """
    if not path.is_file():
        return None
    try:
        parts = np.load(path)
    except (OSError, ValueError):
        return None
    if parts.shape != (num_nodes,) or parts.size == 0 or \
            parts.min() < 0 or parts.max() >= num_parts:
        return None
    return torch.from_numpy(parts.astype(np.int64))


def _metis_child(name: str, root: str, batch_size: int, conn) -> None:
    """Child process: load the graph, run METIS, save the assignment.

    Uses as many parts as batches per epoch. Sends two dicts through
    ``conn``: first ``num_parts`` and ``path``, then ``status``
    (``"cached"``: a usable assignment is already there, ``"ok"`` or
    ``"failed"``), ``seconds`` (METIS alone), ``peak_rss_mb`` and, on
    failure, ``error``.
    """
    try:
        dataset = datasets.load(name, root, verify=False)
        num_nodes = dataset.num_nodes
        num_parts = -(-dataset.split["train"].numel() // batch_size)
        path = metis_path(dataset, num_parts)
        conn.send({"num_parts": num_parts, "path": str(path)})
        if read_parts(path, num_nodes, num_parts) is not None:
            conn.send({"status": "cached", "peak_rss_mb": peak_rss_mb()})
            return
        graph = dataset.graph
        del dataset
        start = time.perf_counter()
        if num_parts == 1:  # METIS is not needed for one part
            parts = np.zeros(num_nodes, dtype=np.int32)
        else:
            parts = dgl.metis_partition_assignment(graph, num_parts)
            parts = parts.numpy().astype(np.int32)
        seconds = time.perf_counter() - start
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, parts)
        conn.send({"status": "ok", "seconds": seconds,
                   "peak_rss_mb": peak_rss_mb()})
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send({"status": "failed",
                   "error": f"{type(err).__name__}: {err}",
                   "peak_rss_mb": peak_rss_mb()})
    finally:
        conn.close()


def run_metis(args) -> dict:
    """Make sure the METIS assignment is cached, in a child process.

    The child loads the dataset itself, before this process does, so
    METIS's memory (several GB on synth-products) is never held next to
    the benchmark's and is returned to the system when the child exits;
    a crash, an out-of-memory kill or a run past `METIS_TIMEOUT_SECONDS`
    leaves this process running.

    Returns
    -------
    dict
        JSON-ready: ``status`` (``"cached"``, ``"computed"``,
        ``"failed"``, ``"timeout"``), ``path``, ``num_parts`` (None if the
        child died before it knew them), ``seconds`` (the child's wall
        time, loading included), ``metis_seconds``, ``child_peak_rss_mb``
        and ``error``.
    """
    info = {"path": None, "num_parts": None,
            "timeout_seconds": METIS_TIMEOUT_SECONDS}
    print(f"METIS: as many parts as batches, in a child process (timeout "
          f"{METIS_TIMEOUT_SECONDS} s)", flush=True)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_metis_child, name="metis",
        args=(args.dataset, str(args.root), args.batch_size, send))
    start = time.perf_counter()
    child.start()
    send.close()
    report = None
    while report is None:
        left = METIS_TIMEOUT_SECONDS - (time.perf_counter() - start)
        if left <= 0 or not receive.poll(left):
            break
        try:
            message = receive.recv()
        except EOFError:  # the child died before sending
            break
        if "status" in message:
            report = message
        else:
            info.update(message)
    info["seconds"] = time.perf_counter() - start
    if report is None and child.is_alive():
        child.kill()
        child.join()
        if info["path"] is not None:  # a kill inside the save
            path = Path(info["path"])
            path.with_name(f".{path.name}.tmp-{child.pid}").unlink(
                missing_ok=True)
        return dict(info, status="timeout",
                    error=f"METIS did not finish within "
                    f"{METIS_TIMEOUT_SECONDS} s; killed")
    child.join()
    if report is None:
        return dict(info, status="failed",
                    error=f"the METIS process exited with code "
                    f"{child.exitcode} without a result (a negative code "
                    f"is the signal that killed it, -9 for example when "
                    f"out of memory)")
    info["child_peak_rss_mb"] = report["peak_rss_mb"]
    if report["status"] == "failed":
        return dict(info, status="failed", error=report["error"])
    if report["status"] == "cached":
        return dict(info, status="cached")
    return dict(info, status="computed", metis_seconds=report["seconds"])


def load_parts(dataset, metis: dict, num_parts: int):
    """The assignment `run_metis` cached, checked against this dataset.

    Returns
    -------
    torch.Tensor or None
        Part ids (int64, CPU); None if METIS failed (``metis`` then says
        why: it is updated in place).
    """
    if metis["status"] not in ("cached", "computed"):
        return None
    path = metis_path(dataset, num_parts)
    parts = read_parts(path, dataset.num_nodes, num_parts)
    if parts is None:
        metis.update(status="failed", error=f"no usable assignment of "
                     f"{num_parts} parts in {path}")
    return parts


def cluster_seed_order(train: torch.Tensor, parts: torch.Tensor
                       ) -> torch.Tensor:
    """Train seeds in the cluster sampler's order (groups of clusters)."""
    return cluster_order(train, parts, CLUSTER_GROUP_SIZE, SEED)


def part_summary(train: torch.Tensor, parts: torch.Tensor,
                 num_parts: int) -> dict:
    """How the train seeds spread over the parts (METIS balances nodes)."""
    per_part = torch.bincount(parts[train], minlength=num_parts)
    return {"parts_with_train_seeds": int((per_part > 0).sum()),
            "train_seeds_per_part": {
                "min": int(per_part.min()), "max": int(per_part.max()),
                "mean": float(per_part.float().mean())}}


def order_seeds(dataset, args, order: str, parts) -> torch.Tensor:
    """The seeds of one order's epoch, capped at ``max_batches`` batches.

    ``shuffled``: the train split, or a seeded random subset of it (the
    loader shuffles). ``cluster``: the train split in cluster order, or
    its first ``max_batches * batch_size`` seeds (the loader keeps the
    order).
    """
    train = dataset.split["train"]
    keep = None if args.max_batches is None else \
        args.max_batches * args.batch_size
    if order == "cluster":
        seeds = cluster_seed_order(train, parts)
        return seeds if keep is None else seeds[:keep]
    if keep is None or keep >= train.numel():
        return train
    generator = torch.Generator().manual_seed(SEED)
    chosen = torch.randperm(train.numel(), generator=generator)[:keep]
    return train[chosen.sort().values]


# --------------------------------------------------------------------------
# Training


def new_model(dataset, args) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A freshly seeded model and optimizer, as in bench/baseline.py."""
    torch.manual_seed(SEED)
    dgl.seed(SEED)
    model = build_model(
        MODEL, dataset.feat_dim, HIDDEN, dataset.num_classes,
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


def run_config(dataset, seeds, args, order: str, config: str, reuse: str,
               cache: str | None, device_budget: int) -> dict:
    """One epoch with `hmgraph.DataLoader` over the O_DIRECT storage tier.

    Parameters
    ----------
    dataset : hmgraph.datasets.NodeDataset
    seeds : torch.Tensor
        Seeds of the epoch, in order for ``cluster``.
    args : argparse.Namespace
    order : str
        ``"shuffled"`` (the loader shuffles) or ``"cluster"`` (kept).
    config, reuse : str
        Configuration name and the loader's ``reuse``.
    cache : str or None
        Cache policy (None: no cache).
    device_budget : int
        Device budget in bytes.

    Returns
    -------
    dict
        One record (see the module docstring); bytes in bytes, seconds in
        seconds.
    """
    label = f"{order} {config}"
    # (1) Build the loader: profiling, plan and static fill, timed.
    model, optimizer = new_model(dataset, args)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    start = time.perf_counter()
    loader = hmgraph.DataLoader(
        dataset.graph, seeds, sampler, features=dataset.feature_path,
        labels=dataset.labels, batch_size=args.batch_size,
        shuffle=order == "shuffled", seed=SEED, cache=cache,
        device_budget_bytes=device_budget, host_budget_bytes=0,
        prefetch=PREFETCH, profile_batches=PROFILE_BATCHES, reuse=reuse,
    )
    construct_seconds = time.perf_counter() - start
    try:
        storage = loader.stats.storage
        warm_storage = storage.as_dict() if storage is not None else None
        direct = bool(getattr(loader.cache.source, "direct", False))
        # (2) Train one epoch.
        dgl.seed(SEED)  # every configuration samples the same batches
        loader.stats.reset()
        model.train()
        train_seconds = loss_sum = 0.0
        batches = peak_held = 0
        bar = tqdm(total=len(loader), desc=label, unit="batch",
                   mininterval=5.0, file=sys.stderr)
        start = time.perf_counter()
        for batch in loader:
            t0 = time.perf_counter()
            loss_sum += train_step(model, optimizer, batch.blocks, batch.x,
                                   batch.y)
            train_seconds += time.perf_counter() - t0
            batches += 1
            if reuse != "none":  # buffers now (the fetch thread is ahead)
                peak_held = max(peak_held, loader.feature.nbytes)
            bar.update(1)
        epoch_seconds = time.perf_counter() - start
        bar.close()
        stats = loader.stats.as_dict()
        plan = loader.plan.as_dict()
    finally:
        loader.close()
    del loader, model, optimizer
    # (3) The record.
    cache_stats = stats["cache"]
    reuse_stats = stats.get("reuse")
    levels = plan["reuse_levels"]
    dedup = reuse_stats["seconds"] if reuse_stats else 0.0
    capped = bool(levels) and plan["reuse_rows"] == \
        (device_budget // plan["row_bytes"]) // levels
    return {
        "order": order,
        "config": config,
        "reuse": reuse,
        "cache": cache,
        "seeds": int(seeds.numel()),
        "batches": batches,
        "device_budget_bytes": device_budget,
        "device_bytes_used": plan["reuse_bytes"] + plan["device_bytes"],
        "reuse_bytes_peak": peak_held,
        "reuse_capped_by_budget": capped,
        "unique_rows_requested": reuse_stats["rows_requested"]
        if reuse_stats else cache_stats["rows_requested"],
        "host_to_device_bytes": cache_stats["bytes"]["host->device"],
        "storage": stats.get("storage"),
        "reuse_stats": reuse_stats,
        "reuse_rate": reuse_stats["reuse_rate"] if reuse_stats else None,
        "device_hit_rate": cache_stats["hit_rate"].get("device", 0.0),
        "dedup_seconds": dedup,
        "dedup_share_percent": 100.0 * dedup / epoch_seconds
        if epoch_seconds > 0 else 0.0,
        "seconds": dict(stats["seconds"], train=train_seconds,
                        epoch=epoch_seconds),
        "construct_seconds": construct_seconds,
        "warm_storage": warm_storage,
        "direct": direct,
        "plan": plan,
        "loader": stats,
        "mean_loss": loss_sum / batches if batches else 0.0,
        "peak_rss_mb": peak_rss_mb(),
    }


# --------------------------------------------------------------------------
# Reporting


def find(records: list[dict], order: str, config: str) -> dict | None:
    """The record of one seed order and configuration, if it ran."""
    return next((r for r in records if r["order"] == order
                 and r["config"] == config), None)


def add_ratios(records: list[dict]) -> None:
    """Set each record's host->device cut and epoch ratio vs no reuse."""
    for r in records:
        base = find(records, r["order"], NO_REUSE)
        h2d = base and base["host_to_device_bytes"]
        epoch = base and base["seconds"]["epoch"]
        r["h2d_cut_percent"] = 100.0 * (
            1.0 - r["host_to_device_bytes"] / h2d) if h2d else None
        r["epoch_vs_no_reuse"] = r["seconds"]["epoch"] / epoch \
            if epoch else None


def targets(records: list[dict]) -> list[dict]:
    """The targets, each with its measured value and PASS / MISS.

    A target whose configurations did not run has ``value`` None and
    ``status`` ``"not run"``.
    """
    two = find(records, "cluster", TWO_LEVEL)
    static = find(records, "cluster", STATIC)
    result = [
        _target("cluster: two-level host->device cut vs no reuse (%)",
                two and two["h2d_cut_percent"], ">=", H2D_CUT_MIN_PERCENT),
        _target("cluster: two-level host->device bytes / static cache's "
                "(equal device memory)",
                two and static and _ratio(two["host_to_device_bytes"],
                                          static["host_to_device_bytes"]),
                "<", 1.0),
    ]
    for order in ORDERS:
        for config in (ONE_LEVEL, TWO_LEVEL):
            r = find(records, order, config)
            result.append(_target(
                f"{order} {config}: duplicate detection, % of the epoch",
                r and r["dedup_share_percent"], "<",
                DEDUP_SHARE_MAX_PERCENT))
    return result


def _ratio(num: int, den: int) -> float:
    """``num / den``; 1.0 for 0 / 0 and infinity for x / 0."""
    if den == 0:
        return 1.0 if num == 0 else float("inf")
    return num / den


def _target(name: str, value, op: str, limit: float) -> dict:
    if value is None:
        status = "not run"
    elif op == "<":
        status = "PASS" if value < limit else "MISS"
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
        "|" + "|".join("---" if col in ("seed order", "configuration")
                       else "---:" for col in TABLE_COLUMNS) + "|",
    ]
    for r in records:
        storage = r["storage"] or {}
        rate = r["reuse_rate"]
        cells = [
            r["order"], r["config"],
            f"{r['device_bytes_used'] / 1e6:.1f}",
            f"{r['host_to_device_bytes'] / 1e9:.2f}",
            _fmt(r.get("h2d_cut_percent"), ".1f"),
            f"{storage.get('bytes_read', 0) / 1e9:.2f}",
            _fmt(rate and 100 * rate, ".1f"),
            f"{r['dedup_share_percent']:.2f}" if r["reuse"] != "none"
            else "-",
            f"{r['seconds']['epoch']:.1f}",
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


def buffers_section(records: list[dict]) -> str:
    """How much of its reservation each reuse run's buffers held."""
    parts = [f"{r['order']} {r['config']} "
             f"{r['reuse_bytes_peak'] / 1e6:.1f} of "
             f"{r['plan']['reuse_bytes'] / 1e6:.1f} MB"
             for r in records if r["reuse"] != "none"]
    if not parts:
        return ""
    return ("Reuse buffers, most held after a batch (sampled in the "
            "training loop) of the device memory the plan reserved: "
            + "; ".join(parts) + ".\n\n")


def metis_section(metis: dict | None) -> str:
    """One paragraph on the METIS step."""
    if metis is None:
        return "METIS: not reached.\n"
    text = "METIS"
    if metis["num_parts"] is not None:
        text += f" ({metis['num_parts']} parts, `{metis['path']}`)"
    text += f": **{metis['status']}**"
    if metis["status"] == "computed" and "metis_seconds" in metis:
        text += (f" in {metis['metis_seconds']:.1f} s "
                 f"({metis['seconds']:.1f} s with loading, child peak RSS "
                 f"{metis['child_peak_rss_mb']:,.0f} MB)")
    if "error" in metis:
        text += (f" after {metis['seconds']:.1f} s: {metis['error']}. "
                 f"The cluster-ordered runs were skipped")
    if "train_seeds_per_part" in metis:
        per = metis["train_seeds_per_part"]
        text += (f"; train seeds per part min {per['min']}, mean "
                 f"{per['mean']:.0f}, max {per['max']} "
                 f"({metis['parts_with_train_seeds']} parts hold any)")
    return text + ".\n"


def markdown_report(result: dict) -> str:
    """The markdown file: setup, table, notes, METIS, targets."""
    c, env = result["config"], result["environment"]
    fanouts = ",".join(str(f) for f in c["fanouts"])
    cap = "" if c["max_batches"] is None else \
        f", capped at {c['max_batches']} batches per epoch"
    setup = (
        f"{c['dataset']} ({c['train_seeds']:,} train seeds, "
        f"{c['batches_per_epoch']} batches of {c['batch_size']}{cap}), "
        f"NeighborSampler({fanouts}), {c['model']} hidden {c['hidden']}, "
        f"one epoch per configuration; features "
        f"{c['feature_bytes'] / 1e9:.2f} GB on disk "
        f"(O_DIRECT: {env['o_direct']}); reuse device budget "
        f"{c['device_budget']} ({c['device_budget_bytes'] / 1e6:.1f} MB), "
        f"no cache, host budget 0; prefetch {c['prefetch']}, "
        f"{c['profile_batches']} profiling batches; torch "
        f"{env['torch']}, dgl {env['dgl']}, {env['torch_num_threads']} "
        f"threads, {env['cpu_count']} CPUs, training on {c['device']}."
    )
    notes = (
        "Device memory: what the plan reserved for batch reuse (levels x "
        "rows x row bytes, plus its id table of 8 bytes per node) or the "
        "static cache's device rows; the static cache (`presample`, no "
        "reuse) gets exactly the two-level run's reuse bytes of the same "
        "seed order. H2D: bytes of rows not "
        "served on the device (reused or cached), i.e. that cross from "
        "host to device. Storage: bytes read from the feature file in the "
        "epoch (O_DIRECT pages); the static cache's fill at construction "
        "is not counted (it is in the JSON as `warm_storage`). Storage "
        "reads whole 4 KiB pages and reads through short gaps between "
        "wanted pages, so its bytes fall far less than the rows it reads "
        "(`storage.rows_read` in the JSON). Reuse %: "
        "rows copied from the reuse buffers over the batches' unique "
        "input rows. Dup-detect: seconds batch reuse spent finding "
        "duplicates (one gather of the batch's ids from the device id "
        "table, one scatter to store them; wall time in the fetch thread, "
        "which "
        "overlaps training) over the epoch's wall time; copying the reused "
        "rows is timed apart (`reuse_stats.copy_seconds` in the JSON). "
        "Epoch seconds exclude the loader's construction (profiling, plan, "
        "static fill), recorded apart in the JSON."
    )
    table = markdown_table(result["records"])
    return (f"# Batch reuse\n\n{setup}\n\n{table}\n{notes}\n\n"
            f"{buffers_section(result['records'])}"
            f"{metis_section(result['metis'])}\n## Targets\n\n"
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
    storage = r["storage"] or {}
    text = (f"{r['order']:<8} {r['config']:<12}: epoch "
            f"{r['seconds']['epoch']:.1f} s, H2D "
            f"{r['host_to_device_bytes'] / 1e9:.2f} GB "
            f"(cut {_fmt(r.get('h2d_cut_percent'), '.1f')} %), storage "
            f"{storage.get('bytes_read', 0) / 1e9:.2f} GB")
    if r["reuse_rate"] is not None:
        text += (f", reuse {r['reuse_rate']:.1%}, dup-detect "
                 f"{r['dedup_share_percent']:.2f} % of the epoch")
    if r["reuse_capped_by_budget"]:
        text += " (buffers capped by the device budget)"
    return text


# --------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    """Run every configuration; return the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"reuse: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    # (1) METIS parts, cached by a child process before the dataset loads
    # here (METIS needs several GB of its own).
    metis = run_metis(args)
    # (2) The dataset, the budget, the parts.
    t0 = time.perf_counter()
    try:
        dataset = datasets.load(args.dataset, args.root, verify=False)
    except ValueError as err:  # hmgraph's DatasetError and the like
        print(f"reuse: error: {args.dataset}: {err}", file=sys.stderr)
        return 2
    load_seconds = time.perf_counter() - t0
    feature_bytes = dataset.manifest.data_bytes
    try:
        device_budget = parse_budget(args.device_budget, feature_bytes)
    except ValueError as err:
        print(f"reuse: error: --device-budget: {err}", file=sys.stderr)
        return 2
    train = dataset.split["train"]
    num_parts = -(-train.numel() // args.batch_size)
    seeds_per_epoch = train.numel() if args.max_batches is None else \
        min(train.numel(), args.max_batches * args.batch_size)
    result = {
        "config": {
            "dataset": args.dataset, "root": str(args.root),
            "feature_path": str(dataset.feature_path),
            "feature_bytes": feature_bytes,
            "nodes": dataset.num_nodes,
            "edges": dataset.graph.num_edges(),
            "feat_dim": dataset.feat_dim,
            "train_seeds": int(train.numel()),
            "seeds_per_epoch": int(seeds_per_epoch),
            "batches_per_epoch": -(-seeds_per_epoch // args.batch_size),
            "max_batches": args.max_batches,
            "device_budget": args.device_budget,
            "device_budget_bytes": device_budget,
            "host_budget_bytes": 0,
            "orders": list(ORDERS),
            "configurations": [name for name, _, _ in CONFIGS],
            "fanouts": args.fanouts, "batch_size": args.batch_size,
            "model": MODEL, "hidden": HIDDEN,
            "num_layers": len(args.fanouts), "dropout": DROPOUT,
            "optimizer": "adam", "lr": LR, "seed": SEED, "epochs": 1,
            "prefetch": PREFETCH, "profile_batches": PROFILE_BATCHES,
            "device": "cpu", "quick": args.quick,
            "load_seconds": load_seconds,
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
        "metis": None,
        "records": [],
        "targets": [],
    }
    print(f"{args.dataset}: loaded in {load_seconds:.1f} s, "
          f"{result['config']['batches_per_epoch']} batches per epoch, "
          f"features {feature_bytes / 1e9:.2f} GB, device budget "
          f"{device_budget / 1e6:.1f} MB", flush=True)
    parts = load_parts(dataset, metis, num_parts)
    result["metis"] = metis
    if parts is not None:
        result["metis"].update(part_summary(train, parts, num_parts))
    else:
        print(f"reuse: METIS {result['metis']['status']}: "
              f"{result['metis']['error']}; cluster-ordered runs skipped",
              file=sys.stderr, flush=True)
    print(metis_section(result["metis"]), end="", flush=True)
    t0 = time.perf_counter()
    dataset.graph.create_formats_()
    result["config"]["prepare_seconds"] = time.perf_counter() - t0
    md = write_results(result, out)
    # (3) Every order and configuration, results rewritten after each.
    records = result["records"]
    for order in ORDERS:
        if order == "cluster" and parts is None:
            continue
        seeds = order_seeds(dataset, args, order, parts)
        for config, reuse, cache in CONFIGS:
            budget = device_budget
            if config == STATIC:
                two = find(records, order, TWO_LEVEL)
                budget = two["plan"]["reuse_bytes"]
            record = run_config(dataset, seeds, args, order, config, reuse,
                                cache, budget)
            if result["environment"]["o_direct"] is None:
                result["environment"]["o_direct"] = record["direct"]
            records.append(record)
            gc.collect()
            add_ratios(records)
            result["targets"] = targets(records)
            md = write_results(result, out)
            print(summary_line(record), flush=True)
    # (4) The table and the targets.
    print(markdown_table(records), end="")
    print(targets_section(result["targets"]), end="")
    print(f"wrote {out} and {md}")
    return 0 if parts is not None else 1


if __name__ == "__main__":
    sys.exit(main())

"""Cluster sampling (2PGraph) against DGL's uniform neighbour sampling.

One invocation, four parts, each written out as soon as it is done:

1. **Sampling**: one epoch of the train split per sampler, blocks only (no
   feature reads), timed around ``sampler.sample`` alone: DGL's
   `dgl.dataloading.NeighborSampler` (seeds shuffled) and hmgraph's
   `ClusterSampler` at locality 0.5 and 1 (seeds in `order_seeds` order),
   with ``group_size`` 4 (as training uses it) and 1. The clusters are
   METIS parts, one per batch of the train split, cached next to the
   feature file (``metis-<k>.npy``); METIS is timed apart. Every sampler
   runs ``--repeats`` times, interleaved, and the fastest epoch counts.
   Per sampler: seconds, input nodes and sampled edges per batch, rows
   touched in the epoch.
2. **Hit rates**: static placement with a device tier of 5 % and a host
   tier of 20 % of the rows. The profile is `presample` over 32 batches
   with the same sampler and the seed `hmgraph.DataLoader` profiles with
   (``seed + 7919``, another order than the epoch's); ``presample`` ranks
   rows by profiled accesses, ``layer-aware`` by per-hop need (hops near
   the seeds first). The device tier holds the top rows, the host tier the
   next ones, as `hmgraph.cache.plan.build_cache` lays them out. Hits per
   tier are counted on the whole epoch trace (unique input rows of each
   batch) of DGL's sampler and of the cluster sampler at locality 1;
   Belady's optimal offline policy with device + host rows is the
   reference.
3. **Storage pages**: the same two epoch traces read through
   `hmgraph.cache.storage.StorageFeature` (``O_DIRECT``, no cache) from
   the original feature file and from the feature file renumbered so that
   clusters are id ranges (`hmgraph.datasets.renumbered.renumbered`; the
   trace's ids mapped with ``info["inverse"]``, so both layouts read the
   same rows). Pages per epoch are exact for every batch: the first
   ``--max-batches`` batches are read (timed; their pages come from the
   tier's counters), the pages of the rest are counted from the tier's
   own read plan (``StorageFeature._plan``, what ``read`` would issue),
   which is checked against the counters on the batches read.
4. **Accuracy**: `hmgraph.train.train` for the same number of epochs with
   exact sampling (DGL's ``NeighborSampler``) and cluster sampling
   (locality 0.5 and 1, group size 4) on synth-small (or ``--quick``:
   synth-tiny) and Cora's public split (fanouts 10,10, hidden 64, lr 0.01,
   weight decay 5e-4, batch 32), ``--runs`` seeds each. The test accuracy
   is the one at the epoch of best validation accuracy (as
   `hmgraph.train.summarize`); the last epoch's is recorded too.

A "Targets" section checks: sampling time of each cluster sampler (group
size 4) at most 0.5x DGL's; storage pages per epoch of the cluster trace
with renumbering at most 0.5x without; test accuracy with cluster
sampling within 1.0 point of exact sampling on each dataset.

Other benchmarks running at the same time (``bench/*.py`` processes) are
recorded in the output: times are ratios within this invocation, but a
busy machine makes them noisier.

Output: ``--out`` (default ``bench/results/cluster.json``) and a markdown
report next to it with the same stem, both rewritten atomically after
each part; the report is also printed at the end.

Examples
--------
From the repository root::

    python bench/cluster.py                     # synth-products
    python bench/cluster.py --max-batches 20 --runs 1
    mkdir -p /tmp/hmg && python bench/cluster.py --quick --root /tmp/hmg
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

# DGL's OpenMP runtime and torch's spin against each other on few cores;
# passive waiting keeps them from doing so. Must precede torch's import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dgl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import hmgraph  # noqa: E402
from hmgraph import datasets  # noqa: E402
from hmgraph.cache.format import PAGE_BYTES, atomic_path  # noqa: E402
from hmgraph.cache.plan import replay  # noqa: E402
from hmgraph.cache.policies import make_policy  # noqa: E402
from hmgraph.cache.storage import StorageFeature  # noqa: E402
from hmgraph.datasets.planetoid import find_planetoid  # noqa: E402
from hmgraph.datasets.renumbered import renumbered  # noqa: E402
from hmgraph.samplers.cluster import (  # noqa: E402
    ClusterSampler,
    metis_clusters,
)
from hmgraph.samplers.presample import presample  # noqa: E402
from hmgraph.train import TrainConfig, train  # noqa: E402

SEED = 0
#: `hmgraph.DataLoader` profiles with this seed offset (another order).
PROFILE_SEED = SEED + 7919
PROFILE_BATCHES = 32
DEVICE_SHARE = 0.05
HOST_SHARE = 0.20
STATIC_POLICIES = ("presample", "layer-aware")
PARTS = ("sampling", "hit_rates", "storage", "accuracy")
#: Parts that need the epoch traces of the sampling part.
NEEDS_TRACES = ("hit_rates", "storage")

DGL = "dgl NeighborSampler"
#: Samplers of the sampling part: (name, locality, group size); None is
#: DGL's. The cluster samplers with group size 4 are the targets' and
#: training's.
TRAIN_GROUP_SIZE = 4
SAMPLERS = (
    (DGL, None, None),
    ("cluster l=0.5 g=4", 0.5, 4),
    ("cluster l=1 g=4", 1.0, 4),
    ("cluster l=0.5 g=1", 0.5, 1),
    ("cluster l=1 g=1", 1.0, 1),
)
#: Samplers whose epoch trace parts 2 and 3 use.
TRACED = (DGL, "cluster l=1 g=4")
CLUSTER_TRACE = "cluster l=1 g=4"

#: Training settings of the accuracy part, per dataset kind.
CORA = {"dataset": "cora", "fanouts": [10, 10], "batch_size": 32,
        "hidden": 64, "lr": 0.01, "weight_decay": 5e-4, "dropout": 0.5}
SYNTH_TRAIN = {"lr": 0.01, "weight_decay": 0.0, "dropout": 0.5}
#: Accuracy configurations: (name, sampler, locality).
TRAIN_CONFIGS = (
    ("exact", "neighbor", 0.0),
    ("cluster l=0.5", "cluster", 0.5),
    ("cluster l=1", "cluster", 1.0),
)

#: Targets.
SAMPLE_RATIO_MAX = 0.5
PAGES_RATIO_MAX = 0.5
ACCURACY_GAP_MAX = 1.0  # points of test accuracy (%)

DEFAULT_OUT = "bench/results/cluster.json"
QUICK_OUT = "/tmp/cluster_quick.json"
#: Defaults of a full run and of ``--quick``, for options left unset.
DEFAULTS = {"dataset": "synth-products", "small": "synth-small",
            "batch_size": 1024, "epochs": 20, "cora_epochs": 100,
            "runs": 2, "repeats": 2, "out": DEFAULT_OUT}
QUICK = {"dataset": "synth-tiny", "small": "synth-tiny", "batch_size": 128,
         "epochs": 2, "cora_epochs": 5, "runs": 1, "repeats": 1,
         "max_batches": 3, "out": QUICK_OUT}


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
        With ``fanouts`` and ``parts`` as lists, ``cora_root`` None when
        Cora is skipped, and unset options filled in from `DEFAULTS` or,
        with ``--quick``, from `QUICK`.

    Raises
    ------
    UsageError
        A value is out of range or malformed, a dataset or part unknown,
        or a root missing.
    """
    parser = argparse.ArgumentParser(
        description="Cluster sampling vs DGL's NeighborSampler: sampling "
        "time, static cache hit rates, storage pages with and without "
        "renumbering, and accuracy after the same epochs.",
    )
    parser.add_argument("--dataset", default=None,
                        help="dataset of parts 1-3 (default: synth-products;"
                        " --quick: synth-tiny)")
    parser.add_argument("--root", default="data",
                        help="folder holding the datasets (default: data)")
    parser.add_argument("--fanouts", default="15,10,5",
                        help="neighbours per layer, input layer first as in "
                        "DGL; also synth-small's training fanouts (default:"
                        " 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="seed nodes per batch, parts 1-3 and "
                        "synth-small training (default: 1024; --quick: "
                        "128)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="batches per trace actually read from storage; "
                        "the pages of the others are counted from the "
                        "storage tier's read plan (default: all; --quick: "
                        "3)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed sampling epochs per sampler, the "
                        "fastest counts (default: 2; --quick: 1)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs on synth-small (default: 20; "
                        "--quick: 2 on synth-tiny)")
    parser.add_argument("--cora-epochs", type=int, default=None,
                        help="training epochs on Cora (default: 100; "
                        "--quick: 5)")
    parser.add_argument("--runs", type=int, default=None,
                        help="training runs (seeds) per configuration "
                        "(default: 2; --quick: 1)")
    parser.add_argument("--eval-every", type=int, default=1,
                        help="evaluate every this many epochs and after the "
                        "last; the test accuracy is the one at the best "
                        "validation among those (default: 1)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden size on synth-small (default: 256; "
                        "Cora: 64)")
    parser.add_argument("--cora-root", default="../shared/data",
                        help="folder holding Cora/ind.cora.* (default: "
                        "../shared/data); '' skips Cora")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts of {', '.join(PARTS)} "
                        "(default: all); hit_rates and storage run sampling "
                        "too")
    parser.add_argument("--out", default=None,
                        help=f"JSON result file (default: {DEFAULT_OUT}; "
                        f"--quick: {QUICK_OUT}); the markdown report goes "
                        "next to it")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: synth-tiny everywhere, batch 128, "
                        "3 batches read, 2 + 5 epochs, 1 run")
    args = parser.parse_args(argv)

    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    known = datasets.known_datasets()
    if args.dataset not in known:
        raise UsageError(
            f"unknown dataset {args.dataset!r}; known: {', '.join(known)}"
        )
    args.fanouts = parse_fanouts(args.fanouts)
    args.parts = parse_parts(args.parts)
    for flag, value in [("--batch-size", args.batch_size),
                        ("--max-batches", args.max_batches or 1),
                        ("--repeats", args.repeats),
                        ("--epochs", args.epochs),
                        ("--cora-epochs", args.cora_epochs),
                        ("--runs", args.runs),
                        ("--eval-every", args.eval_every),
                        ("--hidden", args.hidden)]:
        if value < 1:
            raise UsageError(f"{flag} must be a positive int; got {value}")
    if not Path(args.root).is_dir():
        raise UsageError(
            f"dataset root {args.root!r} does not exist; pass an existing "
            f"--root"
        )
    if not args.cora_root or "accuracy" not in args.parts:
        args.cora_root = None
    elif find_planetoid("cora", args.cora_root) is None:
        raise UsageError(
            f"no Cora under --cora-root {args.cora_root!r} (expected "
            f"Cora/ind.cora.graph); pass the folder that holds Cora/, or "
            f"--cora-root '' to skip Cora"
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


def parse_parts(text: str) -> list[str]:
    """Parse ``--parts``; add sampling where a part needs its traces.

    Raises
    ------
    UsageError
        If the list is empty or names an unknown part.
    """
    parts = {p.strip() for p in text.split(",") if p.strip()}
    if not parts:
        raise UsageError("--parts is empty")
    for part in parts:
        if part not in PARTS:
            raise UsageError(
                f"unknown part {part!r} in --parts; available: "
                f"{', '.join(PARTS)}"
            )
    if parts & set(NEEDS_TRACES):
        parts.add("sampling")
    return [p for p in PARTS if p in parts]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (2**20 bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def other_benchmarks() -> list[str]:
    """Command lines of other running ``bench/*.py`` processes.

    They share this machine's cores and disk, so they make times noisier
    (the ratios within this invocation stay comparable, if noisier).
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # the process ended meanwhile
            continue
        words = [w.decode(errors="replace") for w in words if w]
        if any(w.endswith(".py") and "bench/" in w for w in words):
            found.append(" ".join(words))
    return sorted(found)


def note_contention(result: dict, when: str) -> None:
    """Record the other benchmarks running now under ``contention``."""
    others = other_benchmarks()
    if others:
        result["contention"].append({"when": when, "processes": others})


def progress(total: int, desc: str) -> tqdm:
    """A progress bar on stderr."""
    return tqdm(total=total, desc=desc, unit="batch", mininterval=5.0,
                file=sys.stderr)


# --------------------------------------------------------------------------
# (1) Sampling


def cluster_count(dataset, batch_size: int) -> int:
    """Clusters of the cluster sampler: one per batch of the train split."""
    return max(1, math.ceil(dataset.split["train"].numel() / batch_size))


def load_clusters(dataset, num_clusters: int) -> tuple[torch.Tensor, dict]:
    """METIS clusters, cached next to the feature file, timed.

    Returns
    -------
    tuple of (torch.Tensor, dict)
        Cluster id per node, and ``path``, ``num_clusters``, ``status``
        (``cached`` or ``computed``), ``seconds`` and cluster sizes.
    """
    path = Path(dataset.feature_path).parent / f"metis-{num_clusters}.npy"
    status = "cached" if path.is_file() else "computed"
    if status == "computed":
        print(f"METIS: {num_clusters} clusters of {dataset.num_nodes:,} "
              f"nodes (minutes on millions of nodes)", flush=True)
    start = time.perf_counter()
    clusters = metis_clusters(dataset.graph, num_clusters, path)
    seconds = time.perf_counter() - start
    sizes = torch.bincount(clusters, minlength=num_clusters)
    train_sizes = torch.bincount(clusters[dataset.split["train"]],
                                 minlength=num_clusters)
    src, dst = dataset.graph.edges()
    inside = float((clusters[src] == clusters[dst]).double().mean())
    del src, dst
    return clusters, {
        "path": str(path), "num_clusters": num_clusters, "status": status,
        "seconds": seconds, "peak_rss_mb": peak_rss_mb(),
        "nodes_per_cluster": {"min": int(sizes.min()),
                              "max": int(sizes.max())},
        "train_seeds_per_cluster": {"min": int(train_sizes.min()),
                                    "max": int(train_sizes.max())},
        "edges_inside_share": inside,
    }


def make_sampler(graph, fanouts, clusters, locality, group_size):
    """DGL's sampler (``locality`` None) or a `ClusterSampler`, timed.

    A `ClusterSampler` stores its edge weights in the graph under one
    fixed key, so the last one built decides the weights of all: build
    each right before it samples.
    """
    start = time.perf_counter()
    if locality is None:
        sampler = dgl.dataloading.NeighborSampler(fanouts)
    else:
        sampler = ClusterSampler(graph, fanouts, clusters, locality=locality,
                                 group_size=group_size)
    return sampler, time.perf_counter() - start


def epoch_order(sampler, seeds: torch.Tensor, seed: int) -> torch.Tensor:
    """Seeds in epoch order: `order_seeds` where the sampler has it, else
    shuffled (as `hmgraph.DataLoader` and `presample` do)."""
    if hasattr(sampler, "order_seeds"):
        return sampler.order_seeds(seeds, seed)
    generator = torch.Generator().manual_seed(seed)
    return seeds[torch.randperm(seeds.numel(), generator=generator)]


def sample_epoch(graph, sampler, order: torch.Tensor, batch_size: int,
                 keep_trace: bool, desc: str) -> dict:
    """Sample one epoch of blocks; time ``sampler.sample`` alone.

    Returns
    -------
    dict
        ``seconds``, ``batches``, ``input_nodes_per_batch``,
        ``edges_per_batch`` (sampled edges of all blocks),
        ``rows_touched`` (distinct input rows of the epoch) and, with
        ``keep_trace``, ``trace`` (sorted unique input ids per batch).
    """
    dgl.seed(SEED)
    batches = -(-order.numel() // batch_size)
    touched = torch.zeros(graph.num_nodes(), dtype=torch.bool)
    seconds, inputs, edges, trace = 0.0, 0, 0, []
    bar = progress(batches, desc)
    for index in range(batches):
        seeds = order[index * batch_size:(index + 1) * batch_size]
        start = time.perf_counter()
        input_nodes, _, blocks = sampler.sample(graph, seeds)
        seconds += time.perf_counter() - start
        inputs += input_nodes.numel()
        edges += sum(block.num_edges() for block in blocks)
        touched[input_nodes] = True
        if keep_trace:
            trace.append(input_nodes.sort().values)
        bar.update(1)
    bar.close()
    record = {
        "seconds": seconds, "batches": batches,
        "input_nodes_per_batch": inputs / batches,
        "edges_per_batch": edges / batches,
        "rows_touched": int(touched.sum()),
    }
    if keep_trace:
        record["trace"] = trace
    return record


def part_sampling(dataset, clusters, args) -> tuple[list, dict]:
    """Every sampler of `SAMPLERS`, ``args.repeats`` times, interleaved.

    Returns
    -------
    tuple of (list of dict, dict)
        One record per sampler (the fastest repeat's seconds, all of
        them in ``seconds_each``, ``vs_dgl``) and the epoch traces of
        `TRACED` (from the first repeat).
    """
    graph, seeds = dataset.graph, dataset.split["train"]
    records = {name: None for name, _, _ in SAMPLERS}
    traces = {}
    for repeat in range(args.repeats):
        for name, locality, group_size in SAMPLERS:
            sampler, construct = make_sampler(
                graph, args.fanouts, clusters, locality, group_size)
            order = epoch_order(sampler, seeds, SEED)
            keep = repeat == 0 and name in TRACED
            epoch = sample_epoch(graph, sampler, order, args.batch_size,
                                 keep, f"{name} ({repeat + 1})")
            if keep:
                traces[name] = epoch.pop("trace")
            del sampler
            print(f"{name:<20} repeat {repeat + 1}: "
                  f"{epoch['seconds']:.1f} s, "
                  f"{epoch['input_nodes_per_batch']:,.0f} input nodes/batch",
                  flush=True)
            if records[name] is None:
                records[name] = dict(
                    epoch, sampler=name, locality=locality,
                    group_size=group_size, construct_seconds=construct,
                    seconds_each=[])
            records[name]["seconds_each"].append(epoch["seconds"])
    records = list(records.values())
    for record in records:
        record["seconds"] = min(record["seconds_each"])
    dgl_seconds = records[0]["seconds"]
    for record in records:
        record["vs_dgl"] = record["seconds"] / dgl_seconds \
            if dgl_seconds > 0 else None
    return records, traces


# --------------------------------------------------------------------------
# (2) Hit rates


def tier_hits(contents: torch.Tensor, device_rows: int, trace,
              num_rows: int) -> dict:
    """Hits per tier on ``trace`` of a static cache holding ``contents``.

    The first ``device_rows`` of ``contents`` (highest score first) are on
    the device, the rest in host memory; every other row is in storage.

    Returns
    -------
    dict
        ``device``, ``host``, ``storage``: shares of the trace's requested
        rows (0.0 for an empty trace); ``requested`` rows.
    """
    tier = torch.zeros(num_rows, dtype=torch.int64)  # 0: storage
    tier[contents[device_rows:]] = 1
    tier[contents[:device_rows]] = 2
    counts = torch.zeros(3, dtype=torch.int64)
    for ids in trace:
        counts += torch.bincount(tier[ids], minlength=3)
    requested = int(counts.sum())
    shares = (counts.double() / requested).tolist() if requested \
        else [0.0, 0.0, 0.0]
    return {"device": shares[2], "host": shares[1], "storage": shares[0],
            "requested": requested}


def part_hit_rates(dataset, clusters, traces, args) -> list[dict]:
    """Static ``presample`` and ``layer-aware`` placement on each trace.

    Returns
    -------
    list of dict
        One per trace and policy: ``hit_rate`` per tier, Belady's hit rate
        with the same device + host rows, the profile's size.
    """
    graph, n = dataset.graph, dataset.num_nodes
    device_rows = int(DEVICE_SHARE * n)
    host_rows = int(HOST_SHARE * n)
    capacity = device_rows + host_rows
    records = []
    for name, locality, group_size in SAMPLERS:
        if name not in traces:
            continue
        trace = traces[name]
        # (a) Profile with the same sampler, in another order.
        sampler, _ = make_sampler(graph, args.fanouts, clusters, locality,
                                  group_size)
        start = time.perf_counter()
        profile = presample(graph, sampler, dataset.split["train"],
                            args.batch_size, PROFILE_BATCHES,
                            seed=PROFILE_SEED)
        profile_seconds = time.perf_counter() - start
        del sampler
        profiled_rows = int((profile.counts > 0).sum())
        # (b) Belady's optimal offline policy: the ceiling.
        start = time.perf_counter()
        belady = make_policy("belady", n, capacity)
        belady.set_trace(trace)
        belady_rate = replay(belady, trace)
        belady_seconds = time.perf_counter() - start
        del belady
        # (c) Each static placement: device = top rows, host = next.
        for policy_name in STATIC_POLICIES:
            policy = make_policy(policy_name, n, capacity,
                                 hotness=profile.counts,
                                 hop_counts=profile.hop_counts)
            rates = tier_hits(policy.warm(), device_rows, trace, n)
            record = {
                "trace": name, "policy": policy_name,
                "device_rows": device_rows, "host_rows": host_rows,
                "hit_rate": {k: rates[k] for k in
                             ("device", "host", "storage")},
                "requested_rows": rates["requested"],
                "trace_batches": len(trace),
                "belady_hit_rate": belady_rate,
                "belady_seconds": belady_seconds,
                "profile_batches": profile.num_batches,
                "profile_seed": PROFILE_SEED,
                "profile_seconds": profile_seconds,
                "profiled_rows": profiled_rows,
            }
            records.append(record)
            print(f"{name:<20} {policy_name:<12}: device "
                  f"{rates['device']:.1%} host {rates['host']:.1%} storage "
                  f"{rates['storage']:.1%} (Belady {belady_rate:.1%})",
                  flush=True)
    return records


# --------------------------------------------------------------------------
# (3) Storage pages


def storage_epoch(path: Path, trace, mapping, max_batches, desc) -> dict:
    """Pages and bytes one epoch reads from a feature file, no cache.

    The first ``max_batches`` batches (all when None) are read with
    `StorageFeature.read`; the pages of the others are counted from the
    tier's read plan, which is checked against the counters of the
    batches read.

    Parameters
    ----------
    path : pathlib.Path
        The feature file.
    trace : list of torch.Tensor
        Unique input ids per batch, in the original ids.
    mapping : torch.Tensor or None
        Original id -> id in this file (``info["inverse"]`` of a
        renumbered dataset); None for the original file.

    Returns
    -------
    dict
        ``pages`` and ``bytes`` per epoch (exact), ``batches``,
        ``batches_read``, the read batches' ``read_pages``,
        ``read_bytes``, ``read_seconds`` and ``plan_matches_reads``,
        ``direct`` (``O_DIRECT`` in use).
    """
    batches = len(trace)
    read = batches if max_batches is None else min(max_batches, batches)
    planned = planned_read = 0
    bar = progress(batches, desc)
    with StorageFeature(path, block_bytes=PAGE_BYTES) as feature:
        for index, ids in enumerate(trace):
            if mapping is not None:
                ids = mapping[ids].sort().values
            # The blocks `read` would issue (see `StorageFeature._plan`).
            pages = sum(task.buffer_blocks
                        for task in feature._plan(ids.numpy()))
            if index < read:
                feature.read(ids)
                planned_read += pages
            else:
                planned += pages
            bar.update(1)
        stats = feature.stats.as_dict()
        direct = feature.direct
    bar.close()
    pages = stats["blocks_read"] + planned
    return {
        "batches": batches, "batches_read": read,
        "block_bytes": stats["block_bytes"],
        "pages": pages,
        "bytes": stats["bytes_read"] + planned * stats["block_bytes"],
        "pages_per_batch": pages / batches if batches else 0.0,
        "rows_per_batch": sum(t.numel() for t in trace) / batches
        if batches else 0.0,
        "read_pages": stats["blocks_read"], "read_bytes": stats["bytes_read"],
        "read_rows": stats["rows_read"], "read_calls": stats["io_requests"],
        "read_seconds": stats["seconds"],
        "read_seconds_per_batch": stats["seconds"] / read if read else 0.0,
        "plan_matches_reads": planned_read == stats["blocks_read"],
        "direct": direct,
    }


def part_storage(dataset, clusters, num_clusters, traces,
                 args) -> tuple[list, dict]:
    """Each trace read from the original and the renumbered feature file.

    The renumbered file is `renumbered`'s, cached under
    ``renumbered-metis-<num_clusters>/`` as ``hmgraph train --renumber``
    makes it.

    Returns
    -------
    tuple of (list of dict, dict)
        One record per trace and layout (with ``vs_original``), and how
        the renumbered file was made (path, seconds).
    """
    tag = f"metis-{num_clusters}"
    start = time.perf_counter()
    moved = renumbered(dataset, clusters, tag)
    renumber = {"path": str(moved.feature_path),
                "seconds": time.perf_counter() - start, "tag": tag}
    layouts = (("original", dataset.feature_path, None),
               ("renumbered", moved.feature_path, moved.info["inverse"]))
    del moved  # its graph is a renumbered copy: only the ids are needed
    gc.collect()
    records = []
    for name, _, _ in SAMPLERS:
        if name not in traces:
            continue
        original_pages = None
        for layout, path, mapping in layouts:
            record = storage_epoch(Path(path), traces[name], mapping,
                                   args.max_batches, f"{name} {layout}")
            record.update(trace=name, layout=layout, path=str(path))
            if original_pages is None:
                original_pages = record["pages"]
            record["vs_original"] = record["pages"] / original_pages \
                if original_pages else None
            records.append(record)
            print(f"{name:<20} {layout:<10}: {record['pages']:,} pages "
                  f"({record['bytes'] / 1e9:.2f} GB) per epoch; "
                  f"{record['batches_read']} batches read in "
                  f"{record['read_seconds']:.1f} s", flush=True)
    return records, renumber


# --------------------------------------------------------------------------
# (4) Accuracy


def train_settings(name: str, args) -> dict:
    """Training settings of one accuracy dataset (see `CORA`)."""
    if name == "cora":
        return dict(CORA, epochs=args.cora_epochs, root=args.cora_root)
    return dict(SYNTH_TRAIN, dataset=name, root=args.root,
                fanouts=args.fanouts, batch_size=args.batch_size,
                hidden=args.hidden, epochs=args.epochs)


def part_accuracy(args, result: dict, out: Path) -> None:
    """Train every `TRAIN_CONFIGS` entry on each dataset; record each.

    Appends to ``result["accuracy"]`` and rewrites the results after
    every configuration.
    """
    names = [args.small] + (["cora"] if args.cora_root else [])
    for name in names:
        settings = train_settings(name, args)
        dataset = datasets.load(name, settings["root"], verify=False)
        exact = None
        for config_name, sampler, locality in TRAIN_CONFIGS:
            with tempfile.TemporaryDirectory(prefix="hmgraph-cluster-") \
                    as folder:
                config = TrainConfig(
                    **settings, model="sage", runs=args.runs, seed=SEED,
                    sampler=sampler, locality=locality,
                    group_size=TRAIN_GROUP_SIZE, out=folder,
                    eval_every=args.eval_every,
                    progress=False, verify=False,
                )
                start = time.perf_counter()
                trained = train(config, dataset=dataset)
                seconds = time.perf_counter() - start
            record = accuracy_record(name, config_name, config, trained,
                                     seconds)
            if exact is None:
                exact = record
            record["gap_points"] = 100.0 * (exact["test_mean"]
                                            - record["test_mean"])
            result["accuracy"].append(record)
            write_results(result, out)
            print(f"{name:<12} {config_name:<14}: test "
                  f"{100 * record['test_mean']:.2f} % (runs "
                  f"{', '.join(f'{100 * t:.2f}' for t in record['test'])})"
                  f" in {seconds:.0f} s", flush=True)
        del dataset
        gc.collect()


def accuracy_record(name, config_name, config, trained, seconds) -> dict:
    """The JSON record of one trained configuration."""
    runs = trained["runs"]
    summary = trained["summary"]
    epochs = [e["seconds"] for r in runs for e in r["epochs"]]
    evals = [s["eval"] for s in epochs if "eval" in s]
    return {
        "dataset": name, "config": config_name, "sampler": config.sampler,
        "locality": config.locality if config.sampler == "cluster" else None,
        "group_size": config.group_size
        if config.sampler == "cluster" else None,
        "epochs": config.epochs, "runs": config.runs,
        "test_mean": summary["test_mean"], "test_std": summary["test_std"],
        "valid_mean": summary["valid_mean"],
        "test": [r["test_at_best_valid"] for r in runs],
        "best_epoch": [r["best_epoch"] for r in runs],
        "test_last_epoch": [r["epochs"][-1]["test"] for r in runs],
        "seconds": seconds,
        "epoch_seconds_mean": sum(s["epoch"] for s in epochs) / len(epochs),
        "eval_seconds_mean": sum(evals) / len(evals) if evals else 0.0,
        "train": {k: getattr(config, k) for k in (
            "fanouts", "batch_size", "hidden", "dropout", "lr",
            "weight_decay", "seed", "clusters", "eval_every")},
    }


# --------------------------------------------------------------------------
# Targets and report


def targets(result: dict) -> list[dict]:
    """Each target's measure, limit and PASS / MISS (of what was run)."""
    rows = []
    sampling = {r["sampler"]: r for r in result["sampling"]}
    for name, _, group_size in SAMPLERS:
        if group_size == TRAIN_GROUP_SIZE and name in sampling:
            ratio = sampling[name]["vs_dgl"]
            rows.append({
                "target": f"sampling time {name} / DGL",
                "value": ratio, "limit": SAMPLE_RATIO_MAX, "unit": "x",
                "pass": ratio is not None and ratio <= SAMPLE_RATIO_MAX,
            })
    for r in result["storage"]:
        if r["trace"] == CLUSTER_TRACE and r["layout"] == "renumbered":
            rows.append({
                "target": f"storage pages per epoch renumbered / original "
                          f"({r['trace']})",
                "value": r["vs_original"], "limit": PAGES_RATIO_MAX,
                "unit": "x",
                "pass": r["vs_original"] is not None
                and r["vs_original"] <= PAGES_RATIO_MAX,
            })
    for r in result["accuracy"]:
        if r["sampler"] == "cluster":
            rows.append({
                "target": f"test accuracy gap exact - {r['config']} "
                          f"({r['dataset']})",
                "value": r["gap_points"], "limit": ACCURACY_GAP_MAX,
                "unit": "points",
                "pass": r["gap_points"] <= ACCURACY_GAP_MAX,
            })
    return rows


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def sampling_table(records: list[dict]) -> str:
    """One row per sampler."""
    lines = [
        "| sampler | locality | group size | batches | sample s | vs DGL (x)"
        " | input nodes/batch | sampled edges/batch | rows touched/epoch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        cells = [
            r["sampler"], "-" if r["locality"] is None else f"{r['locality']}",
            "-" if r["group_size"] is None else str(r["group_size"]),
            str(r["batches"]), f"{r['seconds']:.2f}",
            "-" if r["vs_dgl"] is None else f"{r['vs_dgl']:.3f}",
            f"{r['input_nodes_per_batch']:,.0f}",
            f"{r['edges_per_batch']:,.0f}", f"{r['rows_touched']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def hit_rate_table(records: list[dict]) -> str:
    """One row per trace and static policy."""
    lines = [
        "| trace | policy | device hit % | host hit % | storage % | "
        "device + host % | Belady device + host % | profiled rows |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        h = r["hit_rate"]
        cells = [r["trace"], r["policy"], _pct(h["device"]), _pct(h["host"]),
                 _pct(h["storage"]), _pct(h["device"] + h["host"]),
                 _pct(r["belady_hit_rate"]), f"{r['profiled_rows']:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def storage_table(records: list[dict]) -> str:
    """One row per trace and feature file layout."""
    lines = [
        "| trace | layout | pages/epoch | GB/epoch | pages/batch | "
        "vs original (x) | batches read | read s/batch |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        cells = [
            r["trace"], r["layout"], f"{r['pages']:,}",
            f"{r['bytes'] / 1e9:.2f}", f"{r['pages_per_batch']:,.0f}",
            f"{r['vs_original']:.3f}", f"{r['batches_read']} of "
            f"{r['batches']}", f"{r['read_seconds_per_batch']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def accuracy_table(records: list[dict]) -> str:
    """One row per dataset and sampler."""
    lines = [
        "| dataset | sampler | epochs | runs | test % (best valid) | "
        "per run | test % last epoch | gap vs exact (points) | "
        "epoch s | eval s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in records:
        last = sum(r["test_last_epoch"]) / len(r["test_last_epoch"])
        cells = [
            r["dataset"], r["config"], str(r["epochs"]), str(r["runs"]),
            f"{100 * r['test_mean']:.2f} ± {100 * r['test_std']:.2f}",
            ", ".join(f"{100 * t:.2f}" for t in r["test"]),
            f"{100 * last:.2f}", f"{r['gap_points']:+.2f}",
            f"{r['epoch_seconds_mean']:.1f}",
            f"{r['eval_seconds_mean']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_section(rows: list[dict]) -> str:
    """The targets as a table with PASS / MISS."""
    if not rows:
        return "No target measured yet.\n"
    lines = ["| target | measured | limit | result |", "|---|---:|---:|---|"]
    for t in rows:
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"| {t['target']} | {value} {t['unit']} | <= "
                     f"{t['limit']} {t['unit']} | "
                     f"{'PASS' if t['pass'] else 'MISS'} |")
    return "\n".join(lines) + "\n"


def markdown_report(result: dict) -> str:
    """The markdown file: setup, one table per part, targets, notes."""
    c, env = result["config"], result["environment"]
    fanouts = ",".join(str(f) for f in c["fanouts"])
    setup = (f"torch {env['torch']}, dgl {env['dgl']}, "
             f"{env['torch_num_threads']} threads, {env['cpu_count']} CPUs.")
    if "nodes" in c:
        setup = (
            f"{c['dataset']}: {c['nodes']:,} nodes, {c['edges']:,} edges, "
            f"{c['train_seeds']:,} train seeds in {c['batches']} batches of "
            f"{c['batch_size']}, fanouts {fanouts}; {c['num_clusters']} "
            f"METIS clusters (one per batch). {setup}")
    text = ["# Cluster sampling\n", setup + "\n"]
    if result["metis"]:
        m = result["metis"]
        text.append(
            f"METIS ({m['num_clusters']} clusters, `{m['path']}`): "
            f"{m['status']} in {m['seconds']:.1f} s; "
            f"{100 * m['edges_inside_share']:.1f} % of edges inside a "
            f"cluster, {m['train_seeds_per_cluster']['min']}-"
            f"{m['train_seeds_per_cluster']['max']} train seeds per "
            f"cluster.\n")
    if result["sampling"]:
        text += [
            "## Sampling\n",
            f"One epoch of blocks per sampler, no feature reads; seconds in"
            f" `sampler.sample` only, the fastest of {c['repeats']} "
            f"interleaved epoch(s). DGL's seeds shuffled, the cluster "
            f"samplers' in `order_seeds` order.\n",
            sampling_table(result["sampling"]),
        ]
    if result["hit_rates"]:
        r0 = result["hit_rates"][0]
        text += [
            "## Static placement hit rates\n",
            f"Device tier {_pct(DEVICE_SHARE)} % of rows "
            f"({r0['device_rows']:,}), host tier {_pct(HOST_SHARE)} % "
            f"({r0['host_rows']:,}); profile: `presample` of "
            f"{r0['profile_batches']} batches with the same sampler (seed "
            f"{PROFILE_SEED}, another order than the epoch's). Hit rates are"
            f" shares of each batch's unique input rows over the whole "
            f"epoch trace; Belady: the optimal offline policy with device +"
            f" host rows on the same trace.\n",
            hit_rate_table(result["hit_rates"]),
        ]
    if result["storage"]:
        s0 = result["storage"][0]
        text += [
            "## Storage pages per epoch\n",
            f"Each epoch trace read through `StorageFeature` (O_DIRECT: "
            f"{s0['direct']}; no cache) from the original feature file and "
            f"from the file renumbered by cluster "
            f"(`{result['renumber']['path']}`). Pages per epoch are exact: "
            f"the batches read counted by the tier, the rest from its read "
            f"plan (plan matched the reads: "
            f"{all(r['plan_matches_reads'] for r in result['storage'])}). "
            f"Pages include the short gaps the tier reads through.\n",
            storage_table(result["storage"]),
        ]
    if result["accuracy"]:
        text += [
            "## Accuracy\n",
            "`hmgraph.train`, GraphSAGE, Adam; exact: DGL's "
            "`NeighborSampler`, cluster: `ClusterSampler` with group size "
            f"{TRAIN_GROUP_SIZE} and one METIS cluster per batch. Test "
            "accuracy at the epoch of best validation accuracy (evaluated "
            f"every {c['eval_every']} epoch(s) and after the last), mean ± "
            "std over runs; the gap is exact minus cluster; epoch s: one "
            "training epoch, eval s: one evaluation (full-neighbour "
            "inference on all nodes). synth datasets: "
            f"fanouts {fanouts}, batch {c['batch_size']}, hidden "
            f"{c['hidden']}, lr {SYNTH_TRAIN['lr']}; Cora (public split): "
            f"fanouts 10,10, batch {CORA['batch_size']}, hidden "
            f"{CORA['hidden']}, lr {CORA['lr']}, weight decay "
            f"{CORA['weight_decay']}.\n",
            accuracy_table(result["accuracy"]),
        ]
    text += ["## Targets\n", targets_section(result["targets"])]
    notes = list(result["notes"])
    if result.get("wall_seconds"):
        notes.append(f"Wall time of this invocation: "
                     f"{result['wall_seconds'] / 60:.0f} min.")
    if result["contention"]:
        scripts = sorted({w for c in result["contention"]
                          for p in c["processes"] for w in p.split()
                          if w.endswith(".py") and "bench/" in w})
        when = ", ".join(c["when"] for c in result["contention"])
        notes.append(
            f"Other benchmarks ran at the same time "
            f"({', '.join(f'`{s}`' for s in scripts)}; seen at {when}; "
            f"command lines in the JSON): times are noisier than on an "
            f"idle machine.")
    if notes:
        text += ["## Notes\n", "\n".join(f"- {n}" for n in notes) + "\n"]
    return "\n".join(text)


def write_results(result: dict, out: Path) -> Path:
    """Write the JSON and the markdown report, each atomically.

    Returns
    -------
    pathlib.Path
        Path of the markdown file (``out`` with suffix ``.md``).
    """
    result["targets"] = targets(result)
    result["peak_rss_mb"] = peak_rss_mb()
    result["wall_seconds"] = time.time() - result["started_unix"]
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    md = out.with_suffix(".md")
    with atomic_path(md) as tmp:
        tmp.write_text(markdown_report(result))
    return md


# --------------------------------------------------------------------------
# Main


def new_result(args) -> dict:
    """The result skeleton: configuration, environment, empty parts."""
    return {
        "config": {
            "dataset": args.dataset, "root": str(args.root),
            "fanouts": args.fanouts, "batch_size": args.batch_size,
            "repeats": args.repeats, "max_batches": args.max_batches,
            "parts": args.parts, "quick": args.quick,
            "accuracy_datasets": [args.small]
            + (["cora"] if args.cora_root else []),
            "epochs": args.epochs, "cora_epochs": args.cora_epochs,
            "runs": args.runs, "hidden": args.hidden,
            "eval_every": args.eval_every,
            "cora_root": args.cora_root, "seed": SEED,
            "device_share": DEVICE_SHARE, "host_share": HOST_SHARE,
            "profile_batches": PROFILE_BATCHES,
        },
        "environment": {
            "torch": torch.__version__, "dgl": dgl.__version__,
            "numpy": np.__version__, "hmgraph": hmgraph.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        },
        "metis": None, "sampling": [], "hit_rates": [], "storage": [],
        "renumber": None, "accuracy": [], "targets": [], "notes": [],
        "contention": [], "started_unix": time.time(), "wall_seconds": 0.0,
    }


def run_dataset_parts(args, result: dict, out: Path) -> None:
    """Parts 1-3 on ``args.dataset``; results rewritten after each."""
    # (a) The dataset, its sparse formats and the clusters.
    start = time.perf_counter()
    dataset = datasets.load(args.dataset, args.root, verify=False)
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    dataset.graph.create_formats_()
    prepare_seconds = time.perf_counter() - start
    num_clusters = cluster_count(dataset, args.batch_size)
    train_seeds = dataset.split["train"].numel()
    result["config"].update(
        nodes=dataset.num_nodes, edges=dataset.graph.num_edges(),
        train_seeds=train_seeds, num_clusters=num_clusters,
        batches=-(-train_seeds // args.batch_size),
        feature_path=str(dataset.feature_path),
        feature_bytes=dataset.manifest.data_bytes,
        row_bytes=dataset.manifest.row_bytes,
        load_seconds=load_seconds, prepare_seconds=prepare_seconds,
    )
    print(f"{args.dataset}: loaded in {load_seconds:.1f} s, "
          f"{result['config']['batches']} batches per epoch", flush=True)
    clusters, result["metis"] = load_clusters(dataset, num_clusters)
    write_results(result, out)
    # (b) Sampling, with the traces parts 2 and 3 replay.
    result["sampling"], traces = part_sampling(dataset, clusters, args)
    note_contention(result, "sampling")
    write_results(result, out)
    # (c) Hit rates of static placement.
    if "hit_rates" in args.parts:
        result["hit_rates"] = part_hit_rates(dataset, clusters, traces, args)
        note_contention(result, "hit rates")
        write_results(result, out)
    # (d) Storage pages with and without renumbering.
    if "storage" in args.parts:
        result["storage"], result["renumber"] = part_storage(
            dataset, clusters, num_clusters, traces, args)
        if any(r["batches_read"] < r["batches"] for r in result["storage"]):
            result["notes"].append(
                f"Storage: only the first {args.max_batches} batches of each "
                f"trace were read from disk (timed); the pages of the others"
                f" were counted from the storage tier's read plan, so pages "
                f"and GB per epoch are exact and read s/batch is over the "
                f"batches read.")
        note_contention(result, "storage")
        write_results(result, out)


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for; return the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    result = new_result(args)
    note_contention(result, "start")
    try:
        # (1)-(3) Sampling, hit rates and storage on the large dataset.
        if "sampling" in args.parts:
            run_dataset_parts(args, result, out)
            gc.collect()
        # (4) Accuracy on synth-small and Cora.
        if "accuracy" in args.parts:
            part_accuracy(args, result, out)
            note_contention(result, "accuracy")
    except ValueError as err:  # hmgraph's DatasetError and the like
        print(f"cluster: error: {err}", file=sys.stderr)
        return 2
    md = write_results(result, out)
    print(md.read_text(), end="")
    print(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

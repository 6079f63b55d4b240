"""``hmgraph partition`` and ``hmgraph train-dist``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from hmgraph.args import non_negative_int, positive_int
from hmgraph.cache.budget import parse_budget
from hmgraph.cache.format import open_feature_file
from hmgraph.datasets import load
from hmgraph.distributed.launcher import LaunchError, launch
from hmgraph.markdown import markdown_table
from hmgraph.partition import (
    METHODS,
    assign_and_count,
    read_partition_info,
    write_partitions,
)
from hmgraph.settings import (
    SHARE_BUDGETS,
    WORKLOAD,
    TrainConfig,
    add_arguments,
    cache_policies,
)

__all__ = ["add_parsers", "make_partitions", "partition_command",
           "train_dist_command"]


def add_parsers(commands) -> None:
    """Add ``partition`` and ``train-dist`` to an argparse subparsers."""
    part = commands.add_parser(
        "partition", help="partition a dataset for DGL's distributed engine",
        description="""
        Split a dataset into parts that dgl.distributed loads unchanged
        (DGL's JSON config, one folder per part), with DGL's random or METIS
        assignment or hmgraph's self-dependence (2PGraph) or hierarchy
        (HMGraph) methods; prints edge cut, replication and one epoch's
        remote traffic per part.""",
    )
    add_arguments(part, TrainConfig, WORKLOAD)
    part.add_argument("--parts", type=positive_int, required=True)
    part.add_argument("--method", default="metis", choices=METHODS)
    part.add_argument("--out", required=True, help="output folder")
    part.add_argument("--clusters-per-part", type=positive_int, default=16,
                      help="METIS clusters per part (self-dependence, "
                      "hierarchy)")
    part.add_argument("--replication", type=float, default=0.5,
                      help="replicated vertices per part, as a share of "
                      "the vertices it owns (0.5: factor <= 1.5)")
    add_arguments(part, TrainConfig, ["device_budget", "host_budget"],
                  changes=_each_machine(SHARE_BUDGETS))
    part.add_argument("--machine-budgets", default=None,
                      help="fast-tier bytes per machine, comma separated "
                      "(overrides the two above), e.g. 2GB,1GB,1GB,1GB")
    part.add_argument("--halo-hops", type=positive_int, default=1)
    add_arguments(part, TrainConfig, ["seed"])
    part.add_argument("--no-stats", action="store_true",
                      help="skip the epoch replay that counts remote "
                      "traffic")
    add_arguments(part, TrainConfig, ["progress"])

    dist = commands.add_parser(
        "train-dist", help="distributed training on loopback",
        description="""
        Start one DGL server per part and the trainers on this machine,
        train with DistributedDataParallel, and tear everything down (also
        when a process dies).""",
    )
    dist.add_argument("--parts-dir", required=True,
                      help="written by hmgraph partition")
    dist.add_argument("--trainers", type=positive_int, default=None,
                      help="trainer processes (a multiple of the parts; "
                      "default one per part)")
    add_arguments(dist, TrainConfig, [
        "model", "fanouts", "batch_size", "hidden", "dropout", "lr", "epochs",
        "seed", "cache", "device_budget", "host_budget", "device"], changes={
            "batch_size": {"help": "global batch, split evenly among "
                           "trainers"},
            "epochs": {"default": 1},
            "cache": {"default": "hmgraph", "help": "cache policy, or none",
                      "choices": lambda: ["none", *cache_policies()]},
            **SHARE_BUDGETS})
    dist.add_argument("--threads", type=positive_int, default=1,
                      help="torch threads per trainer")
    dist.add_argument("--timeout", type=float, default=3600.0,
                      help="seconds before the job is stopped")
    dist.add_argument("--log-every", type=non_negative_int, default=0,
                      help="print a trainer's loss every N batches")
    dist.add_argument("--out", default=None,
                      help="output folder (default runs/dist-PARTS)")


def _each_machine(budgets: dict) -> dict:
    """``budgets`` (`SHARE_BUDGETS`), with the help of a machine's tier."""
    helps = {"device_budget": "each machine's device tier (512MB, 2GB, "
             "5%%)", "host_budget": "each machine's host tier"}
    return {name: dict(change, help=helps[name])
            for name, change in budgets.items()}


def _machine_budgets(args, num_parts: int, feature_bytes: int) -> list[int]:
    if args.machine_budgets:
        budgets = [parse_budget(t.strip(), feature_bytes)
                   for t in args.machine_budgets.split(",")]
        if len(budgets) != num_parts:
            raise ValueError(
                f"--machine-budgets lists {len(budgets)} machines for "
                f"--parts {num_parts}; give one per part"
            )
        return budgets
    each = parse_budget(args.device_budget, feature_bytes) + \
        parse_budget(args.host_budget, feature_bytes)
    return [each] * num_parts


def make_partitions(args, progress=None) -> dict:
    """Assign, count and write partitions as ``args`` says; the info dict."""
    from hmgraph.samplers.cluster import metis_clusters  # lazy: loads DGL

    dataset = load(args.dataset, args.root, features_on="disk")
    graph = dataset.graph
    if args.parts > graph.num_nodes():
        raise ValueError(
            f"--parts {args.parts} exceeds the {graph.num_nodes()} nodes of "
            f"{args.dataset}"
        )
    if args.replication < 0:
        raise ValueError(f"--replication {args.replication}: must be >= 0")
    manifest, rows = open_feature_file(dataset.feature_path)
    row_bytes = manifest.row_bytes
    budgets = _machine_budgets(args, args.parts,
                               row_bytes * graph.num_nodes())
    train_ids = dataset.split["train"]
    clusters = None
    if args.method in ("self-dependence", "hierarchy"):
        count = args.parts * args.clusters_per_part
        cache = Path(dataset.feature_path).parent / f"metis-{count}.npy"
        clusters = metis_clusters(graph, count, cache)
    assignment, stats, seconds = assign_and_count(
        graph, args.parts, args.method, train_ids=train_ids,
        fanouts=args.fanouts, batch_size=args.batch_size,
        row_bytes=row_bytes, budgets=budgets, clusters=clusters,
        replication=args.replication, seed=args.seed,
        count=not args.no_stats, progress=progress,
    )
    node_data = {"label": dataset.labels.long()}
    for split in ("train", "valid", "test"):
        mask = torch.zeros(graph.num_nodes(), dtype=torch.bool)
        mask[dataset.split[split]] = True
        node_data[f"{split}_mask"] = mask
    write_partitions(
        graph, assignment, args.out, args.dataset.replace("-", "_"), rows,
        node_data, num_hops=args.halo_hops, stats=stats,
        extra={
            "dataset": {"name": args.dataset,
                        "num_classes": int(dataset.num_classes),
                        "row_bytes": row_bytes},
            "assign_seconds": seconds["assign_seconds"],
            "machine_budgets": budgets,
            "fanouts": args.fanouts,
            "batch_size": args.batch_size,
        },
    )
    return read_partition_info(args.out)


def format_partition(info: dict) -> str:
    """A short markdown table of a partition's statistics."""
    stats = info.get("stats") or {}
    lines = [
        f"{info['method']}: {info['num_parts']} parts of "
        f"{info['dataset']['name']}, replication factor "
        f"{info['replication_factor']:.3f}",
    ]
    if not stats:
        return lines[0]
    lines[0] += f", edge cut {stats['edge_cut']:.3f}"
    rows = []
    for p in stats["parts"]:
        fast = p["fast_hit_rate"]
        rows.append([
            str(p["part"]), f"{p['owned']:,}", f"{p['replicated']:,}",
            f"{p['train']:,}", f"{p['remote_bytes'] / 1e6:.1f}",
            f"{100 * p['local_read_rate']:.1f}",
            _percent(p["remote_sampling_requests"], p["sampling_requests"]),
            "-" if fast is None else f"{100 * fast:.1f}",
        ])
    rows.append([
        "all", "", "", "", f"{stats['remote_bytes'] / 1e6:.1f}",
        f"{100 * (1 - stats['remote_rows'] / max(1, stats['rows_read'])):.1f}",
        _percent(stats["remote_sampling_requests"],
                 stats["sampling_requests"]), "",
    ])
    table = markdown_table(
        ["part", "owned", "replicated", "train", "remote MB/epoch",
         "local reads %", "remote sampling %", "fast-tier hit %"], rows,
        align="r" * 8)
    return "\n".join([*lines, "", table])


def _percent(part: int, whole: int) -> str:
    """``100 * part / whole`` to one decimal (0 of nothing is 0.0)."""
    return f"{100 * part / max(1, whole):.1f}"


def partition_command(args) -> int:
    """Run ``hmgraph partition``."""
    def progress(iterable, desc=None):
        return tqdm(iterable, desc=desc, leave=False,
                    disable=args.no_progress)

    info = make_partitions(args, progress)
    print(format_partition(info))
    print(f"partitions: {info['config']}")
    return 0


def train_dist_command(args) -> int:
    """Run ``hmgraph train-dist``; 1 when a process died or timed out."""
    info = read_partition_info(args.parts_dir)
    trainers = args.trainers or info["num_parts"]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device here; "
                         "use --device cpu")
    if args.batch_size < trainers:
        raise ValueError(
            f"--batch-size {args.batch_size} is smaller than --trainers "
            f"{trainers}: every trainer needs at least one seed per batch"
        )
    settings = {
        "model": args.model, "hidden": args.hidden, "dropout": args.dropout,
        "lr": args.lr, "fanouts": args.fanouts,
        "batch_size": math.ceil(args.batch_size / trainers),
        "epochs": args.epochs, "seed": args.seed, "cache": args.cache,
        "device_budget": args.device_budget,
        "host_budget": args.host_budget, "device": args.device,
        "threads": args.threads, "log_every": args.log_every,
    }
    out = Path(args.out or f"runs/dist-{Path(args.parts_dir).name}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = launch(args.parts_dir, trainers, settings,
                        timeout=args.timeout,
                        log=lambda line: print(line, flush=True))
    except LaunchError as err:
        print(f"hmgraph train-dist: error: {err}", file=sys.stderr)
        return 1
    result = {"partition": {k: info[k] for k in
                            ("method", "num_parts", "replication_factor")},
              "settings": {**settings, "trainers": trainers},
              **result}
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out / "result.json")
    print(format_dist_result(result))
    print(f"result: {out / 'result.json'}")
    return 0


def format_dist_result(result: dict) -> str:
    """Accuracy and a per-trainer table of a ``train-dist`` result."""
    acc = result["accuracy"]
    lines = [
        f"valid acc {acc['valid']:.4f}, test acc {acc['test']:.4f} at "
        f"epoch {acc['epoch']} "
        f"({result['settings']['trainers']} trainers, "
        f"{result['partition']['num_parts']} parts, "
        f"{result['partition']['method']})",
    ]
    rows = []
    for t in result["trainers"]:
        last = t["epochs"][-1]
        hit = (last["loader"].get("cache") or {}).get("hit_rate", {})
        feats, samp = last["features"], last["sampling"]
        rows.append([
            str(t["rank"]), str(t["part"]), f"{t['train_vertices']:,}",
            f"{last['seconds']:.1f}", f"{100 * hit.get('device', 0.0):.1f}",
            f"{100 * hit.get('host', 0.0):.1f}",
            _percent(feats["remote_rows"],
                     feats["local_rows"] + feats["remote_rows"]),
            f"{feats['remote_bytes'] / 1e6:.1f}",
            _percent(samp["remote_requests"], samp["requests"]),
        ])
    table = markdown_table(
        ["trainer", "part", "seeds", "epoch s", "device hit %", "host hit %",
         "remote rows %", "remote MB", "remote sampling %"], rows,
        align="r" * 9)
    return "\n".join([*lines, "", table])

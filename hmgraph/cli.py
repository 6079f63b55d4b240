"""The ``hmgraph`` command line.

``hmgraph train`` trains a node classifier; every mistake in the input is
reported as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

import hmgraph.openmp  # noqa: F401  (OMP_WAIT_POLICY, before torch loads)
from hmgraph.args import (
    add_workload_arguments,
    budget_text,
    check_out_folder,
    device_name,
    fraction,
    name_list,
    non_negative_float,
    non_negative_int,
    parse_budget_shares,
    parse_fanouts,
    positive_float,
    positive_int,
    unit_interval,
)

__all__ = ["main"]


class CliError(ValueError):
    """A bad command-line value."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hmgraph",
        description="GNN training on graphs whose features outgrow memory.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True)

    _add_train_parser(commands)
    _add_analyze_parser(commands)
    _add_disk_parser(commands)
    from hmgraph.classify import add_parser as add_classify

    add_classify(commands)
    from hmgraph.distributed.commands import add_parsers as add_distributed

    add_distributed(commands)
    _add_bench_parser(commands)
    return parser


def _add_train_parser(commands) -> None:
    """``hmgraph train``: the model, the run, sampling and the cache."""
    # Lazy: the datasets' and models' registries load torch and DGL.
    from hmgraph.datasets import known_datasets
    from hmgraph.models import MODELS

    train = commands.add_parser(
        "train", help="node classification with neighbour sampling",
        description="Train a GNN node classifier with mini-batch neighbour "
        "sampling and report OGB-style results.",
    )
    train.add_argument("--dataset", default="synth-small",
                       help=f"one of: {', '.join(known_datasets())}")
    train.add_argument("--root", default="data",
                       help="folder holding datasets (default: data)")
    train.add_argument("--model", default="sage", choices=sorted(MODELS))
    tuned = "(default: the table for the dataset's family, printed at "\
        "start; see the README)"
    train.add_argument("--fanouts", type=parse_fanouts, default=None,
                       help="neighbours per layer, input layer first, e.g. "
                       "15,10,5; -1 takes all; the count sets the number of "
                       f"layers {tuned}")
    train.add_argument("--batch-size", type=positive_int, default=None,
                       help=tuned)
    train.add_argument("--hidden", type=positive_int, default=None,
                       help=tuned)
    train.add_argument("--layers", type=positive_int, default=None,
                       help="number of layers; must match the fanouts "
                       "(a single fanout is repeated; the table's fanouts "
                       "are cut or extended at the input end)")
    train.add_argument("--dropout", type=fraction, default=None,
                       help=f"after each hidden layer {tuned}")
    train.add_argument("--input-dropout", type=fraction, default=None,
                       help=f"on the input features {tuned}")
    train.add_argument("--attn-dropout", type=fraction, default=None,
                       help=f"on attention weights (gat) {tuned}")
    train.add_argument("--lr", type=positive_float, default=None,
                       help=tuned)
    train.add_argument("--weight-decay", type=non_negative_float,
                       default=None, help=tuned)
    train.add_argument("--num-heads", type=positive_int, default=None,
                       help=f"attention heads (gat) {tuned}")
    train.add_argument("--epochs", type=positive_int, default=None,
                       help=tuned)
    train.add_argument("--runs", type=positive_int, default=1)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", type=device_name, default="cpu",
                       help="cpu, cuda or cuda:N")
    train.add_argument("--eval-every", type=positive_int, default=1)
    train.add_argument("--eval", default="auto",
                       choices=["auto", "layerwise", "sampled"],
                       help="full-neighbour layer-wise inference on every "
                       "node, or the training fanouts on valid and test "
                       "nodes (auto: layer-wise unless, with features on "
                       "disk, it would read over 32 GiB from storage)")
    train.add_argument("--out", default=None,
                       help="output folder (default runs/DATASET-MODEL)")
    _add_sampling_arguments(train)
    _add_cache_arguments(train)
    train.add_argument("--resume", action="store_true",
                       help="continue from OUT/checkpoint.pt")
    train.add_argument("--no-verify", action="store_true",
                       help="skip the feature file's checksum")
    train.add_argument("--no-progress", action="store_true")


def _add_sampling_arguments(train: argparse.ArgumentParser) -> None:
    """``hmgraph train``'s sampling group: sampler, clusters, layout."""
    sampling = train.add_argument_group("sampling")
    sampling.add_argument("--sampler", default="neighbor",
                          choices=["neighbor", "cluster"],
                          help="DGL's neighbour sampler, or cluster "
                          "sampling (2PGraph)")
    sampling.add_argument("--clusters", type=non_negative_int, default=0,
                          help="METIS clusters (default: one per batch)")
    sampling.add_argument("--locality", type=unit_interval, default=1.0,
                          help="0: uniform neighbours .. 1: only inside "
                          "the cluster")
    sampling.add_argument("--group-size", type=positive_int, default=4,
                          help="clusters mixed into the same batches")
    sampling.add_argument("--renumber", action="store_true",
                          help="make clusters contiguous id ranges "
                          "(feature file rewritten once)")
    sampling.add_argument("--layout", default="auto",
                          choices=["auto", "file", "hot-first"],
                          help="order of the feature file's rows: as "
                          "stored, or hot-first (nodes renumbered hottest "
                          "first by a profile of the training batches, "
                          "inside each cluster with --renumber, so cached "
                          "rows fill whole pages and misses fall on cold "
                          "ones; the file is rewritten once and cached "
                          "beside it). auto: hot-first with features on "
                          "disk and a profiled cache (presample, "
                          "layer-aware, hmgraph), else file")


def _add_cache_arguments(train: argparse.ArgumentParser) -> None:
    """``hmgraph train``'s feature cache group: policy, budgets, reuse."""
    # Lazy: the policies' registry loads torch.
    from hmgraph.cache.policies import POLICIES

    cache = train.add_argument_group("feature cache")
    cache.add_argument("--cache", default=None,
                       choices=[n for n in POLICIES if n != "belady"],
                       help="cache policy (default: no cache)")
    cache.add_argument("--device-budget", default="0",
                       help="device tier memory: 512MB, 2GB or 5%% of the "
                       "feature bytes")
    cache.add_argument("--host-budget", default="auto",
                       help="host tier memory, same forms, or auto "
                       "(default: with features on disk, what is free "
                       "after the graph, the working set and 2 GiB; "
                       "with features in memory, 0)")
    cache.add_argument("--features-on", default="memory",
                       choices=["memory", "disk"],
                       help="rows in memory, or read from the feature file "
                       "with O_DIRECT")
    cache.add_argument("--prefetch", type=non_negative_int, default=None,
                       help="batches sampled and fetched ahead in threads "
                       "(default: 1 with features on disk, three batches of "
                       "rows in flight; 2 in memory)")
    cache.add_argument("--window", type=non_negative_int, default=4,
                       help="lookahead batches for the hmgraph cache")
    cache.add_argument("--reuse", default="none",
                       choices=["none", "one-level", "two-level"],
                       help="keep rows of recent batches on the device")
    cache.add_argument("--placement", default="frequency",
                       choices=["frequency", "layer-aware"],
                       help="rank of rows for static placement")
    cache.add_argument("--profile-batches", type=positive_int, default=32,
                       help="batches sampled to plan the cache")


def _add_analyze_parser(commands) -> None:
    """``hmgraph analyze``: replay cache policies on a traced epoch."""
    analyze = commands.add_parser(
        "analyze", help="replay cache policies on an epoch's accesses",
        description="Record the access trace of an epoch, replay every "
        "cache policy at several budgets against Belady's optimum, and "
        "write JSON, PNG plots and a markdown summary.",
    )
    add_workload_arguments(analyze)
    analyze.add_argument("--batches", type=non_negative_int, default=0,
                         help="batches to trace (default: one epoch)")
    analyze.add_argument("--budgets", type=parse_budget_shares,
                         default=[0.01, 0.02, 0.05, 0.10, 0.20, 0.40],
                         help="capacities in %% of rows, e.g. 1,5,20")
    analyze.add_argument("--sampler", default="neighbor",
                         choices=["neighbor", "cluster"])
    analyze.add_argument("--clusters", type=non_negative_int, default=0)
    analyze.add_argument("--locality", type=unit_interval, default=1.0)
    analyze.add_argument("--profile-batches", type=positive_int,
                         default=32)
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", default="bench/results")
    analyze.add_argument("--no-verify", action="store_true")


def _add_disk_parser(commands) -> None:
    """``hmgraph disk``: the disk model of a feature file."""
    disk = commands.add_parser(
        "disk", help="the disk model a feature file is read with",
        description="Print the disk model the storage tier plans and "
        "prices reads with (logical block size, random 4 KiB reads/s at "
        "each queue depth from 1 to 128 and the depth where they stop "
        "growing, sequential bandwidth there, break-even gap), measured "
        "once on the file and cached beside it; --refresh measures again.",
    )
    disk.add_argument("path", help="a feature file (node-feat.bin)")
    disk.add_argument("--threads", type=positive_int, default=None,
                      help="queue depth: the storage tier's threads "
                      "(default: measured, where reads/s stop growing)")
    disk.add_argument("--refresh", action="store_true",
                      help="measure again and replace the cached model")


def _add_bench_parser(commands) -> None:
    """``hmgraph bench``: every configuration side by side."""
    bench = commands.add_parser(
        "bench", help="every configuration side by side",
        description="Train the same model with DGL's loader (in memory, "
        "and memmap with a cold page cache) and with hmgraph's loader "
        "under each cache policy, reuse and cluster sampling; one table.",
    )
    add_workload_arguments(bench)
    bench.add_argument("--epochs", type=positive_int, default=1)
    bench.add_argument("--hidden", type=positive_int, default=256)
    bench.add_argument("--lr", type=float, default=0.003)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--device-budget", default="5%", type=budget_text)
    bench.add_argument("--host-budget", default="20%", type=budget_text)
    bench.add_argument("--configs", type=name_list(), default=None,
                       help="subset, comma separated")
    bench.add_argument("--amortize-epochs", type=positive_int, default=10,
                       help="epochs a configuration's construction is "
                       "amortized over in the extra ratio column (default: "
                       "%(default)s)")
    bench.add_argument("--out", default="bench/results")
    bench.add_argument("--quick", action="store_true",
                       help="smoke-test sizes: fanouts 5,5, batch 256, "
                       "hidden 32, one epoch")


def _bench_command(args) -> int:
    from hmgraph.benchmark import ConfigurationFailed, run

    if args.quick:
        args.fanouts, args.batch_size, args.hidden, args.epochs = (
            [5, 5], 256, 32, 1)
    try:
        run(args)
    except ConfigurationFailed as failure:
        print(failure.stderr.rstrip(), file=sys.stderr)
        print(f"hmgraph bench: error: {failure}", file=sys.stderr)
        return 1
    return 0


def _analyze_command(args) -> int:
    from hmgraph.analysis import run

    run(args)
    return 0


def _train_command(args) -> int:
    import torch

    from hmgraph import defaults
    from hmgraph.report import format_result
    from hmgraph.train import TrainConfig, train

    # (1) The tuned settings: the flags given, the table for the rest.
    given = {name: getattr(args, name) for name in defaults.TUNED}
    settings, defaulted = defaults.resolve(args.dataset, args.model, given)
    fanouts = settings["fanouts"]
    if args.layers is not None:
        if args.fanouts is None:
            fanouts = defaults.fit_fanouts(fanouts, args.layers)
        elif len(fanouts) == 1:
            fanouts = fanouts * args.layers
        elif len(fanouts) != args.layers:
            raise CliError(
                f"--layers {args.layers} does not match --fanouts "
                f"{','.join(map(str, fanouts))} ({len(fanouts)} layers)"
            )
    settings["fanouts"] = fanouts
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise CliError(f"--device {args.device}: no CUDA device here; "
                       f"use --device cpu")
    check_out_folder(args.out or f"runs/{args.dataset}-{args.model}")
    config = TrainConfig(
        dataset=args.dataset, root=args.root, model=args.model,
        **settings, runs=args.runs, seed=args.seed, device=args.device,
        eval_every=args.eval_every,
        eval=args.eval, out=args.out or f"runs/{args.dataset}-{args.model}",
        cache=args.cache, device_budget=args.device_budget,
        host_budget=args.host_budget, features_on=args.features_on,
        prefetch=args.prefetch, window=args.window,
        profile_batches=args.profile_batches, reuse=args.reuse,
        placement=args.placement, sampler=args.sampler,
        clusters=args.clusters, locality=args.locality,
        group_size=args.group_size,
        renumber=args.renumber, layout=args.layout, resume=args.resume,
        verify=not args.no_verify,
        progress=not args.no_progress,
    )
    # (2) Say which defaults this run took, before any loading.
    print(defaults.describe(args.dataset, args.model, settings, defaulted),
          flush=True)
    result = train(config)
    print(format_result(result))
    return 0


def _disk_command(args) -> int:
    import json
    from pathlib import Path

    from hmgraph.cache.disk import disk_model
    from hmgraph.cache.format import read_manifest

    read_manifest(Path(args.path))  # a feature file, or a one-line error
    model = disk_model(args.path, args.threads, refresh=args.refresh)
    print(model.describe())
    if model.sweep:
        print(f"random 4 KiB reads/s per queue depth: "
              f"{model.describe_sweep()}")
    print(json.dumps(model.as_dict(), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hmgraph`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from hmgraph import classify
    from hmgraph.distributed import commands as distributed

    commands = {"train": _train_command, "analyze": _analyze_command,
                "bench": _bench_command, "classify": classify.command,
                "disk": _disk_command,
                "partition": distributed.partition_command,
                "train-dist": distributed.train_dist_command}
    try:
        return commands[args.command](args)
    except (ValueError, OSError) as err:
        message = str(err).strip().splitlines()[0] if str(err) else repr(err)
        print(f"hmgraph {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hmgraph {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

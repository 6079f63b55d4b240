"""The ``hmgraph`` command line.

``hmgraph train`` trains a node classifier; every mistake in the input is
reported as one line on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

import hmgraph.openmp  # noqa: F401  (OMP_WAIT_POLICY, before torch loads)
from hmgraph import settings
from hmgraph.args import (
    budget_text,
    check_out_folder,
    name_list,
    non_negative_int,
    parse_budget_shares,
    positive_int,
)
from hmgraph.settings import TrainConfig, add_arguments

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
        description="""
        GNN training on graphs whose features outgrow memory.""",
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
    """``hmgraph train``: the model, the run, sampling, cache and storage.

    The flags of `TrainConfig`'s fields, those the table tunes
    (`hmgraph.defaults.TUNED`) defaulting to the table, plus ``--layers``.
    """
    # Lazy: the table of defaults loads the datasets' registry (torch).
    from hmgraph.defaults import TUNED

    train = commands.add_parser(
        "train", help="node classification with neighbour sampling",
        description="""
        Train a GNN node classifier with mini-batch neighbour sampling and
        report OGB-style results.""",
    )
    tuned = "(default: the table for the dataset's family, printed at "\
        "start; see the README)"
    changes = {name: {"default": None, "help": " ".join(
        filter(None, [settings.help_of(TrainConfig, name), tuned]))}
        for name in TUNED}
    changes["out"] = {"default": None}
    for title, concern in settings.TRAIN_CONCERNS.items():
        group = train if title == "run" else train.add_argument_group(title)
        add_arguments(group, TrainConfig, settings.cli_names(concern),
                      changes=changes)
        if title == "model":
            group.add_argument(
                "--layers", type=positive_int, default=None,
                help="number of layers; must match the fanouts (a single "
                "fanout is repeated; the table's fanouts are cut or "
                "extended at the input end)")


def _add_analyze_parser(commands) -> None:
    """``hmgraph analyze``: replay cache policies on a traced epoch."""
    analyze = commands.add_parser(
        "analyze", help="replay cache policies on an epoch's accesses",
        description="""
        Record the access trace of an epoch, replay every cache policy at
        several budgets against Belady's optimum, and write JSON, PNG plots
        and a markdown summary.""",
    )
    add_arguments(analyze, TrainConfig, settings.WORKLOAD)
    analyze.add_argument("--batches", type=non_negative_int, default=0,
                         help="batches to trace (default: one epoch)")
    analyze.add_argument("--budgets", type=parse_budget_shares,
                         default=[0.01, 0.02, 0.05, 0.10, 0.20, 0.40],
                         help="capacities in %% of rows, e.g. 1,5,20")
    add_arguments(analyze, TrainConfig, ["sampler", "clusters", "locality",
                                         "profile_batches", "seed"])
    analyze.add_argument("--out", default="bench/results")
    add_arguments(analyze, TrainConfig, ["verify"])


def _add_disk_parser(commands) -> None:
    """``hmgraph disk``: the disk model of a feature file."""
    disk = commands.add_parser(
        "disk", help="the disk model a feature file is read with",
        description="""
        Print the disk model the storage tier plans and prices reads with
        (logical block size, random 4 KiB reads/s at each queue depth from 1
        to 128 and the depth where they stop growing, sequential bandwidth
        there, break-even gap), measured once on the file and cached beside
        it; --refresh measures again.""",
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
        description="""
        Train the same model with DGL's loader (in memory, and memmap with a
        cold page cache) and with hmgraph's loader under each cache policy,
        reuse and cluster sampling; one table.""",
    )
    add_arguments(bench, TrainConfig, [
        *settings.WORKLOAD, "epochs", "hidden", "lr", "seed", "device_budget",
        "host_budget"], changes={
            "epochs": {"default": 1},
            **{name: dict(change, type=budget_text)
               for name, change in settings.SHARE_BUDGETS.items()}})
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
    from hmgraph.train import train

    # (1) The tuned settings: the flags given, the table for the rest.
    given = {name: getattr(args, name) for name in defaults.TUNED}
    tuned, defaulted = defaults.resolve(args.dataset, args.model, given)
    fanouts = tuned["fanouts"]
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
    tuned["fanouts"] = fanouts
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise CliError(f"--device {args.device}: no CUDA device here; "
                       f"use --device cpu")
    out = args.out or f"runs/{args.dataset}-{args.model}"
    check_out_folder(out)
    config = TrainConfig(**settings.from_args(TrainConfig, args, **tuned,
                                            out=out))
    # (2) Say which defaults this run took, before any loading.
    print(defaults.describe(args.dataset, args.model, tuned, defaulted),
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

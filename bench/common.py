"""The bench scripts' flags; each script is its experiment.

The harness they share is `hmgraph.benchmark` (``hmgraph bench`` runs the
very same code); its public names are read through this module
(``common.dgl_epoch`` is `hmgraph.benchmark.dgl_epoch`). Here: the
workload flags (`add_bench_arguments`, `add_quick_arguments`,
`finish_args`, `settings`); their argparse types are
`hmgraph.args`'.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hmgraph import benchmark
from hmgraph.args import (
    name_list,
    non_negative_int,
    parse_fanouts,
    positive_int,
)

RESULTS = Path(__file__).resolve().parent / "results"


def __getattr__(name: str):
    """The shared harness: `hmgraph.benchmark`'s public names."""
    if name in benchmark.__all__:
        return getattr(benchmark, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_bench_arguments(parser: argparse.ArgumentParser, *,
                        dataset: str | None = None,
                        datasets: str | None = None, training: bool = True,
                        **defaults) -> None:
    """The workload flags every script shares.

    ``--dataset`` (default ``dataset``) or ``--datasets`` (comma-separated,
    default ``datasets``) where given; ``--root``, ``--fanouts``,
    ``--batch-size``; with ``training``, ``--hidden``, ``--seed``,
    ``--amortize-epochs`` and ``--dgl-workers``. ``defaults`` replace the
    project's defaults by destination name (``batch_size=None``: a script
    fills it in).
    """
    add = parser.add_argument
    if dataset is not None:
        add("--dataset", default=dataset)
    if datasets is not None:
        add("--datasets", default=datasets, type=name_list(),
            help=f"comma-separated dataset names (default: {datasets})")
    add("--root", default="data", help="folder holding the datasets")
    add("--fanouts", type=parse_fanouts, default=[15, 10, 5],
        help="neighbours per layer, input layer first (default: 15,10,5)")
    add("--batch-size", type=positive_int, default=1024)
    if not training:
        return parser.set_defaults(**defaults)
    add("--hidden", type=positive_int, default=256)
    add("--seed", type=int, default=0)
    epochs, workers = benchmark.AMORTIZE_EPOCHS, benchmark.DGL_WORKERS
    add("--amortize-epochs", type=positive_int, default=epochs,
        help="epochs construction is amortized over in the extra ratio "
        f"column (default: {epochs})")
    add("--dgl-workers", type=non_negative_int, default=workers,
        help="num_workers of DGL's DataLoader in the DGL baselines "
        f"(default: {workers}, DGL's; see bench/README.md)")
    parser.set_defaults(**defaults)


def add_quick_arguments(parser: argparse.ArgumentParser, full: dict,
                        quick: dict, max_batches: str) -> None:
    """``--dataset``, ``--max-batches`` (help ``max_batches``), ``--out``
    and ``--quick``, left unset for `finish_args` to fill in from
    ``full`` or ``quick``; the harness's flags with no batch size."""
    add_bench_arguments(parser, batch_size=None)
    parser.add_argument("--dataset", help=f"default {full['dataset']}; "
                        f"--quick: {quick['dataset']}")
    parser.add_argument("--max-batches", type=positive_int, help=max_batches
                        + f" (default: all; --quick: {quick['max_batches']})")
    parser.add_argument("--out", help=f"JSON file, the markdown beside it "
                        f"(default {full['out']}; --quick: {quick['out']})")
    parser.add_argument("--quick", action="store_true", help="smoke run: "
                        + ", ".join(f"{k} {v}" for k, v in quick.items()
                                    if k != "out"))


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                defaults: dict, quick: dict) -> argparse.Namespace:
    """Options left unset taken from ``quick`` (with ``--quick``) or
    ``defaults``; an unknown ``--dataset``, a missing ``--root`` or an
    ``--out`` not ending in .json refused."""
    from hmgraph import datasets

    for key, value in (quick if args.quick else defaults).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.dataset not in datasets.known_datasets() or \
            not Path(args.root).is_dir() or not args.out.endswith(".json"):
        parser.error("need a known --dataset, an existing --root and an "
                     "--out ending in .json")
    return args


def settings(args: argparse.Namespace, **more) -> dict:
    """The options (``out`` left out) and ``more``, for a result's
    ``config``."""
    return dict({k: v for k, v in vars(args).items() if k != "out"}, **more)

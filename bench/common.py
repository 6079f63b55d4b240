"""The bench scripts' flags; each script is its experiment.

The harness they share lives in `hmgraph.benchmark` (``hmgraph bench``
runs the very same code) and is re-exported here: the DGL baseline
(`dgl_epoch`), `hmgraph_epoch`, `loader_epoch`, `load`, `isolated`, peak
memory, `environment`, `write_results` naming the commit, `finish`, the
tables (`markdown_table`, `target`, `targets_table`) and METIS parts
(`metis_parts`). Here: the workload flags (`add_bench_arguments`,
`add_quick_arguments`, `finish_args`, `names`, `budget`, `settings`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hmgraph.args import non_negative_int, parse_fanouts, positive_int
from hmgraph.benchmark import (  # noqa: F401 - the shared harness
    AMORTIZE_EPOCHS,
    DGL_WORKERS,
    DROPOUT,
    LR,
    ConfigurationFailed,
    amortized,
    commit,
    dgl_baseline,
    dgl_epoch,
    disk_text,
    environment,
    environment_text,
    finish,
    hmgraph_epoch,
    isolated,
    load,
    loader_epoch,
    markdown_table,
    metis_parts,
    metis_text,
    new_model,
    open_memmap,
    peak_rss_bytes,
    progress,
    seeded_subset,
    target,
    targets_table,
    watch_memory,
    write_results,
)

RESULTS = Path(__file__).resolve().parent / "results"


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
        add("--datasets", default=datasets, type=names(),
            help=f"comma-separated dataset names (default: {datasets})")
    add("--root", default="data", help="folder holding the datasets")
    add("--fanouts", type=parse_fanouts, default=[15, 10, 5],
        help="neighbours per layer, input layer first (default: 15,10,5)")
    add("--batch-size", type=positive_int, default=1024)
    if not training:
        return parser.set_defaults(**defaults)
    add("--hidden", type=positive_int, default=256)
    add("--seed", type=int, default=0)
    add("--amortize-epochs", type=positive_int, default=AMORTIZE_EPOCHS,
        help="epochs construction is amortized over in the extra ratio "
        f"column (default: {AMORTIZE_EPOCHS})")
    add("--dgl-workers", type=non_negative_int, default=DGL_WORKERS,
        help="num_workers of DGL's DataLoader in the DGL baselines "
        f"(default: {DGL_WORKERS}, DGL's; see bench/README.md)")
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


def names(choices=None, check=None):
    """An argparse type: a comma-separated list of distinct names, each
    one of ``choices`` where given and passed through ``check``."""
    def parse(text: str) -> list[str]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        wrong = set(items) - set(choices or items)
        if not items or wrong or len(set(items)) < len(items):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give distinct names, comma-separated"
                + (f", of {', '.join(choices)}" if choices else ""))
        return [check(item) for item in items] if check else items
    return parse


def budget(text: str) -> str:
    """An argparse type: a budget (``5%`` of the feature bytes, or bytes
    with a unit), checked and kept as text."""
    from hmgraph.cache.budget import parse_budget

    try:
        parse_budget(text, 1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def settings(args: argparse.Namespace, **more) -> dict:
    """The options (``out`` left out) and ``more``, for a result's
    ``config``."""
    return dict({k: v for k, v in vars(args).items() if k != "out"}, **more)




"""The one harness of the bench scripts; each script is its experiment.

From `hmgraph.benchmark`, so that ``hmgraph bench`` runs the very same
code: `dgl_epoch` (the DGL baseline, in memory or over an ``np.memmap``
whose pages are dropped once before the epoch), `hmgraph_epoch`,
`new_model` and `train_step`, `open_memmap` and `drop_page_cache`,
`isolated` (one configuration per fresh process), `peak_rss_bytes`
(sampled with psutil), `read_bytes`, `commit`, `write_results` (JSON and
markdown, atomic, naming the commit), `markdown_table`, `amortized` and
`progress`.

Here: `add_bench_arguments` (the workload flags), `names`,
`environment`, and the targets table (`target`, `targets_table`).
(``import hmgraph`` sets ``OMP_WAIT_POLICY=PASSIVE`` before torch is
imported.)

Counters (bytes, requests, rows) are exact; times are ratios within one
invocation.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    dgl_epoch,
    drop_page_cache,
    hmgraph_epoch,
    isolated,
    markdown_table,
    new_model,
    open_memmap,
    peak_rss_bytes,
    progress,
    read_bytes,
    train_step,
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


def names(choices=None):
    """An argparse type: a comma-separated list of distinct names, each
    one of ``choices`` where given."""
    def parse(text: str) -> list[str]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        wrong = set(items) - set(choices or items)
        if not items or wrong or len(set(items)) < len(items):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give distinct names, comma-separated"
                + (f", of {', '.join(choices)}" if choices else ""))
        return items
    return parse


def environment() -> dict:
    """Versions, CPUs, threads and the machine's load right now."""
    import dgl
    import numpy
    import torch

    import hmgraph

    return {"hmgraph": hmgraph.__version__, "torch": torch.__version__,
            "dgl": dgl.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg": os.getloadavg()}


def target(number, what: str, value, op: str, limit: float,
           note: str | None = None) -> dict:
    """One target: ``value op limit`` judged PASS or MISS (``not run``
    where ``value`` is None)."""
    if value is None:
        verdict = "not run"
    else:
        verdict = "PASS" if (value <= limit if op == "<=" else
                             value >= limit) else "MISS"
    return {"target": number, "what": what, "value": value, "op": op,
            "limit": limit, "verdict": verdict, "note": note}


def targets_table(rows: list[dict]) -> str:
    """``| # | target | value | limit | verdict |``, notes in brackets."""
    return markdown_table(
        ["#", "target", "value", "limit", "verdict"],
        [[t["target"], t["what"] + (f" ({t['note']})" if t["note"] else ""),
          t["value"], f"{t['op']} {t['limit']:g}", f"**{t['verdict']}**"]
         for t in rows])

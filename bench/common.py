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


# -- cluster and reuse --
# METIS parts for bench/cluster.py and bench/reuse.py (one part per batch
# of the train split), through `metis_clusters` and its keyed cache.

METIS_TIMEOUT_SECONDS = 1800


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


def metis_parts(dataset, root, num_parts: int,
                timeout: float = METIS_TIMEOUT_SECONDS) -> tuple:
    """METIS parts of ``dataset``'s graph, cached next to its feature file
    as ``metis-<num_parts>.npy``.

    Read from `metis_clusters`' cache where its key (graph and run) is
    this one; else `metis_clusters` runs in a child process (`isolated`:
    METIS's memory, several GB on synth-products, is never this
    process's, and a run past ``timeout`` seconds is killed).

    Returns
    -------
    (torch.Tensor or None, dict)
        The part of every node (None where METIS failed) and its record:
        ``path``, ``num_parts``, ``key``, ``status`` (``cached``,
        ``computed`` or ``failed``), ``seconds`` (wall time, the child's
        loading included), ``metis_seconds`` and ``child_peak_rss_mb``
        when computed, ``error`` when failed; with parts,
        ``nodes_per_part`` and ``train_seeds_per_part`` (min, mean, max),
        ``parts_with_train_seeds`` and ``edges_inside_share``.
    """
    import sys
    import time

    import torch

    from hmgraph.samplers.cluster import cached_clusters, metis_key

    graph = dataset.graph
    path = Path(dataset.feature_path).parent / f"metis-{num_parts}.npy"
    key = metis_key(graph, num_parts)
    info = {"path": str(path), "num_parts": num_parts, "key": key,
            "status": "cached", "timeout_seconds": timeout}
    began = time.perf_counter()
    parts = cached_clusters(path, key)
    if parts is None:
        print(f"METIS: {num_parts} parts of {graph.num_nodes():,} nodes in a"
              f" child process (timeout {timeout:.0f} s)", file=sys.stderr)
        try:
            info.update(isolated(_metis_child, dataset.name, str(root),
                                 num_parts, timeout=timeout),
                        status="computed")
            parts = cached_clusters(path, key)
        except ConfigurationFailed as err:
            info.update(status="failed", error=str(err))
    info["seconds"] = time.perf_counter() - began
    if parts is None:
        info.setdefault("error", "the child's assignment is not this graph's")
        info["status"] = "failed"
        return None, info
    train = torch.bincount(parts[dataset.split["train"]],
                           minlength=num_parts).double()
    nodes = torch.bincount(parts, minlength=num_parts).double()
    src, dst = graph.edges()
    return parts, dict(
        info, edges_inside_share=float((parts[src] == parts[dst]).double()
                                       .mean()),
        parts_with_train_seeds=int((train > 0).sum()),
        **{name: {"min": int(c.min()), "mean": float(c.mean()),
                  "max": int(c.max())}
           for name, c in (("nodes_per_part", nodes),
                           ("train_seeds_per_part", train))})


def _metis_child(name: str, root: str, num_parts: int) -> dict:
    """`metis_parts`' child: load the dataset, run `metis_clusters`."""
    import time

    from hmgraph import datasets
    from hmgraph.samplers.cluster import metis_clusters

    dataset = datasets.load(name, root, verify=False)
    began = time.perf_counter()
    metis_clusters(dataset.graph, num_parts, Path(dataset.feature_path)
                   .parent / f"metis-{num_parts}.npy")
    return {"metis_seconds": time.perf_counter() - began,
            "child_peak_rss_mb": peak_rss_bytes() / 2**20}


def metis_text(info: dict) -> str:
    """One markdown sentence on `metis_parts`' record."""
    text = (f"METIS ({info['num_parts']} parts, one per batch, "
            f"`{info['path']}`): **{info['status']}** in "
            f"{info['seconds']:.1f} s")
    if "metis_seconds" in info:
        text += (f" (METIS {info['metis_seconds']:.1f} s, the child's peak "
                 f"RSS {info['child_peak_rss_mb']:,.0f} MB)")
    if "error" in info:
        return f"{text}: {info['error']}."
    seeds = info["train_seeds_per_part"]
    return (f"{text}; {100 * info['edges_inside_share']:.1f} % of edges "
            f"inside a part, {seeds['min']}-{seeds['max']} train seeds per "
            f"part ({info['parts_with_train_seeds']} parts hold any).")

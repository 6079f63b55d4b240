"""Partition methods side by side: edge cut, replication, remote traffic.

One dataset (default synth-products), one number of parts (default 4), one
invocation. For every method of `hmgraph.partition.METHODS` (DGL's
``random`` and ``metis``, hmgraph's ``self-dependence`` and ``hierarchy``)
it computes the assignment with `hmgraph.partition.assign` (timed) and
replays one training epoch of every part's trainer with
`hmgraph.partition.partition_stats`: DGL's ``NeighborSampler`` (default
fanouts 15,10,5), batch 1024 per part, each part training on the training
vertices it owns. Counted per method (exact counters, not timings):

* **edge cut**: share of edges whose ends have different owners;
* **replication factor**: feature rows stored over all parts per vertex
  (1.0 for DGL's methods; hmgraph's replicate up to ``--replication`` of
  each part's vertices, default 0.5);
* **remote feature bytes per epoch**: input rows a part's batches read
  that it neither owns nor replicates (they cross the network), and
  **remote sampling requests**: block destination vertices owned by
  another part (DGL sends their sampling to that part's server);
* per part: vertices owned and replicated, training vertices, the hit rate
  of a static fast tier of the machine's budget (device 5 % + host 20 % of
  the feature bytes by default), and **hot fill** (the job's hot bytes the
  part owns over its machine's budget).

A second table repeats ``self-dependence`` and ``hierarchy`` on machines
of unequal budgets (``--unequal-budgets``, default 40%,20%,20%,20%), where
hierarchy's balancing of hot bytes against budgets shows.

The replicas and hierarchy's hot set are ranked by each part's expected
reads (`hmgraph.samplers.presample.expected_reads`, the closed form of
one epoch's sampling); the fast tiers are filled from one epoch of
presampling with seed 0, as the cache's profile is; the measured epoch
uses seed 1.

Target: ``self-dependence`` moves at most 0.5x METIS's remote feature
bytes at a replication factor of at most 1.5.

Output: ``--out`` (default ``bench/results/partition.json``) and a
markdown report with the same stem, rewritten atomically after each
method; the report is printed at the end.

Examples
--------
From the repository root::

    python bench/partition.py                        # synth-products
    python bench/partition.py --dataset synth-tiny --root /tmp/hmg \\
        --out /tmp/partition.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dgl  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from hmgraph import datasets  # noqa: E402
from hmgraph.cache.budget import parse_budget  # noqa: E402
from hmgraph.cache.format import atomic_path, read_manifest  # noqa: E402
from hmgraph.partition import METHODS, assign, partition_stats  # noqa: E402
from hmgraph.samplers.cluster import metis_clusters  # noqa: E402
from hmgraph.samplers.presample import (  # noqa: E402
    epoch_counts,
    expected_reads,
)

REMOTE_RATIO_MAX = 0.5
REPLICATION_MAX = 1.5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synth-products")
    parser.add_argument("--root", default="data")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--clusters-per-part", type=int, default=16)
    parser.add_argument("--replication", type=float, default=0.5)
    parser.add_argument("--device-budget", default="5%")
    parser.add_argument("--host-budget", default="20%")
    parser.add_argument("--unequal-budgets", default="40%,20%,20%,20%",
                        help="fast-tier budget per machine for the second "
                        "table; empty to skip it")
    parser.add_argument("--out", default="bench/results/partition.json")
    args = parser.parse_args(argv)
    try:
        args.fanouts = [int(f) for f in args.fanouts.split(",")]
    except ValueError:
        parser.error(f"--fanouts {args.fanouts!r}: use integers like 15,10,5")
    if args.parts < 2:
        parser.error(f"--parts {args.parts}: needs at least 2")
    return args


def _write(result: dict, out: Path) -> None:
    with atomic_path(out) as tmp:
        Path(tmp).write_text(json.dumps(result, indent=2))
    with atomic_path(out.with_suffix(".md")) as tmp:
        Path(tmp).write_text(markdown(result))


def run_method(dataset, method, args, budgets, row_bytes, clusters,
               label) -> dict:
    graph = dataset.graph
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    train_ids = dataset.split["train"]

    def profile(seeds):
        return epoch_counts(graph, sampler, seeds, args.batch_size, seed=0)

    began = time.perf_counter()
    assignment = assign(
        graph, args.parts, method, train_ids=train_ids,
        profile=lambda seeds: expected_reads(graph, seeds, args.fanouts),
        clusters=clusters, replication=args.replication, budgets=budgets,
        row_bytes=row_bytes, seed=0)
    assign_seconds = time.perf_counter() - began

    def bar(iterable, desc=None):
        return tqdm(iterable, desc=f"{label} {desc}", leave=False,
                    mininterval=5.0, file=sys.stderr)

    began = time.perf_counter()
    stats = partition_stats(graph, assignment, sampler, train_ids,
                            args.batch_size, row_bytes, budgets=budgets,
                            profile=profile, seed=1, progress=bar)
    return {"method": method, "budgets": budgets, **stats,
            "settings": assignment.info,
            "assign_seconds": assign_seconds,
            "stats_seconds": time.perf_counter() - began}


def targets(records: list[dict]) -> list[str]:
    by = {r["method"]: r for r in records}
    if "metis" not in by or "self-dependence" not in by:
        return ["- self-dependence vs METIS: not run"]
    own, metis = by["self-dependence"], by["metis"]
    ratio = own["remote_bytes"] / max(1, metis["remote_bytes"])
    ok = ratio <= REMOTE_RATIO_MAX and \
        own["replication_factor"] <= REPLICATION_MAX
    return [
        f"- self-dependence remote feature bytes / METIS's: {ratio:.3f} "
        f"(target <= {REMOTE_RATIO_MAX}) at replication factor "
        f"{own['replication_factor']:.3f} (target <= {REPLICATION_MAX}): "
        f"**{'PASS' if ok else 'MISS'}**"
    ]


def _table(records: list[dict]) -> list[str]:
    lines = [
        "| method | edge cut | replication factor | remote GB / epoch | "
        "remote rows % | remote sampling requests | remote sampling % | "
        "assign s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['method']} | {r['edge_cut']:.3f} | "
            f"{r['replication_factor']:.3f} | "
            f"{r['remote_bytes'] / 1e9:.2f} | "
            f"{100 * r['remote_rows'] / max(1, r['rows_read']):.1f} | "
            f"{r['remote_sampling_requests']:,} | "
            f"{100 * r['remote_sampling_requests'] / max(1, r['sampling_requests']):.1f} | "  # noqa: E501
            f"{r['assign_seconds']:.0f} |")
    return lines


def _parts_table(records: list[dict]) -> list[str]:
    lines = [
        "| method | part | budget MB | owned | replicated | train | "
        "remote GB | fast-tier hit % | hot fill |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        for p in r["parts"]:
            lines.append(
                f"| {r['method']} | {p['part']} | "
                f"{r['budgets'][p['part']] / 1e6:.0f} | {p['owned']:,} | "
                f"{p['replicated']:,} | {p['train']:,} | "
                f"{p['remote_bytes'] / 1e9:.2f} | "
                f"{100 * p['fast_hit_rate']:.1f} | {p['hot_fill']:.2f} |")
    return lines


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Partition methods",
        "",
        f"{result['dataset']} ({env['nodes']:,} nodes, {env['edges']:,} "
        f"edges, {env['train']:,} training vertices), {result['parts']} "
        f"parts, NeighborSampler({','.join(map(str, result['fanouts']))}),"
        f" batch {result['batch_size']} per part, one epoch per method; "
        f"feature rows of {env['row_bytes']} bytes; replication budget "
        f"{result['replication']} of each part's vertices; "
        f"{result['clusters']} METIS clusters for hmgraph's methods; "
        f"dgl {dgl.__version__}, torch {torch.__version__}.",
        "",
        "## Equal machines",
        "",
        *_table(result["equal"]),
        "",
        *_parts_table(result["equal"]),
        "",
    ]
    if result.get("unequal"):
        lines += [
            "## Unequal machines",
            "",
            f"Fast-tier budgets {result['unequal_budgets']} of the feature "
            "bytes.",
            "",
            *_table(result["unequal"]),
            "",
            *_parts_table(result["unequal"]),
            "",
        ]
    lines += [
        "Remote bytes and requests are counted on the whole graph with the "
        "sampler of training: DGL's distributed sampling returns the same "
        "neighbourhoods, served by several servers. Fast-tier hit %: a "
        "static cache of the machine's budget with the part's most-read "
        "rows (profile seed 0, epoch seed 1). Hot fill: the job's hot bytes "
        "(most-read rows that all fast tiers together hold) the part owns, "
        "over its budget.",
        "",
        "## Targets",
        "",
        *targets(result["equal"]),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dataset = datasets.load(args.dataset, args.root)
    graph = dataset.graph
    row_bytes = read_manifest(dataset.feature_path).row_bytes
    feature_bytes = row_bytes * graph.num_nodes()
    each = parse_budget(args.device_budget, feature_bytes) + \
        parse_budget(args.host_budget, feature_bytes)
    equal = [each] * args.parts
    count = args.parts * args.clusters_per_part
    began = time.perf_counter()
    clusters = metis_clusters(
        graph, count, Path(dataset.feature_path).parent / f"metis-{count}.npy")
    result = {
        "dataset": args.dataset, "parts": args.parts,
        "fanouts": args.fanouts, "batch_size": args.batch_size,
        "replication": args.replication, "clusters": count,
        "cluster_seconds": time.perf_counter() - began,
        "environment": {
            "nodes": graph.num_nodes(), "edges": graph.num_edges(),
            "train": int(dataset.split["train"].numel()),
            "row_bytes": row_bytes, "python": platform.python_version(),
            "torch": torch.__version__, "dgl": dgl.__version__,
            "cpus": os.cpu_count(),
        },
        "equal": [], "unequal": [],
    }
    for method in METHODS:
        result["equal"].append(run_method(
            dataset, method, args, equal, row_bytes, clusters, method))
        _write(result, out)
        print(f"{method}: done", file=sys.stderr)
    if args.unequal_budgets:
        shares = args.unequal_budgets.split(",")
        if len(shares) != args.parts:
            raise SystemExit(f"--unequal-budgets lists {len(shares)} "
                             f"machines for --parts {args.parts}")
        budgets = [parse_budget(s, feature_bytes) for s in shares]
        result["unequal_budgets"] = args.unequal_budgets
        for method in ("self-dependence", "hierarchy"):
            result["unequal"].append(run_method(
                dataset, method, args, budgets, row_bytes, clusters,
                f"{method} (unequal)"))
            _write(result, out)
    print(markdown(result))
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Partition methods side by side: edge cut, replication, remote traffic.

Per method of `hmgraph.partition.METHODS`, the assignment and one replayed
epoch (`hmgraph.partition.partition_stats`), on equal and unequal
machines. Targets and options: bench/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import common

from hmgraph.args import budget_text

REMOTE_RATIO_MAX = 0.5
REPLICATION_MAX = 1.5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_bench_arguments(parser, dataset="synth-products",
                               training=False)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--clusters-per-part", type=int, default=16)
    parser.add_argument("--replication", type=float, default=0.5)
    parser.add_argument("--device-budget", default="5%", type=budget_text)
    parser.add_argument("--host-budget", default="20%", type=budget_text)
    parser.add_argument("--unequal-budgets", default="40%,20%,20%,20%",
                        help="fast-tier budget per machine for the second "
                        "table; empty to skip it")
    parser.add_argument("--out", default="bench/results/partition.json")
    args = parser.parse_args(argv)
    if args.parts < 2:
        parser.error(f"--parts {args.parts}: needs at least 2")
    shares = [s for s in args.unequal_budgets.split(",") if s]
    if shares and len(shares) != args.parts:
        parser.error(f"--unequal-budgets lists {len(shares)} machines for "
                     f"--parts {args.parts}")
    return args


def run_method(dataset, method, args, budgets, row_bytes, clusters,
               label) -> dict:
    from tqdm.auto import tqdm

    from hmgraph.partition import assign_and_count

    assignment, stats, seconds = assign_and_count(
        dataset.graph, args.parts, method, train_ids=dataset.split["train"],
        fanouts=args.fanouts, batch_size=args.batch_size,
        row_bytes=row_bytes, budgets=budgets, clusters=clusters,
        replication=args.replication, seed=0,
        progress=lambda iterable, desc: tqdm(
            iterable, desc=f"{label} {desc}", leave=False, mininterval=5.0))
    return {"method": method, "budgets": budgets, **stats,
            "settings": assignment.info, **seconds}


def targets(records: list[dict]) -> list[dict]:
    by = {r["method"]: r for r in records}
    own, metis = by.get("self-dependence"), by.get("metis")
    ratio = own and metis and own["remote_bytes"] / max(
        1, metis["remote_bytes"])
    return [common.target(1, "self-dependence remote feature bytes / "
                          "METIS's", ratio, "<=", REMOTE_RATIO_MAX),
            common.target(2, "self-dependence replication factor",
                          own and own["replication_factor"], "<=",
                          REPLICATION_MAX)]


def _tables(records: list[dict]) -> list[str]:
    methods = [[r["method"], r["edge_cut"], r["replication_factor"],
                r["remote_bytes"] / 1e9,
                100 * r["remote_rows"] / max(1, r["rows_read"]),
                r["remote_sampling_requests"],
                100 * r["remote_sampling_requests"]
                / max(1, r["sampling_requests"]), r["assign_seconds"]]
               for r in records]
    parts = [[r["method"], p["part"], r["budgets"][p["part"]] / 1e6,
              p["owned"], p["replicated"], p["train"],
              p["remote_bytes"] / 1e9, 100 * p["fast_hit_rate"],
              p["hot_fill"]] for r in records for p in r["parts"]]
    return [common.markdown_table(
        ["method", "edge cut", "replication factor", "remote GB / epoch",
         "remote rows %", "remote sampling requests", "remote sampling %",
         "assign s"], methods), "", common.markdown_table(
        ["method", "part", "budget MB", "owned", "replicated", "train",
         "remote GB", "fast-tier hit %", "hot fill"], parts), ""]


def markdown(result: dict) -> str:
    env, c = result["environment"], result
    lines = [
        "# Partition methods", "",
        f"{c['dataset']} ({env['nodes']:,} nodes, {env['edges']:,} edges, "
        f"{env['train']:,} training vertices), {c['parts']} parts, "
        f"NeighborSampler({','.join(map(str, c['fanouts']))}), batch "
        f"{c['batch_size']} per part, one epoch per method; feature rows of "
        f"{env['row_bytes']} bytes; replication budget {c['replication']} "
        f"of each part's vertices; {c['clusters']} METIS clusters for "
        f"hmgraph's methods; dgl {env['dgl']}, torch {env['torch']}.", "",
        "## Equal machines", "", *_tables(result["equal"])]
    if result["unequal"]:
        lines += ["## Unequal machines", "",
                  f"Fast-tier budgets {result['unequal_budgets']} of the "
                  "feature bytes.", "", *_tables(result["unequal"])]
    lines += [
        "Remote bytes and requests: on the whole graph with the sampler of "
        "training. Fast-tier hit %: a static cache of the machine's budget "
        "(profile seed 0, epoch seed 1). Hot fill: the job's hot bytes the "
        "part owns, over its budget.", "", "## Targets", "",
        common.targets_table(targets(result["equal"])), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from hmgraph import datasets
    from hmgraph.cache.budget import parse_budget
    from hmgraph.partition import METHODS
    from hmgraph.samplers.cluster import metis_clusters

    args = parse_args(argv)
    dataset = datasets.load(args.dataset, args.root)
    graph = dataset.graph
    row_bytes = dataset.manifest.row_bytes
    feature_bytes = dataset.feature_bytes
    each = parse_budget(args.device_budget, feature_bytes) + \
        parse_budget(args.host_budget, feature_bytes)
    count = args.parts * args.clusters_per_part
    began = time.perf_counter()
    clusters = metis_clusters(
        graph, count, Path(dataset.feature_path).parent / f"metis-{count}.npy")
    result = {
        "commit": common.commit(), "dataset": args.dataset,
        "parts": args.parts, "fanouts": args.fanouts,
        "batch_size": args.batch_size, "replication": args.replication,
        "clusters": count, "cluster_seconds": time.perf_counter() - began,
        "environment": dict(
            common.environment(), nodes=graph.num_nodes(),
            edges=graph.num_edges(), row_bytes=row_bytes,
            train=int(dataset.split["train"].numel())),
        "equal": [], "unequal": [], "unequal_budgets": args.unequal_budgets,
    }
    runs = [("equal", m, [each] * args.parts, m) for m in METHODS]
    if args.unequal_budgets:
        budgets = [parse_budget(s, feature_bytes)
                   for s in args.unequal_budgets.split(",")]
        runs += [("unequal", m, budgets, f"{m} (unequal)")
                 for m in ("self-dependence", "hierarchy")]
    for table, method, budgets, label in runs:
        result[table].append(run_method(dataset, method, args, budgets,
                                        row_bytes, clusters, label))
        result["targets"] = targets(result["equal"])
        common.write_results(result, markdown(result), args.out)
        print(f"{label}: done", file=sys.stderr)
    return common.finish(result, markdown(result), args.out)


if __name__ == "__main__":
    sys.exit(main())

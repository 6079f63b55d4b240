"""Baseline: DGL's own mini-batch loop with features in memory.

Per dataset, ``--epochs`` epochs of `common.dgl_baseline`, seconds split
into sample, fetch and train (bench/README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import common
import psutil

COLUMNS = ["dataset", "nodes", "edges", "batches", "epoch s", "sample s",
           "fetch s", "train s", "sample %", "fetch %", "train %",
           "input nodes/batch", "peak RSS MB"]


def parse_args(argv=None) -> argparse.Namespace:
    from hmgraph import datasets
    from hmgraph.models import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_bench_arguments(parser,
                               datasets="synth-small,synth-products")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--model", default="sage", choices=sorted(MODELS))
    parser.add_argument("--out", default="bench/results/baseline.json")
    args = parser.parse_args(argv)
    unknown = set(args.datasets) - set(datasets.known_datasets())
    if unknown or not args.datasets or args.epochs < 1 or \
            not Path(args.root).is_dir() or not args.out.endswith(".json"):
        parser.error(f"need known --datasets (unknown: {sorted(unknown)}), "
                     f"--epochs >= 1, an existing --root and an --out "
                     f"ending in .json")
    return args


def bench_dataset(name: str, args) -> dict:
    """Load one dataset, build its formats, train; its JSON record."""
    data, facts = common.load(name, args.root)
    rss_before = psutil.Process().memory_info().rss / 2**20
    epochs = common.dgl_baseline(data, args, epochs=args.epochs,
                                 desc=f"{name} epoch {{epoch}}")
    seconds = {k: sum(e["seconds"][k] for e in epochs) / len(epochs)
               for k in ("epoch", "sample", "fetch", "train")}
    rows = sum(e["input_rows"] for e in epochs)
    batches = sum(e["batches"] for e in epochs)
    return {
        "dataset": name, **facts,
        "feat_dtype": str(data.features.dtype).removeprefix("torch."),
        "num_classes": data.num_classes,
        "train_nodes": int(data.split["train"].numel()),
        "batches": epochs[0]["batches"], "seconds": seconds,
        "share_percent": {k: 100 * seconds[k] / seconds["epoch"]
                          for k in ("sample", "fetch", "train")},
        "input_nodes_per_batch": rows / max(batches, 1),
        "input_rows_total": rows,
        "bytes_fetched_total": sum(e["input_bytes"] for e in epochs),
        "rss_mb_before_training": rss_before,
        "peak_rss_mb": common.peak_rss_bytes() / 2**20, "epochs": epochs,
        "config": dict(common.settings(args), dropout=common.DROPOUT,
                       lr=common.LR, num_workers=args.dgl_workers),
    }


def report(result: dict) -> str:
    records, env = result["records"], result["environment"]
    c = records[0]["config"]
    rows = [[r["dataset"], r["nodes"], r["edges"], r["batches"],
             *(r["seconds"][k] for k in ("epoch", "sample", "fetch",
                                         "train")),
             *(r["share_percent"][k] for k in ("sample", "fetch", "train")),
             round(r["input_nodes_per_batch"]), round(r["peak_rss_mb"])]
            for r in records]
    return (f"# Baseline\n\nDGL DataLoader (num_workers={c['num_workers']}) "
            f"+ NeighborSampler({','.join(map(str, c['fanouts']))}), batch "
            f"{c['batch_size']}, {c['model']} hidden {c['hidden']}, "
            f"{c['epochs']} epoch(s), features in memory; torch "
            f"{env['torch']}, dgl {env['dgl']}, {env['torch_num_threads']} "
            f"threads. Seconds per epoch; shares of epoch wall time.\n\n"
            f"{common.markdown_table(COLUMNS, rows)}\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    common.watch_memory()
    result = {"commit": common.commit(),
              "environment": common.environment(), "records": []}
    for name in args.datasets:
        try:
            result["records"].append(bench_dataset(name, args))
        except ValueError as err:  # hmgraph's DatasetError and the like
            print(f"baseline: error: {name}: {err}", file=sys.stderr)
            return 2
        common.write_results(result, report(result), args.out)
    return common.finish(result, report(result), args.out)


if __name__ == "__main__":
    sys.exit(main())

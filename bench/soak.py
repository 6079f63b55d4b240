"""Soak run: many epochs of the whole fetch path, every row checked.

The loader ``hmgraph train`` builds (features on disk behind the
``hmgraph`` cache, two-level batch reuse, the cluster sampler, nodes
renumbered by cluster, prefetch 2), iterated for ``--epochs`` epochs
without training; each batch's rows are compared with the feature file's
(``np.memmap``). Prints, per epoch, the mismatches, seconds and the
process's RSS; the run passes with 0 mismatches and an RSS that stays flat
after epoch 2 (within ``--rss-slack-mb``). Not part of CI: about 10-20 s
per epoch on synth-small on 2 cores.

    .venv/bin/python bench/soak.py --dataset synth-small --epochs 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import psutil
import torch
from tqdm.auto import tqdm


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synth-small")
    parser.add_argument("--root", default="data")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rss-slack-mb", type=float, default=64.0)
    parser.add_argument("--out", default=None,
                        help="also write the per-epoch records as JSON")
    args = parser.parse_args(argv)

    from hmgraph import datasets
    from hmgraph.cache.format import open_feature_file
    from hmgraph.train import TrainConfig, _prepare, make_loader

    config = TrainConfig(
        dataset=args.dataset, root=args.root, features_on="disk",
        cache="hmgraph", device_budget="5%", host_budget="20%",
        reuse="two-level", sampler="cluster", renumber=True, prefetch=2,
        batch_size=args.batch_size, progress=False)
    dataset = datasets.load(config.dataset, config.root, config.verify,
                            features_on="disk")
    dataset, sampler, _, profile = _prepare(config, dataset)
    loader, _ = make_loader(config, dataset, sampler, torch.device("cpu"),
                            profile)
    _, rows = open_feature_file(dataset.feature_path)
    process = psutil.Process()
    records = []
    try:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            start, mismatches, batches = time.perf_counter(), 0, 0
            for batch in tqdm(loader, desc=f"epoch {epoch}", leave=False):
                want = torch.from_numpy(np.asarray(
                    rows[batch.input_nodes.numpy()]))
                mismatches += int((batch.x != want).any(dim=1).sum())
                batches += 1
            records.append({
                "epoch": epoch, "batches": batches,
                "mismatched_rows": mismatches,
                "seconds": round(time.perf_counter() - start, 2),
                "rss_mb": round(process.memory_info().rss / 2**20, 1)})
            print(" ".join(f"{k} {v}" for k, v in records[-1].items()),
                  flush=True)
    finally:
        loader.close()
    settled = [r["rss_mb"] for r in records[2:]]
    growth = max(settled) - min(settled) if settled else 0.0
    bad = sum(r["mismatched_rows"] for r in records)
    verdict = "PASS" if bad == 0 and growth <= args.rss_slack_mb else "FAIL"
    print(f"{verdict}: {bad} mismatched rows in {len(records)} epochs; RSS "
          f"after epoch 2 varied by {growth:.1f} MB "
          f"(limit {args.rss_slack_mb:g})")
    if args.out:
        from hmgraph.cache.format import atomic_path

        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps({"records": records, "verdict": verdict,
                                       "rss_growth_mb": growth}, indent=1))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

"""Soak run: many epochs of the whole fetch path, every row checked.

The loader ``hmgraph train`` builds, iterated without training for
``--epochs`` epochs; it passes with no row mismatched and flat memory
(bench/README.md). ``.venv/bin/python bench/soak.py --epochs 50``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import common
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
    parser.add_argument("--out", default="bench/results/soak.json",
                        help="JSON of the per-epoch records, with a .md "
                             "beside it (default: %(default)s)")
    args = parser.parse_args(argv)

    from hmgraph import datasets
    from hmgraph.cache.format import open_feature_file
    from hmgraph.train import TrainConfig, make_loader, make_sampler

    config = TrainConfig(
        dataset=args.dataset, root=args.root, features_on="disk",
        cache="hmgraph", device_budget="5%", host_budget="20%",
        reuse="two-level", sampler="cluster", renumber=True, prefetch=2,
        batch_size=args.batch_size, progress=False)
    dataset = datasets.load(config.dataset, config.root, config.verify,
                            features_on="disk")
    dataset, sampler = make_sampler(config, dataset)
    loader, _ = make_loader(config, dataset, sampler, torch.device("cpu"))
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
            del batch, want  # what the loader holds, not the last batch
            memory = process.memory_info()
            records.append({
                "epoch": epoch, "batches": batches,
                "mismatched_rows": mismatches,
                "seconds": round(time.perf_counter() - start, 2),
                "rss_mb": round(memory.rss / 2**20, 1),
                "anon_mb": round((memory.rss - memory.shared) / 2**20, 1),
                **held()})
            print(" ".join(f"{k} {v}" for k, v in records[-1].items()),
                  flush=True)
    finally:
        loader.close()
    rss, kept, objects = ([r[k] for r in records[2:]]
                          for k in ("rss_mb", "held_mb", "objects"))
    growth, held_growth, objects = drift(rss), drift(kept), spread(objects)
    bad = sum(r["mismatched_rows"] for r in records)
    flat = held_growth <= 1.0 and objects <= 1000 and \
        growth <= args.rss_slack_mb
    verdict = "PASS" if bad == 0 and flat else "FAIL"
    summary = (
        f"{verdict}: {bad} mismatched rows in {len(records)} epochs; after "
        f"epoch 2: held bytes trend {held_growth:+.1f} MB (limit 1; range "
        f"{spread(kept):.1f} MB, the reuse buffers' rows vary), objects "
        f"varied by {objects} (limit 1000), RSS trend {growth:+.1f} MB "
        f"(limit {args.rss_slack_mb:g}; range {spread(rss):.1f} MB)")
    shown = {r["epoch"]: r for r in records[::max(1, len(records) // 10)]
             + records[-1:]}  # about ten epochs and the last, once each
    markdown = (
        f"# Soak: {args.dataset}, {len(records)} epochs\n\n"
        f"hmgraph cache, features on disk, two-level reuse, cluster "
        f"sampler, renumbered, prefetch 2, batch {args.batch_size}; every "
        f"row checked against the file (see bench/soak.py).\n\n"
        + common.markdown_table(list(records[0]),
                                [list(r.values()) for r in shown.values()])
        + f"\n\n{summary}\n")
    common.finish({"args": vars(args), "records": records,
                   "verdict": verdict, "rss_trend_mb": growth,
                   "held_trend_mb": held_growth}, markdown, args.out)
    return 0 if verdict == "PASS" else 1


def held() -> dict:
    """MB of live tensors and arrays (by storage) and Python objects."""
    gc.collect()
    storages, objects = {}, gc.get_objects()
    for obj in objects:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, np.ndarray) and obj.base is None:
            storages[id(obj)] = obj.nbytes
    return {"held_mb": round(sum(storages.values()) / 2**20, 1),
            "objects": len(objects)}


def drift(values: list) -> float:
    """Least-squares slope of ``values`` times their steps (0.0 for fewer
    than 2): the change the trend makes over the run."""
    if len(values) < 2:
        return 0.0
    slope = np.polyfit(np.arange(len(values)), values, 1)[0]
    return float(slope) * (len(values) - 1)


def spread(values: list) -> float:
    """Largest minus smallest (0 when empty)."""
    return max(values) - min(values) if values else 0


if __name__ == "__main__":
    sys.exit(main())

"""``hmgraph bench``: every configuration side by side, one table.

Each configuration trains the same model for the same epochs in its own
process (so its peak resident memory is its own) and reports epoch seconds
and their ratio to DGL's in-memory loader, seconds per stage, hit rates per
tier, storage and host-to-device bytes, peak memory and test accuracy.

Configurations: DGL's ``DataLoader`` with features in memory; DGL's loader
reading the feature file through ``numpy.memmap`` with the page cache
dropped before every batch (``posix_fadvise`` DONTNEED: a cold page cache);
then hmgraph with features on disk and each cache policy, ``hmgraph`` with
two-level reuse, and that with cluster sampling and renumbering.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

__all__ = ["CONFIGS", "ConfigurationFailed", "run", "run_one"]


class ConfigurationFailed(Exception):
    """One configuration's process failed; carries its stderr."""

    def __init__(self, name: str, stderr: str):
        super().__init__(f"configuration {name} failed")
        self.name = name
        self.stderr = stderr

_HMGRAPH = {"features_on": "disk"}
CONFIGS = {
    "dgl-memory": {"dgl": "memory"},
    "dgl-memmap-cold": {"dgl": "memmap"},
    "none": dict(_HMGRAPH, cache=None),
    "degree": dict(_HMGRAPH, cache="degree"),
    "presample": dict(_HMGRAPH, cache="presample"),
    "layer-aware": dict(_HMGRAPH, cache="layer-aware"),
    "lru": dict(_HMGRAPH, cache="lru"),
    "clock": dict(_HMGRAPH, cache="clock"),
    "hmgraph": dict(_HMGRAPH, cache="hmgraph"),
    "hmgraph+reuse": dict(_HMGRAPH, cache="hmgraph", reuse="two-level"),
    "hmgraph+reuse+cluster": dict(_HMGRAPH, cache="hmgraph",
                                  reuse="two-level", sampler="cluster",
                                  renumber=True, locality=0.5),
}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(name: str, settings: dict) -> dict:
    """Train one configuration; return its row of the table."""
    from hmgraph.train import TrainConfig, train

    overrides = CONFIGS[name]
    config = TrainConfig(**{k: v for k, v in settings.items()
                            if k in TrainConfig.__dataclass_fields__})
    if "dgl" in overrides:
        result = _dgl_run(config, overrides["dgl"])
    else:
        for key, value in overrides.items():
            setattr(config, key, value)
        config.out = str(Path(settings["work"]) / name)
        result = train(config)
    epochs = [e for r in result["runs"] for e in r["epochs"]]
    last = epochs[-1]
    loader = last.get("loader", {})
    cache = loader.get("cache", {})

    def mean(key: str) -> float:
        return sum(e["seconds"].get(key, 0.0) for e in epochs) / len(epochs)

    return {
        "name": name,
        "epoch_seconds": mean("epoch"),
        "seconds": {k: mean(k) for k in ("sample", "fetch", "wait",
                                         "train")},
        "hit_rate": cache.get("hit_rate", {}),
        "storage_bytes": (loader.get("storage") or {}).get("bytes_read",
                                                           0),
        "storage_requests": (loader.get("storage") or {}).get(
            "io_requests", 0),
        "amplification": (loader.get("storage") or {}).get(
            "amplification"),
        "host_to_device_bytes": cache.get("bytes", {}).get(
            "host->device", last.get("host_to_device_bytes", 0)),
        "reuse_rate": (loader.get("reuse") or {}).get("reuse_rate", 0.0),
        "peak_rss_mb": _peak_rss_mb(),
        "test": result["summary"]["test_mean"],
        "plan": result.get("plan"),
    }


def _dgl_run(config, features_kind: str) -> dict:
    """DGL's own loader and the same model, features in memory or memmap."""
    import dgl
    import numpy as np
    import torch.nn.functional as F

    from hmgraph import datasets
    from hmgraph.cache.format import open_feature_file
    from hmgraph.models import build_model, layerwise_inference

    data = datasets.load(config.dataset, config.root, config.verify)
    torch.manual_seed(config.seed)
    dgl.seed(config.seed)
    model = build_model(config.model, data.feat_dim, config.hidden,
                        data.num_classes, num_layers=config.layers,
                        dropout=config.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    sampler = dgl.dataloading.NeighborSampler(config.fanouts)
    loader = dgl.dataloading.DataLoader(
        data.graph, data.split["train"], sampler,
        batch_size=config.batch_size, shuffle=True)
    fd = -1
    if features_kind == "memmap":
        _, rows = open_feature_file(data.feature_path)
        fd = os.open(data.feature_path, os.O_RDONLY)
    else:
        rows = data.features
    epochs, best_valid, test = [], -1.0, 0.0
    try:
        for _ in range(config.epochs):
            seconds = {"sample": 0.0, "fetch": 0.0, "train": 0.0}
            moved = 0
            start = time.perf_counter()
            iterator = iter(loader)
            while True:
                began = time.perf_counter()
                batch = next(iterator, None)
                if batch is None:
                    break
                input_nodes, output_nodes, blocks = batch
                fetched = time.perf_counter()
                seconds["sample"] += fetched - began
                if fd >= 0:  # a cold page cache for every batch: unmap
                    # the map's pages, then drop them from the page cache
                    rows._mmap.madvise(mmap.MADV_DONTNEED)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    fetched = time.perf_counter()
                    x = torch.from_numpy(np.ascontiguousarray(
                        rows[input_nodes.numpy()]))
                else:
                    x = rows[input_nodes]
                y = data.labels[output_nodes]
                trained = time.perf_counter()
                seconds["fetch"] += trained - fetched
                moved += x.numel() * x.element_size()
                loss = F.cross_entropy(model(blocks, x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seconds["train"] += time.perf_counter() - trained
            seconds["epoch"] = time.perf_counter() - start
            logits = layerwise_inference(model, data.graph, data.features)
            valid = data.evaluate(logits, "valid")
            if valid > best_valid:
                best_valid, test = valid, data.evaluate(logits, "test")
            epochs.append({"seconds": seconds,
                           "host_to_device_bytes": moved})
    finally:
        if fd >= 0:
            os.close(fd)
    return {"runs": [{"epochs": epochs}],
            "summary": {"test_mean": test}}


def run(args) -> list[dict]:
    """Run every configuration in its own process; write JSON/md/PNG."""
    from hmgraph.cache.format import atomic_path

    settings = {
        "dataset": args.dataset, "root": args.root, "fanouts": args.fanouts,
        "batch_size": args.batch_size, "epochs": args.epochs,
        "hidden": args.hidden, "lr": args.lr, "seed": args.seed,
        "device_budget": args.device_budget,
        "host_budget": args.host_budget, "progress": False,
        "work": str(Path(args.out) / ".bench-runs"),
    }
    names = args.configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration {unknown[0]!r}; "
                         f"available: {', '.join(CONFIGS)}")
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{args.dataset}"
    for name in names:
        log.info("bench: %s", name)
        command = [sys.executable, "-m", "hmgraph.benchmark", name,
                   json.dumps(settings)]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ConfigurationFailed(name, proc.stderr)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        table = format_table(rows, args)
        with atomic_path(out / f"{stem}.json") as tmp:
            tmp.write_text(json.dumps({"settings": settings,
                                       "rows": rows}, indent=1))
        with atomic_path(out / f"{stem}.md") as tmp:
            tmp.write_text(table + "\n")
    _plot(rows, out / f"{stem}.png")
    print(table)
    return rows


def format_table(rows: list[dict], args) -> str:
    """The side-by-side markdown table."""
    from hmgraph.cache.budget import format_bytes

    base = next((r["epoch_seconds"] for r in rows
                 if r["name"] == "dgl-memory"), None)
    lines = [
        f"# hmgraph bench: {args.dataset}", "",
        f"fanouts {','.join(map(str, args.fanouts))}, batch "
        f"{args.batch_size}, {args.epochs} epoch(s), device budget "
        f"{args.device_budget}, host budget {args.host_budget}; hmgraph "
        f"configurations read features from disk with O_DIRECT.", "",
        "| config | epoch s | vs DGL in-memory | sample s | fetch s "
        "(incl. transfer) | "
        "wait s | train s | device hit | host hit | storage read | "
        "storage requests | read amplification | "
        "host->device | peak RSS MB | test acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|",
    ]
    for row in rows:
        s = row["seconds"]
        ratio = f"{row['epoch_seconds'] / base:.2f}x" if base else "-"
        hits = row["hit_rate"]
        lines.append(
            f"| {row['name']} | {row['epoch_seconds']:.2f} | {ratio} | "
            f"{s['sample']:.2f} | {s['fetch']:.2f} | {s['wait']:.2f} | "
            f"{s['train']:.2f} | {hits.get('device', 0):.1%} | "
            f"{hits.get('host', 0):.1%} | "
            f"{format_bytes(row['storage_bytes'])} | "
            f"{row.get('storage_requests') or '-'} | "
            + (f"{row['amplification']:.2f}" if row.get("amplification")
               else "-")
            + f" | {format_bytes(row['host_to_device_bytes'])} | "
            f"{row['peak_rss_mb']:.0f} | {row['test']:.4f} |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hmgraph.cache.format import atomic_path

    figure, axis = plt.subplots(figsize=(8, 4))
    names = [r["name"] for r in rows]
    bottom = [0.0] * len(rows)
    for stage in ("sample", "fetch", "wait", "train"):
        values = [r["seconds"][stage] for r in rows]
        axis.barh(names, values, left=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    axis.set_xlabel("seconds per epoch (stages overlap when prefetching)")
    axis.legend()
    axis.invert_yaxis()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(figure)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    row = run_one(sys.argv[1], json.loads(sys.argv[2]))
    print(json.dumps(row))

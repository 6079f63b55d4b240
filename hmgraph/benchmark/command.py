"""``hmgraph bench``: every configuration side by side.

``hmgraph bench`` trains the same model for the same epochs under every
configuration, each in its own process (so its peak resident memory is its
own), and reports epoch seconds and their ratio to DGL's in-memory loader
with the configuration's construction seconds beside it (and the ratio
amortized over `AMORTIZE_EPOCHS`), seconds per stage, hit rates per tier,
storage and host-to-device bytes, peak memory and test accuracy.

Configurations: DGL's ``DataLoader`` with its defaults and the features in
memory; the same loader gathering rows from an ``np.memmap`` of the
feature file, its pages dropped once before each epoch (outside the
timing); then hmgraph with features on disk and each cache policy,
``hmgraph`` with two-level reuse, and that with cluster sampling and
renumbering.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from hmgraph import datasets
from hmgraph.benchmark.baselines import dgl_baseline
from hmgraph.benchmark.epochs import DGL_WORKERS
from hmgraph.benchmark.plots import plot_stages
from hmgraph.benchmark.process import (
    ConfigurationFailed,
    isolated,
    peak_rss_bytes,
)
from hmgraph.benchmark.results import commit, write_results
from hmgraph.benchmark.tables import (
    AMORTIZE_EPOCHS,
    amortized,
    markdown_table,
)
from hmgraph.cache.budget import format_bytes

log = logging.getLogger(__name__)

__all__ = [
    "CONFIGS",
    "format_table",
    "run",
    "run_one",
]


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


def run_one(name: str, settings: dict) -> dict:
    """Train one configuration; return its row of the table."""
    # Lazy, as every DGL import in this module: importing hmgraph.benchmark
    # stays 4 s lighter for the tables and the process runner.
    import hmgraph.samplers.cluster as clustering
    import hmgraph.train as training

    overrides = CONFIGS[name]
    config = training.TrainConfig(**{
        k: v for k, v in settings.items()
        if k in training.TrainConfig.__dataclass_fields__})
    if "dgl" in overrides:
        result, built = _dgl_run(config, overrides["dgl"]), {}
    else:
        for key, value in overrides.items():
            setattr(config, key, value)
        config.out = str(Path(settings["work"]) / name)
        # Construction: METIS, the layout and renumbering (train's own
        # record), profiling, plan and static fill (`make_loader`).
        with _timed({"metis": (clustering, "metis_clusters"),
                     "loader": (training, "make_loader")}) as built:
            result = training.train(config)
        built["layout"] = result["layout"]["seconds"]
    epochs = [e for r in result["runs"] for e in r["epochs"]]
    last = epochs[-1]
    alone = result.get("loader_only") or {}
    loader = last.get("loader", {})
    cache = loader.get("cache", {})
    storage = loader.get("storage") or {}

    def mean(key: str) -> float:
        return sum(e["seconds"].get(key, 0.0) for e in epochs) / len(epochs)

    return {
        "name": name,
        "epoch_seconds": mean("epoch"),
        "loader_only_seconds": alone.get("epoch_seconds"),
        "loader_only_cpu_seconds": alone.get("cpu_seconds"),
        "construct_seconds": sum(built.values(), 0.0),
        "construct": built,
        "seconds": {k: mean(k) for k in ("sample", "fetch", "wait",
                                         "train")},
        # CPU seconds of the last epoch's stage threads and storage tier.
        "cpu_seconds": dict(loader.get("cpu_seconds") or {},
                            storage=storage.get("cpu_seconds", 0.0)),
        "hit_rate": cache.get("hit_rate", {}),
        "storage_bytes": storage.get("bytes_read", 0),
        "storage_requests": storage.get("io_requests", 0),
        "amplification": storage.get("amplification"),
        "host_to_device_bytes": cache.get("bytes", {}).get(
            "host->device", last.get("host_to_device_bytes", 0)),
        "reuse_rate": (loader.get("reuse") or {}).get("reuse_rate", 0.0),
        "peak_rss_mb": peak_rss_bytes() / 2**20,
        "test": result["summary"]["test_mean"],
        "plan": result.get("plan"),
    }


@contextlib.contextmanager
def _timed(functions: dict):
    """Seconds spent, while inside, in each ``{key: (module, name)}``
    function, called through its module."""
    seconds = dict.fromkeys(functions, 0.0)
    originals = {key: getattr(*where) for key, where in functions.items()}

    def wrap(key, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start
        return timed

    for key, (module, name) in functions.items():
        setattr(module, name, wrap(key, originals[key]))
    try:
        yield seconds
    finally:
        for key, (module, name) in functions.items():
            setattr(module, name, originals[key])


def _dgl_run(config, features_kind: str) -> dict:
    """`dgl_baseline` for ``config.epochs`` epochs, evaluated after each."""
    from hmgraph.models import layerwise_inference  # lazy: loads DGL

    data = datasets.load(config.dataset, config.root, config.verify)
    best = {"valid": -1.0, "test": 0.0}

    def evaluate(model, record):
        logits = layerwise_inference(model, data.graph, data.features)
        valid = data.evaluate(logits, "valid")
        if valid > best["valid"]:
            best.update(valid=valid, test=data.evaluate(logits, "test"))

    *records, alone = dgl_baseline(
        data, config, features_kind, epochs=config.epochs, after=evaluate,
        progress_bar=False, loader_only=True)
    epochs = [{"seconds": r["seconds"],
               "host_to_device_bytes": r["input_bytes"]} for r in records]
    return {"runs": [{"epochs": epochs}],
            "summary": {"test_mean": best["test"]},
            "loader_only": {"epoch_seconds": alone["seconds"]["epoch"],
                            "cpu_seconds": alone.get("cpu_seconds")}}


def run(args) -> list[dict]:
    """Run every configuration in its own process; write JSON/md/PNG."""
    settings = {
        "dataset": args.dataset, "root": args.root, "fanouts": args.fanouts,
        "batch_size": args.batch_size, "epochs": args.epochs,
        "hidden": args.hidden, "lr": args.lr, "seed": args.seed,
        "device_budget": args.device_budget,
        "host_budget": args.host_budget, "progress": False,
        "loader_only": True,
        "work": str(Path(args.out) / ".bench-runs"),
    }
    names = args.configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration {unknown[0]!r}; "
                         f"available: {', '.join(CONFIGS)}")
    epochs = getattr(args, "amortize_epochs", None) or AMORTIZE_EPOCHS
    result = {"commit": commit(), "settings": settings,
              "amortize_epochs": epochs, "rows": []}
    path = Path(args.out) / f"bench-{args.dataset}.json"
    for name in names:
        log.info("bench: %s", name)
        try:
            result["rows"].append(isolated(run_one, name, settings))
        except ConfigurationFailed as failure:
            raise ConfigurationFailed(name, failure.stderr) from None
        table = format_table(result["rows"], args, epochs)
        write_results(result, table + "\n", path)
    plot_stages(result["rows"], path.with_suffix(".png"))
    print(table)
    return result["rows"]


def format_table(rows: list[dict], args, epochs: int) -> str:
    """The side-by-side markdown table."""
    base = next((r["epoch_seconds"] for r in rows
                 if r["name"] == "dgl-memory"), None)
    alone = next((r.get("loader_only_seconds") for r in rows
                  if r["name"] == "dgl-memory"), None)
    table = []
    for row in rows:
        s, hits = row["seconds"], row["hit_rate"]
        built = row.get("construct_seconds", 0.0)
        table.append([
            row["name"], row["epoch_seconds"],
            f"{row['epoch_seconds'] / base:.2f}x" if base else "-", built,
            f"{amortized(built, row['epoch_seconds'], base, epochs):.2f}x"
            if base else "-", row.get("loader_only_seconds"),
            f"{row['loader_only_seconds'] / alone:.2f}x"
            if alone and row.get("loader_only_seconds") else "-",
            s["sample"], s["fetch"], s["wait"], s["train"],
            " / ".join(f"{row['cpu_seconds'][k]:.2f}" for k in (
                "sample", "fetch", "storage"))
            if row.get("cpu_seconds", {}).get("sample") is not None
            else "-",
            f"{hits.get('device', 0):.1%}", f"{hits.get('host', 0):.1%}",
            format_bytes(row["storage_bytes"]),
            row.get("storage_requests") or "-", row.get("amplification"),
            format_bytes(row["host_to_device_bytes"]),
            round(row["peak_rss_mb"]), f"{row['test']:.4f}"])
    return "\n".join([
        f"# hmgraph bench: {args.dataset}", "",
        f"fanouts {','.join(map(str, args.fanouts))}, batch "
        f"{args.batch_size}, {args.epochs} epoch(s), device budget "
        f"{args.device_budget}, host budget {args.host_budget}; hmgraph "
        f"configurations read features from disk with O_DIRECT; DGL's "
        f"loader with its defaults (num_workers={DGL_WORKERS}), the memmap's "
        f"pages dropped once before each epoch. Construct s: METIS, "
        f"layout, profiling, plan and static fill, outside the epoch; "
        f"amortized: (construct + {epochs} epochs) / {epochs} DGL "
        f"in-memory epochs. Loader only: one more epoch after training, "
        f"sampling and fetch with no model (what a GPU trainer waits "
        f"for), against DGL's loader with features in memory. CPU s: "
        f"the last epoch's sampling and fetching threads' CPU time in "
        f"their stage, and the storage tier's threads'.", "",
        markdown_table(
            ["config", "epoch s", "vs DGL in-memory", "construct s",
             f"vs DGL amortized over {epochs} epochs", "loader only s",
            "loader only vs DGL's", "sample s",
             "fetch s (incl. transfer)", "wait s", "train s",
             "CPU s: sample / fetch / storage", "device hit",
             "host hit", "storage read", "storage requests",
             "read amplification", "host->device", "peak RSS MB",
             "test acc"], table)])

"""Loader only: hmgraph's DataLoader against DGL's, no model.

What a GPU trainer waits for: sampling plus the input rows, per batch.
DGL's own ``DataLoader`` with its defaults and ``features[input_nodes]``
from a tensor in memory is the baseline; hmgraph's loader runs with
features in memory or on disk (``O_DIRECT``), with no cache, the
coordinated cache (device 5 % + host 20 % of the feature bytes; in the
file's order, and in the hot-first layout ``hmgraph train`` writes) or a
host budget that holds every row. Every configuration samples the same seeded
batches; configurations run interleaved, ``--repeats`` times, and the
median seconds per batch count. Targets 1-3 of issue 33 (bench/README.md).
``python bench/loader.py --quick``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import common

from hmgraph.args import name_list, non_negative_int, positive_int

DGL = "dgl, memory"
NONE_MEMORY, NONE_DISK = "hmgraph none, memory", "hmgraph none, disk"
CACHE, COMPLETE = "hmgraph cache, disk", "hmgraph complete, disk"
HOT_FIRST = "hmgraph cache, disk, hot-first"
#: (name, features, cache, device share, host share: None = every row)
CONFIGS = ((DGL, "memory", None, 0.0, 0.0),
           (NONE_MEMORY, "memory", None, 0.0, 0.0),
           (NONE_DISK, "disk", None, 0.0, 0.0),
           (CACHE, "disk", "hmgraph", 0.05, 0.20),
           (HOT_FIRST, "disk", "hmgraph", 0.05, 0.20),
           (COMPLETE, "disk", "hmgraph", 0.0, None))
#: Batches profiled for the hot-first layout, as `hmgraph train` does.
PROFILE_BATCHES = 32
DGL_RATIO_MAX, CACHE_RATIO_MAX, MEMORY_RATIO_MAX = 1.25, 0.8, 1.05
FULL = {"datasets": "synth-small,synth-products", "max_batches": 20,
        "repeats": 3,
        "out": "bench/results/loader.json"}
QUICK = {"datasets": "synth-tiny", "max_batches": 4, "repeats": 1,
         "out": "/tmp/loader_quick.json"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_bench_arguments(parser, training=False)
    add = parser.add_argument
    add("--datasets", type=name_list(), help=f"default {FULL['datasets']}")
    add("--max-batches", type=positive_int,
        help=f"batches per pass (default {FULL['max_batches']})")
    add("--repeats", type=positive_int,
        help=f"interleaved passes (default {FULL['repeats']})")
    add("--prefetch", type=name_list(check=non_negative_int),
        default=["0", "2"], help="hmgraph prefetch depths (default 0,2)")
    add("--seed", type=int, default=0)
    add("--out", help=f"default {FULL['out']}")
    add("--quick", action="store_true")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value.split(",") if key == "datasets"
                    else value)
    args.prefetch = [int(p) for p in args.prefetch]
    return args


def dgl_pass(data, seeds, args) -> dict:
    """DGL's loader with its defaults, ``features[input_nodes]``."""
    import dgl
    import torch

    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    began = time.perf_counter()
    loader = dgl.dataloading.DataLoader(data.graph, seeds, sampler,
                                        batch_size=args.batch_size,
                                        shuffle=True)
    built = time.perf_counter() - began
    dgl.seed(args.seed)
    torch.manual_seed(args.seed)
    return timed(loader, lambda batch: data.features[batch[0]], built)


def hmgraph_pass(data, seeds, args, features, cache, device, host,
                 prefetch, profile=None) -> dict:
    import dgl

    import hmgraph

    feature_bytes = data.feature_bytes
    options = {"cache": cache, "prefetch": prefetch, "seed": args.seed,
               "features": data.features if features == "memory"
               else data.feature_path}
    if cache is not None:
        options["device_budget_bytes"] = int(device * feature_bytes)
        options["host_budget_bytes"] = int(host * feature_bytes) \
            if host is not None else 2 * feature_bytes
    began = time.perf_counter()
    loader = hmgraph.DataLoader(
        data.graph, seeds, dgl.dataloading.NeighborSampler(args.fanouts),
        batch_size=args.batch_size, shuffle=True, labels=data.labels,
        profile=profile, **options)
    built = time.perf_counter() - began
    loader.stats.reset()  # the static fill's reads are construction
    try:
        dgl.seed(args.seed)
        record = timed(loader, lambda batch: batch.x, built)
        stats = loader.stats.as_dict()
    finally:
        loader.close()
    storage = stats.get("storage") or {}
    record.update(
        engine=getattr(next(iter(loader.cache.values()), None), "engine",
                       None),
        staging_rows=sum(p.staging_rows for p in loader.plan.values()),
        stage_seconds={k: v / max(record["batches"], 1)
                       for k, v in stats["seconds"].items()},
        # CPU seconds per batch of each stage's thread, and of the storage
        # tier's threads (system calls and copies out of read buffers).
        stage_cpu_seconds={k: v / max(record["batches"], 1) for k, v in
                           dict(stats["cpu_seconds"], storage=storage.get(
                               "cpu_seconds", 0.0)).items()},
        storage_bytes=storage.get("bytes_read", 0),
        # The disk's floor: what its measured model prices the requests
        # and bytes of a batch at (io_requests / iops + bytes / bandwidth).
        disk_seconds_per_batch=storage.get("model_seconds", 0.0)
        / max(record["batches"], 1),
        hit_rate=(stats.get("cache") or {}).get("hit_rate", {}))
    return record


def timed(loader, rows, built: float) -> dict:
    """Wall and CPU seconds per batch of one pass over ``loader``."""
    gc.collect()
    batches = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for batch in loader:
        rows(batch)
        batches += 1
    wall = time.perf_counter() - start
    return {"batches": batches, "seconds_per_batch": wall / max(batches, 1),
            "cpu_seconds_per_batch": (time.process_time() - cpu)
            / max(batches, 1), "construct_seconds": built}


def measured_disk(path) -> dict:
    """The disk under ``path`` measured now (`hmgraph disk --refresh`):
    the model every loader after it plans and prices its reads with. The
    virtual disk's speed drifts within the hour, and a model cached at
    another moment is no floor."""
    from hmgraph.cache.disk import disk_model

    model = disk_model(path, refresh=True)
    return {"iops": model.iops, "bandwidth": model.bandwidth,
            "queue_depth": model.queue_depth, "text": model.describe()}


def run_dataset(name: str, args) -> tuple[list[dict], dict]:
    """The dataset's records, and the disk measured before and after."""
    data, facts = common.load(name, args.root)
    seeds = common.seeded_subset(data.split["train"], args.max_batches,
                                 args.batch_size, args.seed)
    disk = {"before": measured_disk(data.feature_path)}
    hot = common.hot_first_layout(name, data, seeds, args, PROFILE_BATCHES)
    runs = [(config, prefetch) for config in CONFIGS
            for prefetch in ([None] if config[0] == DGL else args.prefetch)]
    passes: dict = {}
    bar = common.progress(len(runs) * args.repeats, name)
    for _ in range(args.repeats):
        for (config, features, cache, device, host), prefetch in runs:
            on, ids, profile = hot[:3] if config == HOT_FIRST else \
                (data, seeds, None)
            record = dgl_pass(data, seeds, args) if config == DGL else \
                hmgraph_pass(on, ids, args, features, cache, device,
                             host, prefetch, profile)
            if config == HOT_FIRST:  # the layout is built once, reused
                layout = hot[3]["seconds"] + hot[3]["formats_seconds"]
                record["construct_seconds"] += layout
                record["layout_seconds"] = layout
            passes.setdefault((config, prefetch), []).append(record)
            bar.update(1)
    bar.close()
    disk["after"] = measured_disk(data.feature_path)
    records = []
    for (config, prefetch), done in passes.items():
        seconds = [r["seconds_per_batch"] for r in done]
        middle = sorted(done, key=lambda r: r["seconds_per_batch"])[
            (len(done) - 1) // 2]  # stages and counters of the median pass
        records.append(dict(
            middle, dataset=name, config=config, prefetch=prefetch,
            seconds_per_batch=statistics.median(seconds),
            seconds_per_batch_all=seconds,
            cpu_seconds_per_batch=statistics.median(
                r["cpu_seconds_per_batch"] for r in done),
            feature_bytes=facts["feature_bytes"]))
    base = find(records, name, DGL, None)["seconds_per_batch"]
    for record in records:
        record["vs_dgl"] = record["seconds_per_batch"] / base
    for record in records:
        if record["config"] in (CACHE, HOT_FIRST):
            none = find(records, name, NONE_DISK, record["prefetch"])
            record["vs_none"] = record["seconds_per_batch"] / \
                none["seconds_per_batch"]
    return records, disk


def find(records, dataset, config, prefetch) -> dict:
    return next(r for r in records if r["dataset"] == dataset and
                r["config"] == config and r["prefetch"] == prefetch)


def targets(records, args) -> list[dict]:
    rows = []
    for record in records:
        label = f"{record['dataset']} prefetch {record['prefetch']}"
        note = f"built {record['construct_seconds']:.1f} s"
        if record["config"] in (CACHE, HOT_FIRST):
            rows.append(common.target(
                1, f"{label}: {record['config']} / {DGL}", record["vs_dgl"],
                "<=", DGL_RATIO_MAX, note))
            rows.append(common.target(
                2, f"{label}: {record['config']} / {NONE_DISK}",
                record["vs_none"], "<=", CACHE_RATIO_MAX, note))
        if record["config"] in (COMPLETE, NONE_MEMORY):
            rows.append(common.target(
                3, f"{label}: {record['config']} / {DGL}", record["vs_dgl"],
                "<=", MEMORY_RATIO_MAX, note))
    return sorted(rows, key=lambda t: t["target"])


def report(result: dict) -> str:
    rows = []
    for r in result["records"]:
        stages = r.get("stage_seconds") or {}
        cpu = r.get("stage_cpu_seconds") or {}
        rows.append([
            r["dataset"], r["config"], "-" if r["prefetch"] is None
            else r["prefetch"], r["seconds_per_batch"],
            r["cpu_seconds_per_batch"], r["vs_dgl"], r.get("vs_none"),
            stages.get("sample"), stages.get("fetch"), stages.get("wait"),
            " / ".join(f"{cpu[k]:.3f}" for k in ("sample", "fetch",
                                                 "storage")) if cpu
            else "-",
            r.get("storage_bytes", 0) / 1e9 if r.get("storage_bytes")
            else None, r.get("disk_seconds_per_batch") or None,
            r["construct_seconds"]])
    text = [
        "# Loader only: hmgraph against DGL's DataLoader", "",
        f"{result['config']['max_batches']} seeded batches of "
        f"{result['config']['batch_size']} at fanouts "
        f"{','.join(map(str, result['config']['fanouts']))}, no model; "
        f"median of {result['config']['repeats']} interleaved passes "
        "(seconds per batch, wall and CPU of the whole process). Stage "
        "seconds per batch are the loader's (sample and fetch run in its "
        "threads with prefetch > 0; wait is the consumer's). The machine "
        "is shared: only ratios within this run count. Disk model "
        "s/batch: the disk's model, measured again before each dataset's "
        "runs (`hmgraph disk --refresh`), priced on the requests and "
        "bytes a batch read: the floor of a loader reading them. CPU "
        "s/batch per stage: the sampling and fetching threads' CPU time "
        "in their stage, and the storage tier's threads' (reads and "
        "copies out of read buffers).", "",
        common.environment_text(result["environment"]), "",
        *(f"{name}: the disk measured before the runs (their model): "
          f"{disk['before']['text']}; after: {disk['after']['text']}.\n"
          for name, disk in result["disks"].items()),
        common.markdown_table(
            ["dataset", "loader", "prefetch", "s/batch", "CPU s/batch",
             "/ dgl", "/ none (disk)", "sample", "fetch", "wait",
             "CPU s/batch: sample / fetch / storage", "storage GB",
             "disk model s/batch", "construct s"], rows), "",
        "## Targets (issue 33)", "",
        common.targets_table(result["targets"]), ""]
    return "\n".join(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = {"config": common.settings(args),
              "environment": common.environment(), "records": [],
              "disks": {}, "targets": []}
    for name in args.datasets:
        records, result["disks"][name] = run_dataset(name, args)
        result["records"] += records
        result["targets"] = targets(result["records"], args)
        common.write_results(result, report(result), args.out)
    return common.finish(result, report(result), args.out)


if __name__ == "__main__":
    sys.exit(main())

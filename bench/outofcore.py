"""Out of core: train when node features are larger than host memory.

DGL's loader (rows in memory, ``np.memmap``) against hmgraph's with
features on disk, each in its own process; targets of issues 13 and 34
(bench/README.md). ``python bench/outofcore.py --quick``.

Every hmgraph row has its roofline: per batch, the disk model's seconds
for the requests and bytes the epoch read (at the queue depth the model
chose), and the training step alone on a batch already in memory (the
epoch's model copied, three steps after the epoch, median); the figure to
drive down is measured / max(storage, compute).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import common
import psutil
import torch

from hmgraph import datasets
from hmgraph.args import name_list
from hmgraph.cache.disk import disk_model

GIB = 1 << 30
CONFIGS = ("dgl memory", "dgl memmap", "dgl memmap-random", "hmgraph")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_bench_arguments(parser, datasets="synth-igb,synth-igb-large")
    add = parser.add_argument
    add("--batches", type=int, default=0,
        help="batches timed per configuration (0: the whole epoch)")
    add("--out", default=str(common.RESULTS),
        help="folder for outofcore.{json,md}")
    add("--max-seconds", type=float, default=900.0, help="stop a DGL epoch "
        "after the batch past this many seconds (0: no cap)")
    add("--configs", default=",".join(CONFIGS), type=name_list(CONFIGS),
        help="configurations to run (dgl memory only where features fit)")
    add("--timeout", type=float, default=3600.0, help="kill a "
        "configuration's process after this many seconds (0: never)")
    add("--loader-only", action=argparse.BooleanOptionalAction,
        default=True, help="after each configuration's training epoch, "
        "one with no model (sampling and rows: what a GPU trainer waits "
        "for), where features are larger than memory too")
    add("--quick", action="store_true",
        help="smoke run: skip the disk measurement")
    return parser.parse_args(argv)


def _setup(name, args, features_on):
    began = time.perf_counter()
    data = datasets.load(name, args.root, verify=False,
                         features_on=features_on)
    return data, time.perf_counter() - began


def _record(config, name, data, load_seconds, train, loader=None,
            **more) -> dict:
    return {"config": config, "dataset": name, "load_seconds": load_seconds,
            "construct_seconds": 0.0, **more, "train": train,
            "loader": loader, "graph_bytes": data.graph_bytes,
            "feature_bytes": data.feature_bytes,
            "peak_rss_bytes": common.peak_rss_bytes()}


def run_dgl(name: str, args, kind: str, loader_only: bool) -> dict:
    """`common.dgl_epoch` over rows in memory or an ``np.memmap``."""
    data, load_seconds = _setup(name, args, "memory" if kind == "memory"
                                else "disk")
    runs = common.dgl_baseline(
        data, args, kind, loader_only=loader_only, max_batches=args.batches,
        max_seconds=args.max_seconds, desc=f"dgl {kind} {{epoch}}")
    return _record(f"dgl {kind}", name, data, load_seconds, *runs)


def run_hmgraph(name: str, args, loader_only: bool) -> dict:
    """hmgraph's loader, features on disk, default budgets; evaluation."""
    import dgl

    from hmgraph.train import TrainConfig, evaluate, make_loader, resolve_eval

    data, load_seconds = _setup(name, args, "disk")
    model, optimizer = common.new_model(data, args.hidden, len(args.fanouts),
                                        args.seed)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    config = TrainConfig(dataset=name, root=args.root, fanouts=args.fanouts,
                         batch_size=args.batch_size, hidden=args.hidden,
                         seed=args.seed, features_on="disk", cache="hmgraph",
                         progress=False)
    began = time.perf_counter()
    loader, memory = make_loader(config, data, sampler, "cpu")
    construct = time.perf_counter() - began
    construct_storage = loader.stats.storage.as_dict()  # the static fill
    runs = []
    for mode in ("train", "loader") if loader_only else ("train",):
        loader.set_epoch(0)
        run = common.hmgraph_epoch(
            loader, *((model, optimizer) if mode == "train" else ()),
            max_batches=args.batches, desc=f"hmgraph {mode}")
        storage = run["stats"]["storage"]
        runs.append(dict(run, amplification=storage["amplification"] or None))
    compute = _step_alone(loader, model)
    for run, mode in zip(runs, ("train", "loader"), strict=False):
        run["roofline"] = _roofline(run, compute if mode == "train" else 0.0)
    mode = resolve_eval(config, data, loader)
    began = time.perf_counter()
    scores = evaluate(config, data, model, loader, "cpu", mode)
    evaluation = {"mode": mode, "seconds": time.perf_counter() - began,
                  **scores}
    loader.close()
    return _record("hmgraph", name, data, load_seconds, *runs,
                   construct_seconds=construct,
                   construct_storage=construct_storage, memory=memory,
                   evaluation=evaluation)


def _step_alone(loader, model, repeats: int = 3) -> float:
    """Seconds of one training step with the batch in memory: one more
    batch of the loader, then ``repeats`` steps of a copy of the model
    (the trained one is left as it is) with nothing else running; the
    median."""
    batch = next(iter(loader))
    twin = copy.deepcopy(model)
    optimizer = torch.optim.Adam(twin.parameters(), lr=common.LR)
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        common.train_step(twin, optimizer, batch.blocks, batch.x, batch.y)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def _roofline(run: dict, compute: float) -> dict:
    """Per batch: the disk model's seconds for what the epoch read, the
    step alone (``compute``; 0 for the loader alone), their max, and
    measured / max."""
    storage = run["stats"]["storage"]["model_seconds"] / max(
        run["batches"], 1)
    roof = max(storage, compute)
    return {"storage_seconds": storage, "compute_seconds": compute,
            "roofline_seconds": roof,
            "ratio": run["seconds_per_batch"] / roof if roof else None}


def _speedup(base: dict, record: dict, epochs: int) -> tuple:
    """Per batch, ``base / record``, and amortized over ``epochs`` whole
    epochs with ``record``'s construction."""
    b, r = base["train"], record["train"]
    ratio = b["seconds_per_batch"] / r["seconds_per_batch"]
    slow = common.amortized(record["construct_seconds"],
                            r["seconds_per_batch"] * r["epoch_batches"],
                            b["seconds_per_batch"] * b["epoch_batches"],
                            epochs)
    return ratio, 1 / slow


def targets(records: list[dict], epochs: int) -> list[dict]:
    """The issue's four targets."""
    by = {(r["dataset"], r["config"]): r for r in records}
    rows = []
    large = by.get(("synth-igb-large", "hmgraph"))
    if large:
        memory = large["memory"]
        limit = (memory["graph_bytes"] + memory["host_budget_bytes"]
                 + memory["device_budget_bytes"] + 2 * GIB)
        rows.append(common.target(
            1, "synth-igb-large: epoch + evaluation, peak RSS GB",
            large["peak_rss_bytes"] / 1e9, "<=", limit / 1e9))
        for kind in ("dgl memmap", "dgl memmap-random"):
            memmap = by.get(("synth-igb-large", kind))
            if memmap:
                ratio, amortized = _speedup(memmap, large, epochs)
                rows.append(common.target(
                    2, f"synth-igb-large: {kind} / hmgraph, seconds per "
                    "batch", ratio, ">=", 2.0, common.built_note(
                        f"construct {large['construct_seconds']:.1f} s",
                        epochs, amortized)))
    small = by.get(("synth-igb", "hmgraph"))
    ceiling = by.get(("synth-igb", "dgl memory"))
    if small and ceiling:
        ratio, amortized = _speedup(ceiling, small, epochs)
        rows.append(common.target(
            3, "synth-igb: hmgraph (disk) epoch / dgl memory epoch",
            1 / ratio, "<=", 1.25, common.built_note(
                f"construct {small['construct_seconds']:.1f} s", epochs,
                1 / amortized)))
    for name in ("synth-igb", "synth-igb-large"):
        record = by.get((name, "hmgraph"))
        if record:
            rows.append(common.target(
                4, f"{name}: storage bytes / bytes of rows served",
                record["train"]["amplification"], "<=", 1.05,
                None if record["train"]["amplification"] else
                "no storage read in the epoch: the host tier holds every "
                "row"))
    return rows


def targets_34(records: list[dict], epochs: int) -> list[dict]:
    """Issue 34's targets 1-3 (4 and 5: bench/cache_policies.py on
    synth-papers and the tests)."""
    by = {(r["dataset"], r["config"]): r for r in records}
    rows = []
    large = by.get(("synth-igb-large", "hmgraph"))
    memmap = by.get(("synth-igb-large", "dgl memmap-random"))
    if large and memmap:
        ratio, amortized = _speedup(memmap, large, epochs)
        rows.append(common.target(
            1, "synth-igb-large: dgl memmap-random / hmgraph, seconds per "
            "batch", ratio, ">=", 3.0, common.built_note(
                f"construct {large['construct_seconds']:.1f} s", epochs,
                amortized)))
    if large:
        roof = large["train"].get("roofline") or {}
        rows.append(common.target(
            2, "synth-igb-large: measured s/batch / roofline max(storage "
            "model, step alone)", roof.get("ratio"), "<=", 1.3))
    for name in ("synth-igb", "synth-igb-large"):
        record = by.get((name, "hmgraph"))
        if record and "promise_bytes" in record["memory"]:
            memory = record["memory"]
            rows.append(common.target(
                3, f"{name}: peak RSS GB (epoch and evaluation) against "
                f"graph + budgets + {memory['batches_in_flight']} batches' "
                f"input rows + 2 GiB", record["peak_rss_bytes"] / 1e9,
                "<=", memory["promise_bytes"] / 1e9))
    return rows


def report(result: dict) -> str:
    a, epochs = result["args"], result["args"]["amortize_epochs"]
    lines = ["# Out of core", "",
             f"Workload: NeighborSampler {a['fanouts']}, batch "
             f"{a['batch_size']}, GraphSAGE hidden {a['hidden']}, seed "
             f"{a['seed']}; {a['batches'] or 'all'} batches per epoch; each "
             f"configuration in its own process; DGL's loader with "
             f"num_workers={a['dgl_workers']}, memmap pages dropped once "
             f"before each epoch.", ""]
    if result.get("disk"):
        lines += ["Disk (measured in this run): "
                  f"{common.disk_text(result['disk'], sweep=True)}.", ""]
    by = {(r["dataset"], r["config"]): r for r in result["records"]}
    rows = []
    for r in result["records"]:
        train, only = r["train"], r["loader"]
        base = by.get((r["dataset"], "dgl memmap"))
        ratio, amortized = _speedup(base, r, epochs) if base else (None, None)
        storage = train.get("stats", {}).get("storage") or {}
        rows.append([
            r["dataset"], r["config"],
            f"{train['batches']}{' (capped)' if train['capped'] else ''}",
            train["seconds"]["epoch"], train["seconds_per_batch"],
            only and only["seconds_per_batch"], ratio,
            r["construct_seconds"], amortized, r["load_seconds"],
            train["read_bytes"] / 1e9, storage.get("io_requests"),
            train.get("amplification"), storage.get("seconds"),
            storage.get("model_seconds"), r["peak_rss_bytes"] / 1e9])
    lines += [common.markdown_table(
        ["dataset", "config", "batches", "train s", "train s/batch",
         "loader-only s/batch", "memmap / this", "construct s",
         f"memmap / this, amortized over {epochs} epochs", "load s",
         "disk GB read (train)", "storage requests", "amplification",
         "storage s", "model s", "peak RSS GB"], rows), "",
        "Columns explained in bench/README.md (outofcore.py).", ""]
    evals = [r for r in result["records"] if "evaluation" in r]
    if evals:
        lines += ["Full evaluation after the epoch (hmgraph):", "",
                  common.markdown_table(
                      ["dataset", "mode", "seconds", "valid", "test",
                       "host budget GB", "graph GB", "working set GB"],
                      [[r["dataset"], *(r["evaluation"][k] for k in (
                          "mode", "seconds", "valid", "test")),
                        *(r["memory"][k] / 1e9 for k in (
                            "host_budget_bytes", "graph_bytes",
                            "working_set_bytes"))] for r in evals]), ""]
    roofs = [(r, mode, r[mode]["roofline"]) for r in result["records"]
             for mode in ("train", "loader")
             if r.get(mode) and r[mode].get("roofline")]
    if roofs:
        lines += ["Roofline (hmgraph), seconds per batch: the disk model "
                  "priced on the epoch's requests and bytes at its queue "
                  "depth, the training step alone on a batch in memory, "
                  "and what the epoch measured:", "",
                  common.markdown_table(
                      ["dataset", "epoch", "storage model", "step alone",
                       "roofline", "measured", "measured / roofline"],
                      [[r["dataset"], mode, roof["storage_seconds"],
                        roof["compute_seconds"] or "-",
                        roof["roofline_seconds"],
                        r[mode]["seconds_per_batch"], roof["ratio"]]
                       for r, mode, roof in roofs]), ""]
    lines += [f"FAILED: {f['dataset']} {f['config']}: {f['error']}\n"
              for f in result["failures"]]
    lines += ["Targets (issue 13):", "",
              common.targets_table(result["targets"]), "",
              "Targets (issue 34):", "",
              common.targets_table(result["targets_34"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = {"commit": common.commit(), "args": vars(args),
              "environment": common.environment(), "disk": None,
              "records": [], "failures": []}
    for name in args.datasets:
        # Generate (or find) the dataset once, outside the timed runs.
        data = datasets.load(name, args.root, verify=False,
                             features_on="disk", progress=True)
        if result["disk"] is None and not args.quick:
            # Measured afresh; the loaders plan with this model too.
            result["disk"] = disk_model(data.feature_path, seconds=3.0,
                                        refresh=True).as_dict()
        fits = data.feature_bytes + data.graph_bytes + 4 * GIB < \
            psutil.virtual_memory().total
        del data
        runs = [("hmgraph", run_hmgraph, ())] + [
            (f"dgl {kind}", run_dgl, (kind,))
            for kind in ("memory", "memmap", "memmap-random")
            if fits or kind != "memory"]
        for config, function, extra in runs:
            if config not in args.configs:
                continue
            try:
                record = common.isolated(function, name, args, *extra,
                                         args.loader_only,
                                         timeout=args.timeout or None)
            except common.ConfigurationFailed as err:
                result["failures"].append({"dataset": name, "config": config,
                                           "error": str(err)})
                print(f"{name} {config}: FAILED: {err}", flush=True)
                continue
            result["records"].append(record)
            print(f"{name} {config}: {record['train']['batches']} batches, "
                  f"epoch {record['train']['seconds']['epoch']:.1f} s, "
                  f"construct {record['construct_seconds']:.1f} s, peak RSS "
                  f"{record['peak_rss_bytes'] / 1e9:.2f} GB", flush=True)
    result["targets"] = targets(result["records"], args.amortize_epochs)
    result["targets_34"] = targets_34(result["records"],
                                      args.amortize_epochs)
    return common.finish(result, report(result),
                         Path(args.out) / "outofcore.json")


if __name__ == "__main__":
    sys.exit(main())

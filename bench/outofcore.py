"""Out of core: train when node features are larger than host memory.

One invocation, the same sampler (DGL's ``NeighborSampler``, fanouts
15,10,5), batch size, model (GraphSAGE, hidden 256, 3 layers) and seeds for
every configuration, each in its own process:

* **dgl memory** (datasets that fit RAM): DGL's ``DataLoader`` with its
  defaults, rows indexed in an in-memory tensor, the ceiling;
* **dgl memmap**: the same loader gathering rows from an ``np.memmap`` of
  the feature file, its pages dropped once before the epoch: what a DGL
  user does today with features larger than RAM;
* **hmgraph**: ``hmgraph.DataLoader`` with features on disk (O_DIRECT
  storage tier) behind the ``hmgraph`` cache at its default budgets
  (``--host-budget auto``, no device tier on a CPU), as ``hmgraph train
  --features-on disk`` builds it; its construction (profiling, plan, fill)
  is timed apart and reported beside every ratio.

Each configuration times a training epoch (sample + fetch + train) and,
where the features fit in RAM, a loader-only epoch (sample + fetch +
transfer, no model: the regime of a GPU trainer) over the same number of
batches; the memmap's pages are dropped before each. hmgraph also runs the full
evaluation of `hmgraph.train.evaluate` (layer-wise where its cache holds
every row, else sampled over the validation and test nodes), and reports
storage requests, bytes and read amplification (bytes read / bytes of the
rows served from storage). The disk's limits are measured in the same run.

Targets (issue 13):

1. synth-igb-large (features > RAM): an epoch plus full evaluation
   completes, peak RSS <= graph bytes + budgets + 2 GiB;
2. synth-igb-large: hmgraph's epoch >= 2x faster than dgl memmap;
3. synth-igb: hmgraph's epoch (features on disk) <= 1.25x dgl memory;
4. storage bytes read <= 1.05x the bytes of rows served from storage on
   both synth-igb datasets.

Usage::

    python bench/outofcore.py --root data            # both datasets
    python bench/outofcore.py --datasets synth-tiny --batches 4 --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

GIB = 1 << 30


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_workload_arguments(parser)
    parser.add_argument("--datasets", default="synth-igb,synth-igb-large")
    parser.add_argument("--out", default=str(common.RESULTS),
                        help="folder for outofcore.{json,md}")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="stop a DGL epoch after the batch that ends "
                        "past this many seconds (0: no cap); ratios are "
                        "then per batch")
    parser.add_argument("--configs",
                        default="dgl memory,dgl memmap,dgl memmap-random,"
                        "hmgraph",
                        help="configurations to run (dgl memory runs only "
                        "where the features fit in RAM)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: skip the disk measurement")
    args = parser.parse_args(argv)
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.configs = [c.strip() for c in args.configs.split(",") if c]
    return args


def _setup(name, args, features_on):
    import dgl

    from hmgraph import datasets
    from hmgraph.models import build_model

    began = time.perf_counter()
    data = datasets.load(name, args.root, verify=False,
                         features_on=features_on)
    load_seconds = time.perf_counter() - began
    torch.manual_seed(args.seed)
    model = build_model("sage", data.feat_dim, args.hidden, data.num_classes,
                        num_layers=len(args.fanouts), dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    return data, model, optimizer, sampler, load_seconds


def run_dgl(name: str, args, kind: str, loader_only: bool) -> dict:
    """DGL's loader over rows in memory (``memory``) or a memmap.

    ``memmap`` is ``np.memmap`` as it comes; ``memmap-random`` also tells
    the kernel the access is random (``madvise(MADV_RANDOM)``), so a page
    fault reads its page alone instead of the device's read-ahead window
    (8 MiB on this machine's disk), as a careful user would.
    """
    import mmap

    from hmgraph.cache.format import open_feature_file

    data, model, optimizer, sampler, load_seconds = _setup(
        name, args, "memory" if kind == "memory" else "disk")
    features = data.features if kind == "memory" else \
        open_feature_file(data.feature_path)[1]
    if kind == "memmap-random":
        features._mmap.madvise(mmap.MADV_RANDOM)
    runs = {"loader": None}
    for mode in ("train", "loader") if loader_only else ("train",):
        if kind != "memory":  # each epoch starts from a cold page cache
            common.drop_page_cache(data.feature_path)
        runs[mode] = common.dgl_epoch(
            data, sampler, model, optimizer, features,
            batch_size=args.batch_size, seed=args.seed,
            max_batches=args.batches, max_seconds=args.max_seconds,
            train=mode == "train", desc=f"dgl {kind} {mode}")
    return {"config": f"dgl {kind}", "dataset": name,
            "load_seconds": load_seconds, "construct_seconds": 0.0,
            "train": runs["train"], "loader": runs["loader"],
            "graph_bytes": data.graph_bytes,
            "feature_bytes": data.feature_bytes,
            "peak_rss_bytes": common.peak_rss_bytes()}


def run_hmgraph(name: str, args, loader_only: bool) -> dict:
    """hmgraph's loader, features on disk, default budgets; evaluation."""
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from hmgraph.train import TrainConfig, evaluate, make_loader, resolve_eval

    data, model, optimizer, sampler, load_seconds = _setup(name, args, "disk")
    config = TrainConfig(dataset=name, root=args.root, fanouts=args.fanouts,
                         batch_size=args.batch_size, hidden=args.hidden,
                         seed=args.seed, features_on="disk", cache="hmgraph",
                         progress=False)
    began = time.perf_counter()
    loader, memory = make_loader(config, data, sampler, "cpu")
    construct = time.perf_counter() - began
    storage = loader.stats.storage
    construct_storage = storage.as_dict()  # the static fill's reads
    runs = {"loader": None}
    for mode in ("train", "loader") if loader_only else ("train",):
        loader.set_epoch(0)
        loader.stats.reset()
        total = len(loader) if not args.batches else min(args.batches,
                                                          len(loader))
        seconds = {"train": 0.0}
        batches = rows = 0
        before = common.read_bytes()
        start = time.perf_counter()
        bar = tqdm(total=total, desc=f"hmgraph {mode}", leave=False)
        for batch in loader:
            step = time.perf_counter()
            if mode == "train":
                loss = F.cross_entropy(model(batch.blocks, batch.x), batch.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            seconds["train"] += time.perf_counter() - step
            batches += 1
            rows += int(batch.input_nodes.numel())
            bar.update(1)
            if batches == total:
                break
        bar.close()
        seconds["epoch"] = time.perf_counter() - start
        seconds.update({k: v for k, v in loader.stats.seconds.items()
                        if k != "train"})
        seconds_per_batch = seconds["epoch"] / max(batches, 1)
        cache = loader.stats.cache.as_dict()
        runs[mode] = {
            "batches": batches, "input_rows": rows, "seconds": seconds,
            "seconds_per_batch": seconds_per_batch, "capped": False,
            "read_bytes": common.read_bytes() - before,
            "hit_rate": cache["hit_rate"],
            "storage": storage.as_dict(),
            "amplification": storage.amplification or None,
        }
    # Full evaluation, as `hmgraph train` runs it after an epoch.
    mode = resolve_eval(config, data, loader)
    began = time.perf_counter()
    scores = evaluate(config, data, model, loader, "cpu", mode)
    evaluation = {"mode": mode, "seconds": time.perf_counter() - began,
                  **scores}
    loader.close()
    return {"config": "hmgraph", "dataset": name,
            "load_seconds": load_seconds, "construct_seconds": construct,
            "construct_storage": construct_storage, "memory": memory,
            "train": runs["train"],
            "loader": runs["loader"], "evaluation": evaluation,
            "graph_bytes": data.graph_bytes,
            "feature_bytes": data.feature_bytes,
            "peak_rss_bytes": common.peak_rss_bytes()}


def targets(records: list[dict]) -> list[dict]:
    """The issue's four targets, PASS / MISS with the figures."""
    by = {(r["dataset"], r["config"]): r for r in records}
    rows = []

    def add(number, what, value, limit, ok):
        rows.append({"target": number, "what": what, "value": value,
                     "limit": limit,
                     "verdict": None if ok is None else
                     ("PASS" if ok else "MISS")})

    large = by.get(("synth-igb-large", "hmgraph"))
    if large:
        memory = large["memory"]
        limit = (memory["graph_bytes"] + memory["host_budget_bytes"]
                 + memory["device_budget_bytes"] + 2 * GIB)
        add(1, "synth-igb-large: epoch + evaluation, peak RSS GB",
            large["peak_rss_bytes"] / 1e9, limit / 1e9,
            large["peak_rss_bytes"] <= limit)
        for kind in ("dgl memmap", "dgl memmap-random"):
            memmap = by.get(("synth-igb-large", kind))
            if memmap:
                ratio = memmap["train"]["seconds_per_batch"] / \
                    large["train"]["seconds_per_batch"]
                add(2, f"synth-igb-large: {kind} / hmgraph, seconds per "
                    f"batch", ratio, 2.0, ratio >= 2.0)
    small = by.get(("synth-igb", "hmgraph"))
    ceiling = by.get(("synth-igb", "dgl memory"))
    if small and ceiling:
        ratio = small["train"]["seconds_per_batch"] / \
            ceiling["train"]["seconds_per_batch"]
        add(3, "synth-igb: hmgraph (disk) epoch / dgl memory epoch", ratio,
            1.25, ratio <= 1.25)
    for name in ("synth-igb", "synth-igb-large"):
        record = by.get((name, "hmgraph"))
        if record:
            amp = record["train"]["amplification"]
            if amp is None:
                add(4, f"{name}: storage bytes / bytes of rows served "
                    f"(no storage read in the epoch: the host tier holds "
                    f"every row)", None, 1.05, None)
            else:
                add(4, f"{name}: storage bytes / bytes of rows served",
                    amp, 1.05, amp <= 1.05)
    return rows


def report(result: dict) -> str:
    lines = [f"# Out of core ({result['commit']})", "",
             f"Workload: NeighborSampler {result['args']['fanouts']}, batch "
             f"{result['args']['batch_size']}, GraphSAGE hidden "
             f"{result['args']['hidden']}, seed {result['args']['seed']}; "
             f"{result['args']['batches'] or 'all'} batches per epoch; "
             f"each configuration in its own process.", ""]
    disk = result.get("disk")
    if disk:
        lines += [f"Disk: {disk['random_4k_iops']} random 4 KiB O_DIRECT "
                  f"reads/s at queue depth {disk['threads']}, "
                  f"{disk['sequential_bytes_per_second'] / 1e9:.2f} GB/s "
                  f"sequential, logical block {disk['logical_block_bytes']} "
                  f"B.", ""]
    rows = []
    for r in result["records"]:
        train, only = r["train"], r["loader"]
        base = next((b for b in result["records"] if b["dataset"] ==
                     r["dataset"] and b["config"] == "dgl memmap"), None)
        rows.append([
            r["dataset"], r["config"],
            f"{train['batches']}{' (capped)' if train['capped'] else ''}",
            train["seconds"]["epoch"], train["seconds_per_batch"],
            None if only is None else only["seconds_per_batch"],
            None if base is None else
            base["train"]["seconds_per_batch"] / train["seconds_per_batch"],
            r["construct_seconds"], r["load_seconds"],
            train.get("read_bytes", 0) / 1e9,
            train.get("storage", {}).get("io_requests"),
            train.get("amplification"),
            train.get("storage", {}).get("seconds"),
            train.get("storage", {}).get("model_seconds"),
            r["peak_rss_bytes"] / 1e9,
        ])
    lines += [common.markdown_table(
        ["dataset", "config", "batches", "train s", "train s/batch",
         "loader-only s/batch", "memmap / this", "construct s", "load s",
         "disk GB read (train)", "storage requests", "amplification",
         "storage s", "model s", "peak RSS GB"], rows), "",
        "Batches marked capped stopped at `--max-seconds`; ratios are per "
        "batch. Disk GB read: block-device reads of the process "
        "(`/proc/self/io`) during the training epoch. Storage requests, "
        "amplification (bytes read / bytes of rows served) and seconds: "
        "hmgraph's storage tier; model s: the same requests and bytes "
        "priced by the disk model (requests / IOPS + bytes / bandwidth).",
        ""]
    evals = [r for r in result["records"] if "evaluation" in r]
    if evals:
        lines += ["Full evaluation after the epoch (hmgraph):", "",
                  common.markdown_table(
                      ["dataset", "mode", "seconds", "valid", "test",
                       "host budget GB", "graph GB", "working set GB"],
                      [[r["dataset"], r["evaluation"]["mode"],
                        r["evaluation"]["seconds"],
                        r["evaluation"]["valid"], r["evaluation"]["test"],
                        r["memory"]["host_budget_bytes"] / 1e9,
                        r["memory"]["graph_bytes"] / 1e9,
                        r["memory"]["working_set_bytes"] / 1e9]
                       for r in evals]), ""]
    for failure in result.get("failures", []):
        lines += [f"FAILED: {failure['dataset']} {failure['config']}: "
                  f"{failure['error']}", ""]
    lines += ["Targets:", "", common.markdown_table(
        ["#", "target", "value", "limit", "verdict"],
        [[t["target"], t["what"], t["value"], t["limit"], t["verdict"]]
         for t in result["targets"]]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    import subprocess

    import psutil

    from hmgraph import datasets

    args = parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    records, failures, disk = [], [], None
    for name in args.datasets:
        # Generate (or find) the dataset once, outside the timed runs.
        data = datasets.load(name, args.root, verify=False,
                             features_on="disk", progress=True)
        if disk is None and not args.quick:
            disk = common.disk_limits(data.feature_path)
            print(f"disk: {disk}", flush=True)
        fits = data.feature_bytes + data.graph_bytes + 4 * GIB < \
            psutil.virtual_memory().total
        del data
        # Loader-only epochs (no model) where the features fit in RAM.
        runs = [("hmgraph", run_hmgraph, ())] + [
            (f"dgl {kind}", run_dgl, (kind,))
            for kind in ("memory", "memmap", "memmap-random")
            if fits or kind != "memory"]
        for config, function, extra in runs:
            if config not in args.configs:
                continue
            try:
                records.append(common.isolated(function, name, args, *extra,
                                               fits))
            except RuntimeError as err:
                failures.append({"dataset": name, "config": config,
                                 "error": str(err)})
                print(f"{name} {config}: FAILED: {err}", flush=True)
                continue
            print(_line(records[-1]), flush=True)
    result = {"commit": commit, "args": vars(args), "disk": disk,
              "records": records, "failures": failures}
    result["targets"] = targets(records)
    markdown = report(result)
    path = common.write_results(result, markdown, "outofcore", args.out)
    print(markdown)
    print(f"results: {path}")
    return 0


def _line(record: dict) -> str:
    train, only = record["train"], record["loader"]
    text = (f"{record['dataset']} {record['config']}: "
            f"{train['batches']} batches, epoch "
            f"{train['seconds']['epoch']:.1f} s")
    if only is not None:
        text += f", loader-only {only['seconds']['epoch']:.1f} s"
    return (text + f", construct {record['construct_seconds']:.1f} s, "
            f"peak RSS {record['peak_rss_bytes'] / 1e9:.2f} GB")


if __name__ == "__main__":
    sys.exit(main())

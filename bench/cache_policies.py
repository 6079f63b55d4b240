"""Cache policies with features on disk, judged in the disk's units.

One epoch of GraphSAGE per configuration, one process: per layout of the
feature file (``file``, ``hot-first``), host budget and cache policy, an
`hmgraph.DataLoader` over the ``O_DIRECT`` storage tier, its trace
replayed under Belady's policy; the DGL baselines of `common.dgl_epoch`
once. Ratios come with construction seconds and amortized; targets T1-T5
at the 20 % host budget. Options, records and targets: bench/README.md.

Examples: ``python bench/cache_policies.py`` (synth-products, ~1 h a
layout); ``python bench/cache_policies.py --quick --root /tmp/hmg``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

POLICIES = ("none", "degree", "presample", "lru", "clock", "hmgraph")
LAYOUTS = ("file", "hot-first")
IN_MEMORY, FLOOR = "dgl in-memory", "dgl memmap floor"
BASELINES = {"in-memory": IN_MEMORY, "memmap-floor": FLOOR}
PREFETCH, WINDOW, PROFILE_BATCHES = 2, 4, 32
FULL = {"dataset": "synth-products", "batch_size": 1024,
        "max_batches": None, "out": "bench/results/cache_policies.json"}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 5,
         "out": "/tmp/cache_policies_quick.json"}
TARGET_HOST_BUDGET = "20%"
BYTES_VS_NONE_MAX, AMPLIFICATION_MAX, SECONDS_VS_MODEL_MAX = 0.70, 1.5, 1.25
VS_IN_MEMORY_MAX, VS_FLOOR_MIN = 1.5, 3.0


def parse_args(argv=None) -> argparse.Namespace:
    from hmgraph.args import fraction, positive_int
    from hmgraph.cache.budget import parse_budget
    from hmgraph.loader import STAGING_SHARE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_bench_arguments(parser, batch_size=None)
    add = parser.add_argument
    add("--dataset", help="default: synth-products; --quick: synth-tiny")
    add("--device-budget", default="5%",
        help="share of the feature bytes (5%%) or bytes with a unit")
    add("--host-budgets", default="10%,20%", type=common.names())
    add("--policies", default=",".join(POLICIES),
        type=common.names(POLICIES))
    add("--layouts", default=",".join(LAYOUTS), type=common.names(LAYOUTS))
    add("--baselines", default=",".join(BASELINES),
        type=common.names((*BASELINES, "none")),
        help="in-memory, memmap-floor, or none")
    add("--staging", type=fraction, default=None,
        help="share of the host budget staged for window read planning "
        f"(default: the loader's, {STAGING_SHARE:g})")
    add("--max-batches", type=positive_int, default=None,
        help="train on a seeded subset of max-batches x batch-size seeds "
        "(default: all; --quick: 5)")
    add("--out", help=f"JSON file (default: {FULL['out']}; --quick: "
        f"{QUICK['out']}); the markdown goes beside it")
    add("--quick", action="store_true",
        help="smoke run: synth-tiny, batch 128, 5 batches")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.baselines = [b for b in args.baselines if b != "none"]
    try:
        for text in (args.device_budget, *args.host_budgets):
            parse_budget(text, 1)
    except ValueError as err:
        parser.error(str(err))
    if not Path(args.root).is_dir() or not args.out.endswith(".json"):
        parser.error("--root must exist and --out end in .json")
    return args


def prepare_layout(name: str, dataset, seeds, args):
    """``(dataset, seeds, record)`` in a layout's ids.

    ``hot-first`` is what ``hmgraph train --layout hot-first`` builds
    (`hmgraph.train.make_sampler` on a view: features on disk, this
    epoch's seeds as the train split), timed: ``seconds`` is the profile
    and the rewrite (or the reuse of an earlier one).
    """
    from hmgraph.train import TrainConfig, make_sampler

    if name == "file":
        return dataset, seeds, {"name": name, "seconds": 0.0,
                                "path": str(dataset.feature_path)}
    graph = dataset.graph.local_var()
    graph.ndata.pop("feat", None)
    view = dataclasses.replace(dataset, graph=graph, features_on="disk",
                               split=dict(dataset.split, train=seeds))
    config = TrainConfig(
        dataset=args.dataset, root=str(args.root), features_on="disk",
        cache="hmgraph", layout=name, fanouts=list(args.fanouts),
        batch_size=args.batch_size, profile_batches=PROFILE_BATCHES,
        seed=args.seed)
    start = time.perf_counter()
    renumbered, _ = make_sampler(config, view)
    record = {"name": name, "seconds": time.perf_counter() - start,
              "reused": bool(renumbered.info.get("reused")),
              "path": str(renumbered.feature_path),
              "profile_batches": min(PROFILE_BATCHES, -(-seeds.numel()
                                                        // args.batch_size))}
    start = time.perf_counter()
    renumbered.graph.create_formats_()
    record["formats_seconds"] = time.perf_counter() - start
    return renumbered, renumbered.split["train"], record


def train_seeds(dataset, args):
    """The train split, or a seeded subset of ``max_batches`` batches."""
    import torch

    seeds = dataset.split["train"]
    keep = (args.max_batches or 0) * args.batch_size
    if not keep or keep >= seeds.numel():
        return seeds
    generator = torch.Generator().manual_seed(args.seed)
    return seeds[torch.randperm(seeds.numel(), generator=generator)[:keep]
                 .sort().values]


def run_dgl(dataset, seeds, args, memmap: bool) -> dict:
    """One epoch of `common.dgl_epoch`, in memory or over the memmap."""
    import dgl

    model, optimizer = common.new_model(dataset, args.hidden,
                                        len(args.fanouts), args.seed)
    rows = common.open_memmap(dataset.feature_path) if memmap \
        else dataset.features
    run = common.dgl_epoch(
        dataset.graph, seeds, dgl.dataloading.NeighborSampler(args.fanouts),
        rows, dataset.labels, model, optimizer, batch_size=args.batch_size,
        seed=args.seed, num_workers=args.dgl_workers,
        cold=dataset.feature_path if memmap else None,
        desc=FLOOR if memmap else IN_MEMORY)
    del rows
    useful = run["input_bytes"]
    return {
        "config": FLOOR if memmap else IN_MEMORY, "kind": "dgl",
        "policy": None, "layout": "file", "host_budget": None,
        "batches": run["batches"], "rows_requested": run["input_rows"],
        "hit_rate": {"device": 0.0, "host": 0.0 if memmap else 1.0,
                     "staged": 0.0, "storage": 1.0 if memmap else 0.0},
        "belady": None, "storage_rows_vs_belady": None,
        "storage": {"rows_read": run["input_rows"],
                    "bytes_read": run["read_bytes"], "useful_bytes": useful,
                    "amplification": run["read_bytes"] / max(useful, 1),
                    "io_requests": None, "seconds": None,
                    "model_seconds": None, "seconds_vs_model": None,
                    "source": "psutil io_counters read_bytes"}
        if memmap else None,
        "staging_rows": 0, "host_to_device_bytes": useful,
        "seconds": run["seconds"], "construct_seconds": 0.0,
        "layout_seconds": 0.0, "mean_loss": run["mean_loss"],
        "peak_rss_mb": common.peak_rss_bytes() / 2**20,
    }


def run_hmgraph(dataset, seeds, args, policy: str, device_budget: int,
                budget: str | None, host_budget: int, memo: dict,
                layout: dict) -> dict:
    """One epoch of `hmgraph.DataLoader` over the O_DIRECT storage tier;
    Belady on its trace (memoised by trace and capacity in ``memo``)."""
    import dgl

    import hmgraph

    config = f"{policy} / {layout['name']}"
    model, optimizer = common.new_model(dataset, args.hidden,
                                        len(args.fanouts), args.seed)
    start = time.perf_counter()
    loader = hmgraph.DataLoader(
        dataset.graph, seeds, dgl.dataloading.NeighborSampler(args.fanouts),
        features=dataset.feature_path, labels=dataset.labels,
        batch_size=args.batch_size, shuffle=True, seed=args.seed,
        cache=policy, device_budget_bytes=device_budget,
        host_budget_bytes=host_budget, prefetch=PREFETCH, window=WINDOW,
        profile_batches=PROFILE_BATCHES, staging=args.staging)
    construct = time.perf_counter() - start
    try:
        warm = loader.stats.storage and loader.stats.storage.as_dict()
        source = loader.cache.source
        dgl.seed(args.seed)  # every configuration samples the same batches
        loader.trace = []
        run = common.hmgraph_epoch(loader, model, optimizer, desc=config + (
            f" host {budget}" if budget else ""))
        plan, trace = loader.plan, loader.trace
    finally:
        loader.close()
    belady = belady_hit_rate(trace, plan.num_rows,
                             plan.device_rows + plan.host_rows, memo)
    stats, disk = run["stats"], getattr(source, "disk", None)
    cache = stats["cache"]
    rates = {tier: cache["hit_rate"].get(key, 0.0) for tier, key in (
        ("device", "device"), ("host", "host"), ("staged", "staged"),
        ("storage", "source"))}
    return {
        "config": config, "kind": "hmgraph", "policy": policy,
        "layout": layout["name"], "host_budget": budget,
        "host_budget_bytes": host_budget if budget else 0,
        "device_budget_bytes": device_budget if policy != "none" else 0,
        "batches": run["batches"], "rows_requested": cache["rows_requested"],
        "hit_rate": rates, "belady": belady,
        "storage_rows_vs_belady": rows_vs_belady(rates["storage"],
                                                 belady["hit_rate"]),
        "storage": stats.get("storage"), "staging_rows": plan.staging_rows,
        "host_to_device_bytes": cache["bytes"].get("host->device", 0),
        "seconds": run["seconds"], "construct_seconds": construct,
        "layout_seconds": layout["seconds"], "warm_storage": warm,
        "direct": bool(getattr(source, "direct", False)),
        "disk": disk.as_dict() if disk is not None else None,
        "plan": plan.as_dict(), "loader": stats,
        "mean_loss": run["mean_loss"],
        "peak_rss_mb": common.peak_rss_bytes() / 2**20,
    }


def belady_hit_rate(trace: list, num_rows: int, capacity: int,
                    memo: dict) -> dict:
    """Belady's hit rate on ``trace`` with ``capacity`` rows."""
    from hmgraph.cache.plan import replay
    from hmgraph.cache.policies import BeladyPolicy

    digest = hashlib.blake2b(digest_size=16)
    for ids in trace:
        digest.update(ids.numpy().tobytes() + b"|")
    key = (digest.hexdigest(), capacity)
    start, memoised = time.perf_counter(), key in memo
    if not memoised:
        policy = BeladyPolicy(num_rows, capacity) if capacity else None
        if policy is not None:
            policy.set_trace(trace)
        memo[key] = replay(policy, trace) if policy is not None else 0.0
    return {"capacity_rows": capacity, "hit_rate": memo[key],
            "seconds": time.perf_counter() - start, "memoised": memoised}


def rows_vs_belady(storage_rate: float, belady_rate: float) -> float | None:
    """Storage row reads over Belady's: ``(1 - hit) / (1 - belady_hit)``."""
    if belady_rate >= 1.0:
        return None if storage_rate > 0 else 1.0
    return storage_rate / (1.0 - belady_rate)


def add_ratios(records: list[dict], epochs: int) -> None:
    """Each record's epoch against both baselines (``vs_in_memory``: this
    / in-memory, ``vs_memmap_floor``: floor / this), each also amortized
    over ``epochs`` with the construction, and ``storage_vs_none``."""
    base = {r["config"]: r["seconds"]["epoch"] for r in records
            if r["kind"] == "dgl"}
    memory, floor = base.get(IN_MEMORY), base.get(FLOOR)
    none = {r["layout"]: r["storage"]["bytes_read"] for r in records
            if r["policy"] == "none" and r["storage"]}
    for r in records:
        epoch = r["seconds"]["epoch"]
        built = r["construct_seconds"] + r["layout_seconds"]
        r["vs_in_memory"] = memory and epoch / memory
        r["vs_in_memory_amortized"] = common.amortized(built, epoch, memory,
                                                       epochs)
        r["vs_memmap_floor"] = floor and epoch and floor / epoch
        slow = common.amortized(built, epoch, floor, epochs)
        r["vs_memmap_floor_amortized"] = slow and 1 / slow
        r["storage_vs_none"] = r["storage"] and none.get(r["layout"]) and \
            r["storage"]["bytes_read"] / none[r["layout"]]


def targets(records: list[dict], layouts: list[str], epochs: int) -> list:
    """T1-T3 and the epoch against both baselines, at the target budget;
    each note names the construction seconds (and amortized ratio)."""
    ours = {r["layout"]: r for r in records if r["policy"] == "hmgraph"
            and r["host_budget"] == TARGET_HOST_BUDGET}
    ours = {name: ours[name] for name in layouts if name in ours}

    def built(r, key=None):
        text = (f"build {r['layout_seconds']:.1f} s layout + "
                f"{r['construct_seconds']:.1f} s loader")
        value = r.get(f"{key}_amortized") if key else None
        return text + (f"; amortized over {epochs} epochs {value:.2f}"
                       if value is not None else "")

    ratios = {n: r["storage_vs_none"] for n, r in ours.items()
              if r["storage_vs_none"] is not None}
    best = min(ratios, key=ratios.get, default=None)
    at = f"host {TARGET_HOST_BUDGET}"
    rows = [common.target(
        "T1", f"{at}: hmgraph storage bytes / no-cache storage bytes, best "
        f"layout: {best or '-'}", ratios.get(best), "<=", BYTES_VS_NONE_MAX,
        "; ".join(f"{n} {r['storage_vs_none']:.3f}, {built(r)}"
                  for n, r in ours.items() if n in ratios) or None)]
    rows += [common.target(
        "T2", f"{at} {n}: hmgraph read amplification",
        r and (r["storage"] or {}).get("amplification"), "<=",
        AMPLIFICATION_MAX, r and built(r))
        for n, r in ((n, ours.get(n)) for n in layouts)]
    timed = [r for r in records if r["policy"] == "hmgraph"
             and (r["storage"] or {}).get("seconds_vs_model") is not None]
    worst = max(timed, key=lambda r: r["storage"]["seconds_vs_model"],
                default=None)
    rows.append(common.target(
        "T3", "every hmgraph configuration: storage seconds / model seconds"
        + (f", worst: {worst['config']} host {worst['host_budget']}"
           if worst else ""),
        worst and worst["storage"]["seconds_vs_model"], "<=",
        SECONDS_VS_MODEL_MAX, worst and f"{len(timed)} configurations"))
    for n in layouts:
        r = ours.get(n)
        rows += [common.target(
            "T4", f"{at} {n}: hmgraph epoch / in-memory epoch",
            r and r["vs_in_memory"], "<=", VS_IN_MEMORY_MAX,
            r and built(r, "vs_in_memory")), common.target(
            "T5", f"{at} {n}: memmap floor epoch / hmgraph epoch",
            r and r["vs_memmap_floor"], ">=", VS_FLOOR_MIN,
            r and built(r, "vs_memmap_floor"))]
    return rows


def report(result: dict) -> str:
    """Setup, disk model, the table, notes and the targets."""
    from hmgraph.cache.disk import DiskModel

    c, env, epochs = result["config"], result["environment"], \
        result["config"]["amortize_epochs"]
    rows = []
    for r in result["records"]:
        s, rate, b = r["storage"] or {}, r["hit_rate"], r["belady"]
        dgl = r["kind"] == "dgl"
        rows.append([
            r["config"], r["host_budget"] or "-",
            s.get("bytes_read") and s["bytes_read"] / 1e9,
            s.get("io_requests"), s.get("amplification"), s.get("seconds"),
            s.get("model_seconds"), s.get("seconds_vs_model"),
            r.get("storage_vs_none"), None if dgl else r["staging_rows"],
            *(100 * rate[t] for t in ("device", "host", "staged",
                                      "storage")),
            b and 100 * b["hit_rate"], r["storage_rows_vs_belady"],
            r["host_to_device_bytes"] / 1e9, r["seconds"]["epoch"],
            r.get("vs_in_memory"), r.get("vs_memmap_floor"),
            None if dgl else
            f"{r['layout_seconds']:.1f} + {r['construct_seconds']:.1f}",
            r.get("vs_in_memory_amortized")])
    staging = (f"{c['staging']:g}" if c["staging"] is not None else
               f"the loader's default ({c['staging_default']:g})")
    layouts = ", ".join(
        f"{n} (profile of {r['profile_batches']} batches and "
        f"{'a reused' if r['reused'] else 'a rewritten'} file: "
        f"{r['seconds']:.1f} s)" if n != "file" else "file (rows as stored)"
        for n, r in result["layouts"].items())
    keys = ("block_bytes", "iops", "bandwidth", "queue_depth", "device")
    disk = ("Disk model of the storage tier: " + DiskModel(
        **{k: c["disk_model"][k] for k in keys}).describe() + "; model "
        "seconds = requests / IOPS + bytes / bandwidth." if c["disk_model"]
        else "Disk model: none yet (no storage-tier run).")
    loads = [r["loadavg"][when][0] for r in result["records"]
             for when in ("before", "after")]
    return "\n".join([
        "# Cache policies", "",
        f"{c['dataset']} ({c['train_seeds']:,} train seeds, "
        f"{c['batches_per_epoch']} batches of {c['batch_size']}), "
        f"NeighborSampler({','.join(map(str, c['fanouts']))}), sage hidden "
        f"{c['hidden']}, one epoch per configuration; features "
        f"{c['feature_bytes'] / 1e9:.3g} GB on disk (O_DIRECT: "
        f"{env['o_direct']}); device budget {c['device_budget']} "
        f"({c['device_budget_bytes'] / 1e6:.1f} MB); prefetch "
        f"{c['prefetch']}, window {c['window']}, {c['profile_batches']} "
        f"profiling batches, staging {staging} of the host budget; "
        f"layouts: {layouts or 'none yet'}; DGL's loader with "
        f"num_workers={c['dgl_workers']}; torch {env['torch']}, dgl "
        f"{env['dgl']}, {env['torch_num_threads']} threads, "
        f"{env['cpu_count']} CPUs.", "", disk, "",
        common.markdown_table(
            ["config", "host budget", "storage GB", "I/O requests",
             "read amp (x)", "storage s", "model s", "storage / model (x)",
             "bytes vs none (x)", "staging rows", "device hit % (rows)",
             "host hit % (rows)", "staged hit % (rows)",
             "storage hit % (rows)", "Belady hit %",
             "storage rows vs Belady (x)", "host->device GB", "epoch s",
             "vs in-memory (x)", "vs memmap floor (x faster)",
             "build s (layout + loader)",
             f"vs in-memory amortized over {epochs} epochs (x)"], rows), "",
        "Storage columns are per epoch, in the disk's units: bytes and I/O "
        "requests (preadv calls) of the storage tier, read amplification "
        "(bytes read / bytes of the rows served), storage seconds against "
        "the disk model's for the same requests and bytes, bytes vs none "
        "(/ the no-cache run's in the same layout); the static fill's "
        "reads are left out (`warm_storage`). Hit rates are shares of each "
        "batch's unique input rows per tier (staged: rows an earlier "
        "batch's block reads brought along); Belady: the optimal offline "
        "policy on the run's own trace with the plan's device + host rows; "
        "storage rows vs Belady is (1 - hit) / (1 - Belady hit). Epoch "
        "seconds exclude construction: build s is the layout's (profile "
        "and rewrite, once per layout) + the loader's (profiling, plan, "
        "static fill); amortized: (build + N epochs) / N in-memory epochs. "
        "The memmap floor's pages are dropped once before its epoch (bytes "
        "from the process's block-device reads, requests unknown); "
        "host->device counts every row not served by the device tier."
        + (f" The machine is shared: its 1-minute load average was "
           f"{min(loads):.1f} to {max(loads):.1f} around the runs."
           if loads else ""), "", "## Targets", "",
        common.targets_table(result["targets"]), ""])


def main(argv=None) -> int:
    import gc

    from hmgraph import datasets
    from hmgraph.cache.budget import parse_budget
    from hmgraph.loader import STAGING_SHARE

    args = parse_args(argv)
    common.watch_memory()
    start = time.perf_counter()
    dataset = datasets.load(  # rows in memory only for that baseline
        args.dataset, args.root, verify=False, features_on="memory"
        if "in-memory" in args.baselines else "disk")
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    dataset.graph.create_formats_()
    prepare_seconds = time.perf_counter() - start
    seeds = train_seeds(dataset, args)
    feature_bytes = dataset.manifest.data_bytes
    device_budget = parse_budget(args.device_budget, feature_bytes)
    host_budgets = {b: parse_budget(b, feature_bytes)
                    for b in args.host_budgets}
    result = {
        "commit": common.commit(),
        "config": dict(
            {k: v for k, v in vars(args).items() if k != "out"},
            feature_path=str(dataset.feature_path),
            feature_bytes=feature_bytes, nodes=dataset.num_nodes,
            edges=dataset.graph.num_edges(), feat_dim=dataset.feat_dim,
            train_seeds=int(seeds.numel()),
            batches_per_epoch=-(-seeds.numel() // args.batch_size),
            device_budget_bytes=device_budget, host_budgets=host_budgets,
            staging_default=STAGING_SHARE, disk_model=None,
            target_host_budget=TARGET_HOST_BUDGET, model="sage",
            num_layers=len(args.fanouts), dropout=common.DROPOUT,
            lr=common.LR, epochs=1, prefetch=PREFETCH, window=WINDOW,
            profile_batches=PROFILE_BATCHES, device="cpu",
            load_seconds=load_seconds, prepare_seconds=prepare_seconds),
        "environment": dict(common.environment(), o_direct=None),
        "layouts": {}, "records": [], "targets": [],
    }
    print(f"{args.dataset}: loaded in {load_seconds:.1f} s, "
          f"{result['config']['batches_per_epoch']} batches per epoch, "
          f"features {feature_bytes / 1e9:.2f} GB", flush=True)
    # Layouts before any epoch: after DGL's own loader has sampled in this
    # process, the profile does not always repeat (no reuse of the file).
    layouts = {}
    for name in args.layouts:
        layouts[name] = prepare_layout(name, dataset, seeds, args)
        result["layouts"][name] = layouts[name][2]
    runs = [(BASELINES[name], None, "file") for name in args.baselines]
    for layout in args.layouts:
        runs += [("none", None, layout)] if "none" in args.policies else []
        runs += [(p, b, layout) for b in args.host_budgets
                 for p in args.policies if p != "none"]
    memo = {}
    for name, budget, layout in runs:
        before = os.getloadavg()
        if name in (IN_MEMORY, FLOOR):
            record = run_dgl(dataset, seeds, args, memmap=name == FLOOR)
        else:
            data, layout_seeds, built = layouts[layout]
            record = run_hmgraph(data, layout_seeds, args, name,
                                 device_budget, budget,
                                 host_budgets.get(budget, 0), memo, built)
            result["environment"]["o_direct"] = record["direct"]
            result["config"]["disk_model"] = record["disk"]
        record["loadavg"] = {"before": before, "after": os.getloadavg()}
        result["records"].append(record)
        gc.collect()
        add_ratios(result["records"], args.amortize_epochs)
        result["targets"] = targets(result["records"], args.layouts,
                                    args.amortize_epochs)
        common.write_results(result, report(result), args.out)
        print(f"{record['config']} host {budget or '-'}: epoch "
              f"{record['seconds']['epoch']:.2f} s", flush=True)
    print(report(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

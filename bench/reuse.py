"""Batch reuse against no reuse and a static cache, by seed order.

One training epoch of GraphSAGE per configuration (`common.loader_epoch`,
features read with ``O_DIRECT``, no host cache), seeds **shuffled** or in
**cluster** order (`cluster_order`, METIS parts one per batch): no reuse,
one-level and two-level reuse within ``--device-budget``, two-level reuse
with a static ``presample`` tier in the rest of that budget, and the
static tier alone in the device memory the latter takes. Targets and
records: bench/README.md. ``python bench/reuse.py --quick --root
/tmp/hmg``.
"""

from __future__ import annotations

import argparse
import gc
import sys

import common

from hmgraph.args import budget_text

ORDERS = ("shuffled", "cluster")
NO_REUSE, ONE_LEVEL, TWO_LEVEL, TWO_STATIC, STATIC = (
    "no reuse", "one-level", "two-level", "two-level + static",
    "static cache")
#: (configuration, reuse, cache) in run order: the static cache's device
#: budget is the device memory two-level + static takes.
CONFIGS = ((NO_REUSE, "none", None), (ONE_LEVEL, "one-level", None),
           (TWO_LEVEL, "two-level", None),
           (TWO_STATIC, "two-level", "presample"),
           (STATIC, "none", "presample"))
GROUP_SIZE = 4  # clusters per group, as `hmgraph train --group-size`
PREFETCH = 2
EPOCH_RATIO_MAX, H2D_RATIO_MAX, REUSE_SHARE_MAX_PERCENT = 1.05, 0.5, 5.0
DEFAULTS = {"dataset": "synth-products", "batch_size": 1024,
            "out": "bench/results/reuse.json"}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 5,
         "out": "/tmp/reuse_quick.json"}
COLUMNS = ["seed order", "configuration", "device memory MB", "H2D GB",
           "H2D vs no reuse (x)", "storage GB", "reuse % of rows",
           "reuse work % of epoch", "reuse CPU % of epoch", "epoch s",
           "vs no reuse (x)", "construct s", "amortized vs no reuse (x)"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_quick_arguments(
        parser, DEFAULTS, QUICK, "batches per epoch: a seeded subset of the "
        "train split (shuffled), the first seeds of the order (cluster)")
    parser.add_argument("--device-budget", default="60%", type=budget_text,
                        help="device budget of the reuse runs: a share of "
                        "the feature bytes or bytes with a unit")
    return common.finish_args(parser, parser.parse_args(argv), DEFAULTS,
                              QUICK)


def run_config(dataset, seeds, args, order, config, reuse, cache,
               budget) -> dict:
    """One epoch of one configuration; its JSON record."""
    run = common.loader_epoch(
        dataset, seeds, args, f"{order} {config}",
        shuffle=order == "shuffled", cache=cache, device_budget_bytes=budget,
        host_budget_bytes=0, prefetch=PREFETCH, reuse=reuse,
        profile_batches=-(-seeds.numel() // args.batch_size))
    (plan,) = run["loader"].plan.values()  # the one node type's
    (feature,) = run["loader"].feature.values()
    plan = plan.as_dict()
    stats, epoch = run["stats"], run["seconds"]["epoch"]
    cached, reused = stats.get("cache"), stats.get("reuse")
    levels = plan["reuse_levels"]
    return {
        "order": order, "config": config, "reuse": reuse, "cache": cache,
        "batches": run["batches"], "device_budget_bytes": budget,
        "device_bytes_used": plan["reuse_bytes"] + plan["device_bytes"],
        "reuse_bytes_peak": reused and reused["peak_bytes"],
        "reuse_capped_by_budget": bool(levels) and plan["reuse_rows"] == (
            budget - plan["reuse_table_bytes"]) // plan["row_bytes"] // levels,
        # Every row not served on the device crosses to it.
        "host_to_device_bytes": cached["bytes"]["host->device"] if cached
        else stats["rows_requested"] * plan["row_bytes"],
        "storage": stats.get("storage"), "warm_storage": run["warm_storage"],
        "reuse_stats": reused, "reuse_rate": reused and reused["reuse_rate"],
        # `BatchReuse.engine`: compiled kernels on a CPU device.
        "reuse_engine": reused and feature.engine,
        "dedup_share_percent": reused and 100.0 * reused["seconds"] / epoch,
        "dedup_cpu_share_percent": reused and
        100.0 * reused["cpu_seconds"] / epoch,
        "seconds": run["seconds"], "mean_loss": run["mean_loss"],
        "construct_seconds": run["construct_seconds"], "plan": plan,
        "direct": bool(getattr(run["source"], "direct", False)),
        "loader": stats, "peak_rss_mb": common.peak_rss_bytes() / 2**20,
    }


def find(records: list[dict], order: str, config: str) -> dict | None:
    return next((r for r in records if r["order"] == order
                 and r["config"] == config), None)


def add_ratios(records: list[dict], epochs: int) -> None:
    """Each record's host->device bytes and epoch against no reuse's of the
    same order, and the epoch amortized with its construction."""
    for r in records:
        base = find(records, r["order"], NO_REUSE)
        h2d, epoch = base["host_to_device_bytes"], base["seconds"]["epoch"]
        r["h2d_vs_no_reuse"] = r["host_to_device_bytes"] / h2d if h2d else None
        r["epoch_vs_no_reuse"] = r["seconds"]["epoch"] / epoch
        r["amortized_vs_no_reuse"] = common.amortized(
            r["construct_seconds"], r["seconds"]["epoch"], epoch, epochs)


def targets(records: list[dict]) -> list[dict]:
    two, static = (find(records, "cluster", c) for c in (TWO_STATIC, STATIC))
    rows = [
        common.target(3, f"cluster {TWO_STATIC}: epoch / no reuse's",
                      two and two["epoch_vs_no_reuse"], "<=",
                      EPOCH_RATIO_MAX),
        common.target(3, f"cluster {TWO_STATIC}: host->device bytes / no "
                      "reuse's", two and two["h2d_vs_no_reuse"], "<=",
                      H2D_RATIO_MAX),
        common.target(3, f"cluster {TWO_STATIC}: host->device bytes / the "
                      "static cache's (equal device memory, profiled over "
                      "the whole order)", two and static and
                      two["host_to_device_bytes"]
                      / max(1, static["host_to_device_bytes"]), "<=", 1.0)]
    for order in ORDERS:
        for config in (ONE_LEVEL, TWO_LEVEL, TWO_STATIC):
            r = find(records, order, config)
            rows.append(common.target(
                "-", f"{order} {config}: reuse work, % of the epoch",
                r and r["dedup_share_percent"], "<=",
                REUSE_SHARE_MAX_PERCENT))
            rows.append(common.target(
                "-", f"{order} {config}: reuse CPU seconds, % of the epoch",
                r and r.get("dedup_cpu_share_percent"), "<=",
                REUSE_SHARE_MAX_PERCENT))
    return rows


def report(result: dict) -> str:
    c, env, records = result["config"], result["environment"], \
        result["records"]
    rows = [[r["order"], r["config"], r["device_bytes_used"] / 1e6,
             r["host_to_device_bytes"] / 1e9, r["h2d_vs_no_reuse"],
             (r["storage"] or {}).get("bytes_read", 0) / 1e9,
             r["reuse_rate"] and 100 * r["reuse_rate"],
             r["dedup_share_percent"], r["dedup_cpu_share_percent"],
             r["seconds"]["epoch"],
             r["epoch_vs_no_reuse"], r["construct_seconds"],
             r["amortized_vs_no_reuse"]] for r in records]
    held = "; ".join(
        f"{r['order']} {r['config']} {r['reuse_bytes_peak'] / 1e6:.1f} of "
        f"{r['plan']['reuse_bytes'] / 1e6:.1f} MB" for r in records
        if r["reuse_bytes_peak"] is not None)
    engines = ", ".join(sorted({r["reuse_engine"] for r in records
                                if r.get("reuse_engine")}))
    cap = "" if c["max_batches"] is None else \
        f", capped at {c['max_batches']} batches"
    return "\n".join([
        "# Batch reuse", "",
        f"{c['dataset']} ({c['train_seeds']:,} train seeds, "
        f"{c['batches_per_epoch']} batches of {c['batch_size']}{cap}), "
        f"NeighborSampler({','.join(map(str, c['fanouts']))}), sage hidden "
        f"{c['hidden']}, one epoch per configuration on the CPU; features "
        f"{c['feature_bytes'] / 1e9:.2f} GB on disk (O_DIRECT: "
        f"{env['o_direct']}); reuse device budget {c['device_budget']} "
        f"({c['device_budget_bytes'] / 1e6:.1f} MB), host budget 0; "
        f"prefetch {PREFETCH}; every loader profiles the whole epoch in its"
        f" own order; {common.environment_text(env)}.", "",
        common.markdown_table(COLUMNS, rows), "",
        "Device memory: reuse buffers and id table, and the static tier's "
        "rows. H2D: rows not served on the device. Storage: feature file "
        "bytes read in the epoch (static fill: `warm_storage`). Reuse work:"
        " batch reuse's time but the reads below it (which write the rest "
        "of a batch into it where the cache below reads in place, "
        "`FeatureCache.read_into`), in the fetch thread, over the epoch "
        f"(engine: {engines or '-'}); reuse CPU: the fetch thread's CPU "
        "seconds in that same work (beside a model training on both "
        "cores, the wall figure also counts its waits for a core). "
        "Construct: profiling, "
        "plan, static fill; "
        "amortized: (construct + N x epoch) / (N x no reuse's epoch), N = "
        f"{c['amortize_epochs']}.", "",
        f"Reuse buffers, most held after a batch, of what the plan "
        f"reserved: {held or 'none ran'}.", "",
        common.metis_text(result["metis"]), "", "## Targets", "",
        common.targets_table(result["targets"]), ""])


def main(argv=None) -> int:
    from hmgraph.cache.budget import parse_budget
    from hmgraph.samplers.cluster import cluster_order

    args = parse_args(argv)
    dataset, facts = common.load(args.dataset, args.root)
    budget = parse_budget(args.device_budget, facts["feature_bytes"])
    train = dataset.split["train"]
    parts, metis = common.metis_parts(
        dataset, args.root, -(-train.numel() // args.batch_size))
    print(common.metis_text(metis), file=sys.stderr)
    kept = min(train.numel(), (args.max_batches or train.numel())
               * args.batch_size)
    result = {"config": common.settings(
        args, **facts, train_seeds=int(train.numel()), seeds_per_epoch=kept,
        batches_per_epoch=-(-kept // args.batch_size),
        device_budget_bytes=budget, host_budget_bytes=0,
        orders=list(ORDERS), configurations=[c[0] for c in CONFIGS],
        model="sage", dropout=common.DROPOUT, lr=common.LR,
        prefetch=PREFETCH, group_size=GROUP_SIZE,
        profile_batches="the epoch's"),
        "environment": common.environment(), "metis": metis,
        "records": [], "targets": []}
    records = result["records"]
    for order in ORDERS if parts is not None else ORDERS[:1]:
        if order == "shuffled":  # a seeded subset with --max-batches
            ordered = common.seeded_subset(train, args.max_batches,
                                           args.batch_size, args.seed)
        else:  # the order's first seeds with --max-batches
            ordered = cluster_order(train, parts, GROUP_SIZE, args.seed)[:kept]
        for config, reuse, cache in CONFIGS:
            record = run_config(
                dataset, ordered, args, order, config, reuse, cache,
                find(records, order, TWO_STATIC)["device_bytes_used"]
                if config == STATIC else budget)
            result["environment"].setdefault("o_direct", record["direct"])
            records.append(record)
            gc.collect()
            add_ratios(records, args.amortize_epochs)
            result["targets"] = targets(records)
            common.write_results(result, report(result), args.out)
            print(f"{order} {config}: epoch {record['seconds']['epoch']:.1f}"
                  f" s, H2D {record['host_to_device_bytes'] / 1e9:.2f} GB",
                  file=sys.stderr)
    common.finish(result, report(result), args.out)
    return 0 if parts is not None else 1


if __name__ == "__main__":
    sys.exit(main())

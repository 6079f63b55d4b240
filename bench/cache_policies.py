"""Cache policies with features on disk, judged in the disk's units.

One epoch per layout, host budget, cache policy and lookahead window,
Belady's policy on its trace, and the DGL baselines once; targets T1-T5
at the 20 % host budget, and on synth-papers issue 34's storage seconds
and amplification (bench/README.md).
``python bench/cache_policies.py --quick``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time

import common
import optimum

from hmgraph.args import budget_text, fraction, name_list, positive_int
from hmgraph.cache.budget import parse_budget
from hmgraph.cache.plan import belady_policy, replay
from hmgraph.loader import STAGING_SHARE

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
#: Issue 34 on synth-papers: hmgraph's storage seconds / no cache's, and
#: its read amplification.
PAPERS_SECONDS_VS_NONE_MAX, PAPERS_AMPLIFICATION_MAX = 0.3, 2.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_quick_arguments(parser, FULL, QUICK, "train on a seeded "
                               "subset of max-batches x batch-size seeds")
    add = parser.add_argument
    add("--device-budget", default="5%", type=budget_text,
        help="share of the feature bytes (5%%) or bytes with a unit")
    add("--host-budgets", default="10%,20%",
        type=name_list(check=budget_text))
    add("--policies", default=",".join(POLICIES),
        type=name_list(POLICIES))
    add("--layouts", default=",".join(LAYOUTS), type=name_list(LAYOUTS))
    add("--baselines", default=",".join(BASELINES),
        type=name_list((*BASELINES, "none")),
        help="in-memory, memmap-floor, or none")
    add("--windows", default=str(WINDOW), type=name_list(check=window),
        help=f"lookahead windows of the cache policies, batches, or auto "
        f"(the loader's default: planned; default {WINDOW}); the targets "
        f"read the first")
    add("--staging", type=fraction, default=None,
        help="share of the host budget staged for window read planning "
        f"(default: the loader's, {STAGING_SHARE:g})")
    args = common.finish_args(parser, parser.parse_args(argv), FULL, QUICK)
    args.baselines = [b for b in args.baselines if b != "none"]
    return args


def window(text: str) -> int | None:
    """A lookahead window: batches, or ``auto`` (None: planned)."""
    return None if text == "auto" else positive_int(text)


def window_name(window: int | None) -> str:
    """``window``'s name in configs and tables."""
    return "auto" if window is None else str(window)


def prepare_layout(name: str, dataset, seeds, args):
    """``(dataset, seeds, profile, record)`` in a layout's ids.

    ``hot-first`` is what ``hmgraph train --layout hot-first`` builds
    (`common.hot_first_layout`), timed: ``seconds`` is the profile and
    the rewrite (or the reuse of an earlier one); its loaders plan from
    its profile, as training's do. ``file``: the rows as stored, no
    profile given.
    """
    if name == "file":
        return dataset, seeds, None, {"name": name, "seconds": 0.0}
    return common.hot_first_layout(args.dataset, dataset, seeds, args,
                                   PROFILE_BATCHES)


def run_dgl(dataset, seeds, args, memmap: bool) -> dict:
    """One epoch of `common.dgl_epoch`, in memory or over the memmap; no
    ``policy``, ``host_budget``, ``belady`` or ``staging_rows``."""
    config = FLOOR if memmap else IN_MEMORY
    run, alone = common.dgl_baseline(
        dataset, args, "memmap" if memmap else "memory", seeds=seeds,
        desc=config, loader_only=True)
    useful = run["input_bytes"]
    return {
        "config": config, "kind": "dgl", "layout": "file",
        "batches": run["batches"], "rows_requested": run["input_rows"],
        "hit_rate": {"source" if memmap else "host": 1.0},
        "storage": {"bytes_read": run["read_bytes"], "useful_bytes": useful,
                    "amplification": run["read_bytes"] / max(useful, 1),
                    "source": "psutil io_counters read_bytes"}
        if memmap else None,
        "host_to_device_bytes": useful, "seconds": run["seconds"],
        "loader_only_seconds": alone["seconds"]["epoch"],
        "construct_seconds": 0.0, "layout_seconds": 0.0,
        "mean_loss": run["mean_loss"],
        "peak_rss_mb": common.peak_rss_bytes() / 2**20,
    }


def run_hmgraph(dataset, seeds, args, policy: str, device_budget: int,
                budget: str | None, host_budget: int, memo: dict,
                layout: dict, profile=None, window: int | None = WINDOW
                ) -> dict:
    """One epoch of `hmgraph.DataLoader` over the O_DIRECT storage tier;
    Belady on its trace (memoised by trace and capacity in ``memo``)."""
    config = f"{policy} / {layout['name']}" + (
        f" / window {window_name(window)}" if window != WINDOW else "")
    run = common.loader_epoch(
        dataset, seeds, args, config + (f" host {budget}" if budget else ""),
        trace=True, shuffle=True, cache=policy,
        device_budget_bytes=device_budget, host_budget_bytes=host_budget,
        prefetch=PREFETCH, window=window, profile_batches=PROFILE_BATCHES,
        staging=args.staging, loader_only=True, profile=profile)
    (plan,), trace = run["loader"].plan.values(), run["loader"].trace
    belady = belady_hit_rate(trace, plan.num_rows,
                             plan.held_rows, memo)
    budget_rows = (device_budget + host_budget) // plan.row_bytes
    optimum = None if policy == "none" else offline_optimum(
        trace, run["source"], plan.num_rows, budget_rows, memo)
    stats, source = run["stats"], run["source"]
    cache, disk = stats["cache"], getattr(source, "disk", None)
    return {
        "config": config, "kind": "hmgraph", "policy": policy,
        "layout": layout["name"], "host_budget": budget,
        "window": window_name(window), "planned_window": plan.window,
        "planned_policy": plan.policy,
        "batches": run["batches"], "rows_requested": cache["rows_requested"],
        "hit_rate": cache["hit_rate"], "belady": belady,
        "optimum": optimum,
        "storage_rows_vs_belady": rows_vs_belady(
            cache["hit_rate"].get("source", 0.0), belady["hit_rate"]),
        "storage": stats.get("storage"), "staging_rows": plan.staging_rows,
        "host_to_device_bytes": cache["bytes"].get("host->device", 0),
        "seconds": run["seconds"],
        "loader_only_seconds": run["loader_only"]["seconds"]["epoch"],
        "construct_seconds": run["construct_seconds"],
        "layout_seconds": layout["seconds"],
        "warm_storage": run["warm_storage"],
        "direct": bool(getattr(source, "direct", False)),
        "disk": disk.as_dict() if disk is not None else None,
        "plan": plan.as_dict(), "loader": stats,
        "mean_loss": run["mean_loss"],
        "peak_rss_mb": common.peak_rss_bytes() / 2**20,
    }


def trace_digest(trace: list) -> str:
    """A key of a trace's batches of ids, for memoising replays."""
    digest = hashlib.blake2b(digest_size=16)
    for ids in trace:
        digest.update(ids.numpy().tobytes() + b"|")
    return digest.hexdigest()


def belady_hit_rate(trace: list, num_rows: int, capacity: int,
                    memo: dict) -> dict:
    """Belady's hit rate on ``trace`` with ``capacity`` rows."""
    key = (trace_digest(trace), capacity)
    start, memoised = time.perf_counter(), key in memo
    if not memoised:
        memo[key] = replay(belady_policy(trace, num_rows, capacity),
                           trace) if capacity else 0.0
    return {"capacity_rows": capacity, "hit_rate": memo[key],
            "seconds": time.perf_counter() - start, "memoised": memoised}


def offline_optimum(trace: list, source, num_rows: int, capacity: int,
                    memo: dict) -> dict | None:
    """What no cache policy in this budget misses less than: Belady,
    knowing the epoch (warmed with its first-asked rows, as static
    policies are with their profiled ones), with every budgeted byte a
    row (no bookkeeping, no staging area), its misses read as the
    storage tier reads (its gap rule, priced by its disk model:
    `optimum.priced`), against every requested row read the same way
    (no cache). A bound, not a target: an online policy
    does not know the epoch. None without a disk model."""
    if getattr(source, "disk", None) is None or not trace:
        return None
    key = (trace_digest(trace), capacity, "optimum")
    if key not in memo:
        batches = [ids.numpy() for ids in trace]
        hit_rate, missed = optimum.belady_misses(batches, num_rows,
                                                 capacity)
        gap = optimum.tier_gap(source)
        ours = optimum.priced(source, missed, gap)
        none = optimum.priced(source, batches, gap)["model_seconds"]
        memo[key] = {"capacity_rows": capacity, "hit_rate": hit_rate,
                     "model_seconds": ours["model_seconds"],
                     "none_model_seconds": none,
                     "seconds_vs_none": ours["model_seconds"] / none
                     if none else None,
                     "amplification": ours["amplification"]}
    return memo[key]


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
    alone = next((r.get("loader_only_seconds") for r in records
                  if r["config"] == IN_MEMORY), None)
    none = {r["layout"]: r["storage"]["bytes_read"] for r in records
            if r.get("policy") == "none" and r["storage"]}
    for r in records:
        epoch = r["seconds"]["epoch"]
        built = r["construct_seconds"] + r["layout_seconds"]
        r["vs_in_memory"] = memory and epoch / memory
        r["loader_only_vs_in_memory"] = alone and \
            r.get("loader_only_seconds") and r["loader_only_seconds"] / alone
        r["vs_in_memory_amortized"] = common.amortized(built, epoch, memory,
                                                       epochs)
        r["vs_memmap_floor"] = floor and epoch and floor / epoch
        slow = common.amortized(built, epoch, floor, epochs)
        r["vs_memmap_floor_amortized"] = slow and 1 / slow
        r["storage_vs_none"] = r["storage"] and none.get(r["layout"]) and \
            r["storage"]["bytes_read"] / none[r["layout"]]


def targets(records: list[dict], layouts: list[str], epochs: int,
            window: int | None = WINDOW) -> list:
    """T1-T3 and the epoch against both baselines and no cache, at the
    target budget and ``window``; each note names the construction
    seconds (and amortized ratio)."""
    ours = {r["layout"]: r for r in records if r.get("policy") == "hmgraph"
            and r["host_budget"] == TARGET_HOST_BUDGET
            and str(r.get("window", WINDOW)) == window_name(window)}
    none = {r["layout"]: r["seconds"]["epoch"] for r in records
            if r.get("policy") == "none"}

    def built(r, key=None):
        return common.built_note(
            f"build {r['layout_seconds']:.1f} s layout + "
            f"{r['construct_seconds']:.1f} s loader", epochs,
            r.get(f"{key}_amortized") if key else None)

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
    timed = [r for r in records if r.get("policy") == "hmgraph"
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
            r and built(r, "vs_memmap_floor")), common.target(
            "33-T4", f"{at} {n}: hmgraph epoch / no-cache epoch",
            r and none.get(n) and r["seconds"]["epoch"] / none[n], "<=",
            1.0, r and built(r))]
    return rows


def papers_targets(records: list[dict], layouts: list[str]) -> list:
    """Issue 34's target 4 (synth-papers, host 20 %): hmgraph's storage
    seconds against no cache's, and its read amplification."""
    none = {r["layout"]: r for r in records if r.get("policy") == "none"}
    rows = []
    for r in records:
        if r.get("policy") != "hmgraph" \
                or r["host_budget"] != TARGET_HOST_BUDGET:
            continue
        base = none.get(r["layout"])
        storage = r["storage"] or {}
        ratio = storage.get("seconds", 0.0) / base["storage"]["seconds"] \
            if base and (base["storage"] or {}).get("seconds") else None
        best = r.get("optimum") or {}
        rows += [common.target(
            "I34-4", f"{r['config']}: storage seconds / no cache's",
            ratio, "<=", PAPERS_SECONDS_VS_NONE_MAX, (
                f"offline optimum {best['seconds_vs_none']:.3f}: "
                f"Belady knowing the epoch, the whole budget as rows, "
                f"{best['capacity_rows']:,} ({100 * best['hit_rate']:.1f}"
                f"% hits), modelled") if best else None), common.target(
            "I34-4", f"{r['config']}: read amplification",
            storage.get("amplification"), "<=", PAPERS_AMPLIFICATION_MAX,
            f"offline optimum's {best['amplification']:.2f}" if best
            else None)]
    return rows


def report(result: dict) -> str:
    """Setup, disk model, the table, notes and the targets."""
    c, env, epochs = result["config"], result["environment"], \
        result["config"]["amortize_epochs"]
    rows = []
    for r in result["records"]:
        s, rate, b = r["storage"] or {}, r["hit_rate"], r.get("belady")
        planned = r.get("window") == "auto" and \
            f" (planned: {r['planned_policy']}, window {r['planned_window']})"
        rows.append([
            r["config"] + (planned or ""), r.get("host_budget") or "-",
            s.get("bytes_read") and s["bytes_read"] / 1e9,
            s.get("io_requests"), s.get("amplification"), s.get("seconds"),
            s.get("model_seconds"), s.get("seconds_vs_model"),
            r.get("storage_vs_none"), r.get("staging_rows"),
            *(100 * rate.get(t, 0.0) for t in ("device", "host", "staged",
                                               "source")),
            b and 100 * b["hit_rate"], r.get("storage_rows_vs_belady"),
            r["host_to_device_bytes"] / 1e9, r["seconds"]["epoch"],
            r.get("vs_in_memory"), r.get("loader_only_seconds"),
            r.get("loader_only_vs_in_memory"), r.get("vs_memmap_floor"),
            None if r["kind"] == "dgl" else
            f"{r['layout_seconds']:.1f} + {r['construct_seconds']:.1f}",
            r.get("vs_in_memory_amortized")])
    staging = (f"{c['staging']:g}" if c["staging"] is not None else
               f"the loader's default ({c['staging_default']:g})")
    layouts = ", ".join(
        f"{n} (profile of {r['profile_batches']} batches and "
        f"{'a reused' if r['reused'] else 'a rewritten'} file: "
        f"{r['seconds']:.1f} s)" if n != "file" else "file (rows as stored)"
        for n, r in result["layouts"].items())
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
        f"{c['prefetch']}, windows "
        f"{', '.join(map(window_name, c.get('windows', [WINDOW])))} "
        f"(targets at {c['window']}; auto: the loader's default, planned), "
        f"{c['profile_batches']} "
        f"profiling batches, staging {staging} of the host budget; "
        f"layouts: {layouts or 'none yet'}; DGL's loader with "
        f"num_workers={c['dgl_workers']}; {common.environment_text(env)}.",
        "", "Disk model of the storage tier: " + (
            common.disk_text(c["disk_model"]) if c["disk_model"] else
            "none yet (no storage-tier run)") + ".", "",
        common.markdown_table(
            ["config", "host budget", "storage GB", "I/O requests",
             "read amp (x)", "storage s", "model s", "storage / model (x)",
             "bytes vs none (x)", "staging rows", "device hit % (rows)",
             "host hit % (rows)", "staged hit % (rows)",
             "storage hit % (rows)", "Belady hit %",
             "storage rows vs Belady (x)", "host->device GB", "epoch s",
             "vs in-memory (x)", "loader only s",
             "loader only vs in-memory's (x)", "vs memmap floor (x faster)",
             "build s (layout + loader)",
             f"vs in-memory amortized over {epochs} epochs (x)"], rows), "",
        "Columns explained in bench/README.md (cache_policies.py)."
        + (f" Load average {min(loads):.1f} to {max(loads):.1f} around the "
           "runs." if loads else ""), "", "## Targets", "",
        common.targets_table(result["targets"]), ""])


def main(argv=None) -> int:
    args = parse_args(argv)
    dataset, facts = common.load(  # rows in memory only for that baseline
        args.dataset, args.root, features_on="memory"
        if "in-memory" in args.baselines else "disk")
    seeds = common.seeded_subset(dataset.split["train"], args.max_batches,
                                 args.batch_size, args.seed)
    feature_bytes = dataset.manifest.data_bytes
    device_budget = parse_budget(args.device_budget, feature_bytes)
    host_budgets = {b: parse_budget(b, feature_bytes)
                    for b in args.host_budgets}
    result = {
        "config": common.settings(
            args, **facts,
            train_seeds=int(seeds.numel()),
            batches_per_epoch=-(-seeds.numel() // args.batch_size),
            device_budget_bytes=device_budget, host_budgets=host_budgets,
            staging_default=STAGING_SHARE, disk_model=None,
            target_host_budget=TARGET_HOST_BUDGET, model="sage",
            num_layers=len(args.fanouts), dropout=common.DROPOUT,
            lr=common.LR, epochs=1, prefetch=PREFETCH,
            window=window_name(args.windows[0]),
            profile_batches=PROFILE_BATCHES, device="cpu"),
        "environment": dict(common.environment(), o_direct=None),
        "layouts": {}, "records": [], "targets": [],
    }
    # Layouts before any epoch: after DGL's own loader has sampled in this
    # process, the profile does not always repeat (no reuse of the file).
    layouts = {name: prepare_layout(name, dataset, seeds, args)
               for name in args.layouts}
    result["layouts"] = {n: built for n, (*_, built) in layouts.items()}
    runs = [(BASELINES[name], None, "file", WINDOW)
            for name in args.baselines]
    for layout in args.layouts:
        runs += [("none", None, layout, WINDOW)] \
            if "none" in args.policies else []
        runs += [(p, b, layout, w) for b in args.host_budgets
                 for p in args.policies if p != "none" for w in args.windows]
    memo = {}
    for name, budget, layout, window in runs:
        before = os.getloadavg()
        if name in (IN_MEMORY, FLOOR):
            record = run_dgl(dataset, seeds, args, memmap=name == FLOOR)
        else:
            data, layout_seeds, profile, built = layouts[layout]
            record = run_hmgraph(data, layout_seeds, args, name,
                                 device_budget, budget,
                                 host_budgets.get(budget, 0), memo, built,
                                 profile, window)
            result["environment"]["o_direct"] = record["direct"]
            result["config"]["disk_model"] = record["disk"]
        record["loadavg"] = {"before": before, "after": os.getloadavg()}
        result["records"].append(record)
        gc.collect()
        add_ratios(result["records"], args.amortize_epochs)
        result["targets"] = targets(result["records"], args.layouts,
                                    args.amortize_epochs, args.windows[0])
        if args.dataset == "synth-papers":
            result["targets"] += papers_targets(result["records"],
                                                args.layouts)
        common.write_results(result, report(result), args.out)
        print(f"{record['config']} host {budget or '-'}: epoch "
              f"{record['seconds']['epoch']:.2f} s", file=sys.stderr)
    return common.finish(result, report(result), args.out)


if __name__ == "__main__":
    sys.exit(main())

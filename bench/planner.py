"""The planner's choices against forcing each mechanism on: loader only.

For each feature placement (in memory, on disk) the same batches run
through DGL's own ``DataLoader`` (features in memory, ``feats[input_nodes]``,
as a DGL user writes it), through `hmgraph.DataLoader` with the lookahead
window and batch reuse forced on (``window=4``, ``reuse="two-level"``),
and with the planner choosing (``window=None``, ``reuse="auto"``: each
mechanism priced by `hmgraph.cache.costs` on this machine). No model:
sampling and rows, what a GPU trainer waits for. Each configuration is
built in its own process; the planner's log lines are kept.
``python bench/planner.py --quick``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import common

from hmgraph.args import budget_text, name_list
from hmgraph.cache.budget import parse_budget

PLACEMENTS = ("memory", "disk")
FULL = {"dataset": "synth-products", "batch_size": 1024, "max_batches": 40,
        "out": "bench/results/planner.json"}
QUICK = {"dataset": "synth-tiny", "batch_size": 128, "max_batches": 4,
         "out": "/tmp/planner_quick.json"}
FORCED = {"window": 4, "reuse": "two-level"}
PLANNED = {"window": None, "reuse": "auto"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_quick_arguments(parser, FULL, QUICK,
                               "batches timed per configuration")
    add = parser.add_argument
    add("--device-budget", default="30%", type=budget_text,
        help="share of the feature bytes (30%%) or bytes with a unit")
    add("--host-budget", default="20%", type=budget_text)
    add("--placements", default=",".join(PLACEMENTS),
        type=name_list(PLACEMENTS))
    return common.finish_args(parser, parser.parse_args(argv), FULL, QUICK)


def _hmgraph(args, placement: str, options: dict) -> dict:
    """One loader-only run of `hmgraph.DataLoader` (in a child process):
    construction, the planner's lines, seconds per batch."""
    import dgl  # lazy: 4 s to import

    import hmgraph

    data, _ = common.load(args.dataset, args.root)
    feature_bytes = data.num_nodes * data.manifest.row_bytes
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("hmgraph.cachebuild")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    began = time.perf_counter()
    loader = hmgraph.DataLoader(
        data.graph, data.split["train"],
        dgl.dataloading.NeighborSampler(args.fanouts),
        batch_size=args.batch_size, shuffle=True, seed=args.seed,
        features=data.features if placement == "memory"
        else data.feature_path, cache="hmgraph",
        device_budget_bytes=parse_budget(args.device_budget, feature_bytes),
        host_budget_bytes=parse_budget(args.host_budget, feature_bytes),
        **options)
    construct = time.perf_counter() - began
    try:
        dgl.seed(args.seed)
        run = common.hmgraph_epoch(loader, max_batches=args.max_batches,
                                   desc=f"{placement} {options}")
    finally:
        loader.close()
    return {"construct_seconds": construct, "window": loader.window,
            "reuse_levels": loader.plan["_N"].reuse_levels,
            "planner": [line for line in lines if " a batch, costs " in line],
            "seconds_per_batch": run["seconds_per_batch"],
            "batches": run["batches"]}


def _dgl(args) -> dict:
    """DGL's loader, features in memory, loader only (a child process)."""
    import dgl  # lazy: 4 s to import

    data, _ = common.load(args.dataset, args.root)
    began = time.perf_counter()
    run = common.dgl_epoch(
        data.graph, data.split["train"],
        dgl.dataloading.NeighborSampler(args.fanouts), data.features,
        data.labels, batch_size=args.batch_size, seed=args.seed,
        max_batches=args.max_batches, desc="dgl")
    return {"construct_seconds": time.perf_counter() - began - run[
        "seconds"]["epoch"], "seconds_per_batch": run["seconds_per_batch"],
        "batches": run["batches"]}


def _measure_disk(args) -> dict:
    """The disk model of the feature file, measured now if not cached,
    so that no configuration's construction pays for it."""
    from hmgraph.cache.disk import disk_model

    data, _ = common.load(args.dataset, args.root)
    return disk_model(data.feature_path).as_dict()


def main(argv=None) -> int:
    args = parse_args(argv)
    environment = common.environment()  # its load average: at the start
    if "disk" in args.placements:
        common.isolated(_measure_disk, args)
    base = common.isolated(_dgl, args)
    rows = [dict(base, placement="memory", config="dgl in memory")]
    for placement in args.placements:
        for name, options in (("forced", FORCED), ("planned", PLANNED)):
            run = common.isolated(_hmgraph, args, placement, options)
            rows.append(dict(run, placement=placement,
                             config=f"hmgraph {name}", options=options))
    for row in rows:
        row["vs_dgl"] = row["seconds_per_batch"] / base["seconds_per_batch"]
    table = common.markdown_table(
        ["features", "loader", "window", "reuse levels", "s/batch",
         "vs DGL (x)", "construct s"],
        [[r["placement"], r["config"], r.get("window"),
          r.get("reuse_levels"), r["seconds_per_batch"], r["vs_dgl"],
          r["construct_seconds"]] for r in rows])
    said = "\n".join(f"- {r['placement']}, {r['config']}: {line}"
                     for r in rows for line in r.get("planner", []))
    markdown = (
        f"# What pays on this machine\n\n{args.dataset}, "
        f"NeighborSampler{tuple(args.fanouts)}, batch {args.batch_size}, "
        f"{rows[0]['batches']} batches per configuration, loader only (no "
        f"model), prefetch 0, hmgraph cache with device "
        f"{args.device_budget} + host {args.host_budget} of the feature "
        f"bytes; forced: {FORCED}; planned: {PLANNED}; "
        f"{common.environment_text(environment)}.\n\n{table}\n\n"
        f"The planner's lines (`hmgraph.cache.costs`):\n\n{said}\n")
    result = {"args": vars(args), "environment": environment,
              "records": rows}
    return common.finish(result, markdown, args.out)


if __name__ == "__main__":
    sys.exit(main())

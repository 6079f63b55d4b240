"""Which epoch selection makes validation track test on small TU sets.

Issue 36, target 2: the mean best-validation accuracy minus the test
accuracy must stay within 5 points on every TU set. With one carved
validation set of a test fold's size (19 graphs on MUTAG, 34 on PTC_MR)
the best of 100 noisy epochs is far above what the picked weights score
on test. Every cell here is one ``hmgraph classify`` run (the CLI's
defaults, 10 folds) under one of `VARIANTS`:

- ``holdout``: the carved validation set, its raw curve (the old default);
- ``holdout-s5``: the same, the curve's trailing mean over 5 epochs;
- ``inner``: inner stratified 3-fold CV of the training fold in
  lockstep, their mean curve (Errica et al. 2020's inner selection, the
  epoch count as the hyper-parameter); the three inner models at the
  picked epoch predict the test fold together (mean probabilities);
- ``inner-retrain``: the same selection, then one model retrained on the
  whole training fold for the picked epochs (as Errica et al.);
- ``-s5``: on the curve's trailing mean over 5 epochs.

An ``inner-retrain`` run trains the very models ``inner`` would and
records their ensemble's test score too: it yields both cells.

Results accumulate in ``--out`` (JSON) and its markdown twin, one cell at
a time (a stopped run keeps the cells done; ``--resume`` skips them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import common

# Sets OMP_WAIT_POLICY, which the spawned workers inherit.
import hmgraph.openmp  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results"
#: name -> ClassifyConfig overrides.
VARIANTS = {
    "holdout": {"selection": "holdout", "smooth": 1},
    "holdout-s5": {"selection": "holdout", "smooth": 5},
    "inner": {"selection": "inner", "smooth": 1},
    "inner-s5": {"selection": "inner", "smooth": 5},
    "inner-retrain": {"selection": "inner-retrain", "smooth": 1},
    "inner-retrain-s5": {"selection": "inner-retrain", "smooth": 5},
}
GAP_MAX = 5.0  # points of accuracy


def _cell(dataset, model, variant, root, settings, extra):
    """One cross-validated run in a worker (one thread); ``extra``
    overrides the CLI's defaults (``{"batch_size": 32}``)."""
    import torch

    from hmgraph.classify import ClassifyConfig, load_graph_dataset, run

    torch.set_num_threads(1)
    data = load_graph_dataset(dataset, root)
    with tempfile.TemporaryDirectory(prefix="hmgraph-protocol-") as out:
        config = ClassifyConfig(dataset=dataset, root=str(root), model=model,
                                progress=False, out=out,
                                **settings, **VARIANTS[variant], **extra)
        start = time.perf_counter()
        result = run(config, data)
    cells = [_summary(dataset, model, variant, extra, result, data,
                      start)]
    if variant.startswith("inner-retrain"):  # the same inner models
        folds = [dict(f, test=f["test_ensemble"]) for f in result["folds"]]
        cells.append(_summary(dataset, model,
                              variant.replace("inner-retrain", "inner"),
                              extra, dict(result, folds=folds), data, start))
    return cells


def _summary(dataset, model, variant, extra, result, data, start):
    import torch

    from hmgraph.classify import summarize

    name = " ".join([variant] + [f"{k}={v:g}" for k, v in extra.items()])
    summary = summarize(result["folds"])
    counts = torch.bincount(data.labels)
    return {"dataset": dataset, "model": model, "variant": name,
            "overrides": {**VARIANTS[variant], **extra},
            "protocol": result["protocol"], "summary": summary,
            "gap": 100 * (summary["valid_mean"] - summary["test_mean"]),
            "majority": float(counts.max() / counts.sum()),
            "folds": [{k: f[k] for k in ("fold", "best_epoch", "epochs_run",
                                         "valid", "test", "seconds")}
                      for f in result["folds"]],
            "wall_seconds": time.perf_counter() - start}


def format_markdown(report) -> str:
    """Per dataset and model, each variant's test mean ± std, mean best
    validation and the gap; the verdict per variant."""
    cells = report["cells"]
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    lines = ["# Epoch selection on small TU sets: does validation track "
             "test?", "",
             f"Settings: {json.dumps(report['settings'])}; 10-fold "
             f"stratified CV (seed 0), the CLI's defaults otherwise. Test "
             f"accuracy %, mean ± std over folds; valid: the mean of the "
             f"picked validation scores; gap = valid - test (target <= "
             f"{GAP_MAX:g} points).", "",
             *([report["note"], ""] if report.get("note") else []),
             *common.parts_by_commit(
                 report, cells,
                 lambda c: f"{c['dataset']} {c['model']} {c['variant']}"),
             "| dataset | model | majority | " + " | ".join(
                 f"{v}: test / valid / gap" for v in variants) + " |",
             "|---|---|---:|" + "---:|" * len(variants)]
    keys = sorted({(c["dataset"], c["model"]) for c in cells},
                  key=lambda k: (k[0], k[1] != "hap", k[1]))
    for dataset, model in keys:
        row = {c["variant"]: c for c in cells
               if (c["dataset"], c["model"]) == (dataset, model)}
        majority = next(iter(row.values()))["majority"]
        parts = []
        for v in variants:
            c = row.get(v)
            if c is None:
                parts.append("-")
                continue
            s = c["summary"]
            parts.append(f"{100 * s['test_mean']:.2f} ± "
                         f"{100 * s['test_std']:.2f} / "
                         f"{100 * s['valid_mean']:.2f} / "
                         f"**{c['gap']:+.2f}**")
        lines.append(f"| {dataset} | {model} | {100 * majority:.2f} | "
                     + " | ".join(parts) + " |")
    lines += ["", "| variant | cells | worst gap | cells with gap <= "
              f"{GAP_MAX:g} | wall s |", "|---|---:|---:|---:|---:|"]
    for v in variants:
        mine = [c for c in cells if c["variant"] == v]
        lines.append(f"| {v} | {len(mine)} | "
                     f"{max(c['gap'] for c in mine):+.2f} | "
                     f"{sum(c['gap'] <= GAP_MAX for c in mine)} | "
                     f"{sum(c['wall_seconds'] for c in mine):.0f} |")
    return "\n".join(lines) + "\n"


def _write(report, out: Path) -> None:
    """The JSON and markdown (`common.write_results`), naming the commit
    of every cell that recorded one (``merged`` where they differ; the
    note names those of cells from before cells recorded it)."""
    report["commit"] = common.merged_commit(
        c.get("commit") for c in report["cells"])
    common.write_results(report, format_markdown(report), out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="PTC_MR,MUTAG")
    parser.add_argument("--models", default="hap,gin")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--root", default=str(DEFAULT_ROOT))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--patience", type=int, default=20)
    parser.add_argument("--set", default="",
                        help="extra settings for every cell, e.g. "
                        "'batch_size=32,clip=1' (ClassifyConfig fields)")
    parser.add_argument("--out", default=str(RESULTS / "protocol.json"))
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells already in --out, run the rest")
    parser.add_argument("--merge", default=None,
                        help="only add the cells of these JSON files "
                        "(comma-separated) to --out and rewrite its table")
    parser.add_argument("--note", default=None,
                        help="a paragraph for the table (kept otherwise)")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; available: "
                     f"{', '.join(VARIANTS)}")
    settings = {"epochs": args.epochs, "patience": args.patience}
    extra = {k: float(v) if "." in v or "e" in v else int(v)
             for k, _, v in (part.partition("=") for part in
                             filter(None, args.set.split(",")))}
    out = Path(args.out)
    report = {"settings": settings, "cells": []}
    merging = args.merge is not None  # adds cells, runs none
    if (args.resume or merging) and out.is_file():
        report = json.loads(out.read_text())
    suffix = "".join(f" {k}={v:g}" for k, v in extra.items())
    if args.note is not None:
        report["note"] = args.note
    if merging:
        for path in filter(None, args.merge.split(",")):
            report["cells"] += json.loads(Path(path).read_text())["cells"]
        _write(report, out)
        print(format_markdown(report), end="")
        return 0
    done = {(c["dataset"], c["model"], c["variant"]) for c in report["cells"]}
    jobs = [(d, m, v) for d in args.datasets.split(",")
            for m in args.models.split(",") for v in variants
            if (d, m, v + suffix) not in done]
    with ProcessPoolExecutor(args.workers,
                             mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_cell, d, m, v, args.root, settings, extra):
                   (d, m, v) for d, m, v in jobs}
        for future in as_completed(futures):
            for cell in future.result():
                report["cells"].append(dict(cell, commit=common.commit()))
                s = cell["summary"]
                print(f"{cell['dataset']} {cell['model']} "
                      f"{cell['variant']}: test {100 * s['test_mean']:.2f}"
                      f" ± {100 * s['test_std']:.2f} valid "
                      f"{100 * s['valid_mean']:.2f} gap "
                      f"{cell['gap']:+.2f} ({cell['wall_seconds']:.0f} s)",
                      flush=True)
            _write(report, out)
    print(format_markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

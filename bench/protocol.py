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
a time (a stopped run keeps the cells done; ``--resume`` skips them). A
cell whose settings equal a complete cell of the pooling grid (``--grid``,
`bench/pooling.py`: every model under the inner protocol, smoothed, at
batch size {32, 128} x dropout {0, 0.5}) is that cell, taken with its
commit instead of run again.
"""

from __future__ import annotations

import argparse
import functools
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
THREADS = 1  # torch threads of each cell (recorded in it)
#: The pooling grid (`bench/pooling.py`), whose complete cells this table
#: takes where the settings are the same.
GRID = RESULTS / "pooling-inner.json"


def _cell(dataset, model, variant, root, settings, extra):
    """One cross-validated run in a worker (one thread); ``extra``
    overrides the CLI's defaults (``{"batch_size": 32}``)."""
    import torch

    from hmgraph.classify import ClassifyConfig, load_graph_dataset, run

    torch.set_num_threads(THREADS)
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

    counts = torch.bincount(data.labels)
    return _make_cell(dataset, model, variant, extra, result["protocol"],
                      result["folds"], float(counts.max() / counts.sum()),
                      time.perf_counter() - start)


def _make_cell(dataset, model, variant, extra, protocol, folds, majority,
               seconds) -> dict:
    """A cell of the table from the folds of one cross-validated run."""
    from hmgraph.classify import summarize

    name = " ".join([variant] + [f"{k}={v:g}" for k, v in extra.items()])
    summary = summarize(folds)
    return {"dataset": dataset, "model": model, "variant": name,
            "overrides": {**VARIANTS[variant], **extra},
            "protocol": protocol, "summary": summary,
            "gap": 100 * (summary["valid_mean"] - summary["test_mean"]),
            "majority": majority, "threads": THREADS,
            "folds": [{k: f[k] for k in ("fold", "best_epoch", "epochs_run",
                                         "valid", "test", "seconds")}
                      for f in folds],
            "wall_seconds": seconds}


@functools.cache
def _dataset(name, root):
    from hmgraph.classify import load_graph_dataset

    return load_graph_dataset(name, root)


def trained_settings(fields: dict, root) -> dict:
    """The `FOLD_KEYS` settings ``hmgraph classify`` trains with, given
    ``fields`` (ClassifyConfig's, ``dataset`` and ``model`` among them;
    the rest at their defaults)."""
    from hmgraph.classify import FOLD_KEYS, ClassifyConfig, resolve_defaults

    config = resolve_defaults(ClassifyConfig(**fields),
                              _dataset(fields["dataset"], root))
    return {k: getattr(config, k) for k in FOLD_KEYS}


def grid_records(path: Path, root) -> list[tuple[dict, dict]]:
    """``(settings, record)`` of each cell of the pooling grid in ``path``
    (`bench/pooling.py`) that ran every fold; none where there is no
    file. A record's settings are its run's (``config``, the `LEGACY`
    values where it predates one) and its configuration's overrides."""
    import pooling

    if not path or not Path(path).is_file():
        return []
    report = json.loads(Path(path).read_text())
    config = report["config"]
    fixed = {k: config.get(k, pooling.LEGACY.get(k))
             for k in pooling.SETTINGS if k != "grid"}
    return [(trained_settings(dict(fixed, dataset=r["dataset"],
                                   model=r["model"], **r["overrides"]),
                              root), r)
            for r in report["records"]
            if r["summary"]["folds_run"] == config["folds"]
            # Cells repeat only at the thread count they ran at; those
            # without a count ran at one, as the pooling bench's do.
            and r.get("threads", pooling.THREADS) == THREADS]


def grid_cell(grid, dataset, model, variant, extra, fields, root):
    """The cell of ``(dataset, model, variant)`` taken from the pooling
    grid's record of the same settings, or None where it holds none: the
    same ``hmgraph classify`` run, not made twice."""
    wanted = trained_settings(
        dict(fields, dataset=dataset, model=model, **VARIANTS[variant],
             **extra), root)
    record = next((r for settings, r in grid if settings == wanted), None)
    if record is None:
        return None
    cell = _make_cell(dataset, model, variant, extra, record["protocol"],
                      record["folds"], record["majority"],
                      record["wall_seconds"])
    return dict(cell, commit=record.get("commit"),
                grid=record["name"])


def format_markdown(report) -> str:
    """Per dataset and model, each variant's test mean ± std, mean best
    validation and the gap; the verdict per variant."""
    cells = report["cells"]
    # The selections in `VARIANTS`' order, each with its added settings
    # after it.
    variants = sorted(dict.fromkeys(c["variant"] for c in cells),
                      key=lambda v: (list(VARIANTS).index(v.split()[0]),
                                     len(v.split()), v))
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
             *_grid_lines(cells),
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


def _grid_lines(cells) -> list[str]:
    """A paragraph naming the cells taken from the pooling grid."""
    taken = [c for c in cells if "grid" in c]
    if not taken:
        return []
    return ["Taken from the pooling grid (`bench/pooling.py`; the same "
            "settings, so the same run): " + ", ".join(
                f"{c['dataset']} {c['model']} {c['variant']} ({c['grid']})"
                for c in taken) + ".", ""]


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
    parser.add_argument("--grid", default=str(GRID),
                        help="the pooling grid's results (bench/pooling.py):"
                        " a cell of the same settings is taken from there, "
                        "not run again ('' runs every cell)")
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
    done = {(c["dataset"], c["model"], c["variant"]): c
            for c in report["cells"]}
    grid = grid_records(args.grid, args.root)
    jobs = []
    for d, m, v in [(d, m, v) for d in args.datasets.split(",")
                    for m in args.models.split(",") for v in variants
                    if (d, m, v + suffix) not in done]:
        cell = grid_cell(grid, d, m, v, extra, settings, args.root)
        if cell is None:
            jobs.append((d, m, v))
            continue
        report["cells"].append(cell)
        done[d, m, v + suffix] = cell
        _print_cell(cell)
    _write(report, out)
    with ProcessPoolExecutor(args.workers,
                             mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_cell, d, m, v, args.root, settings, extra):
                   (d, m, v) for d, m, v in jobs}
        for future in as_completed(futures):
            for cell in future.result():
                key = (cell["dataset"], cell["model"], cell["variant"])
                if key in done:  # inner-retrain's inner cell, made before
                    _compare(done[key], cell)
                    continue
                done[key] = dict(cell, commit=common.commit())
                report["cells"].append(done[key])
                _print_cell(cell)
            _write(report, out)
    print(format_markdown(report), end="")
    return 0


def _print_cell(cell) -> None:
    s = cell["summary"]
    source = f", the pooling grid's {cell['grid']}" if "grid" in cell else ""
    print(f"{cell['dataset']} {cell['model']} {cell['variant']}: test "
          f"{100 * s['test_mean']:.2f} ± {100 * s['test_std']:.2f} valid "
          f"{100 * s['valid_mean']:.2f} gap {cell['gap']:+.2f} "
          f"({cell['wall_seconds']:.0f} s{source})", flush=True)


def _compare(kept, cell) -> None:
    """Say whether an ``inner-retrain`` run's inner ensembles scored as
    the kept cell of the same inner models did, fold by fold."""
    same = [f["test"] for f in kept["folds"]] == \
        [f["test"] for f in cell["folds"]]
    print(f"{cell['dataset']} {cell['model']} {cell['variant']}: made "
          f"again by inner-retrain; its test scores "
          f"{'equal' if same else 'DIFFER from'} the kept cell's",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Graph classification and regression under one protocol
(``hmgraph classify``).

`run` trains one model (`hmgraph.models.pooling.POOLING_MODELS`) on a TU
dataset with stratified k-fold cross-validation:

1. The graphs are split into ``folds`` stratified folds (scikit-learn's
   ``StratifiedKFold``, shuffled with ``seed``). Each fold is the test set
   once; the other folds are its training fold.
2. The epoch count is picked without the test fold, by
   ``selection`` (`SELECTIONS`):

   - ``"inner"``: the training fold is split again into ``inner_folds``
     stratified inner folds; one model per inner split trains in
     lockstep, each scored on its inner validation fold after every
     epoch; the mean of their curves picks the epoch and stops training
     (Errica et al., ICLR 2020's inner model selection, with the epoch
     count as the selected setting). The inner models at the picked
     epoch predict the test fold together (`Ensemble`).
   - ``"inner-retrain"``: the same selection, then one model trains on
     the whole training fold for the picked number of epochs (the
     ensemble's test score is kept beside, ``test_ensemble``).
   - ``"holdout"``: a stratified validation set as large as the test fold
     is carved from the training fold (8 : 1 : 1 at 10 folds); the model
     trains on the rest and its weights of the picked epoch are kept.

   The picked epoch has the best validation metric, ties broken by the
   lower validation loss, on the curve's trailing mean over ``smooth``
   epochs; training stops after ``patience`` epochs without a better one.
   Training: Adam (over `flat_parameters`: one update a step, the same
   bits) on mini-batches of ``batch_size`` graphs (order seeded with the
   fold's seed + epoch), loss = `task_loss` + the model's
   ``auxiliary_loss``.
3. The picked model is scored once on the test fold.
4. Mean and standard deviation (over folds) of the test metric; the
   reported validation score is the picked (smoothed) one, so the gap
   between the two shows how far selection flattered the model.

OGB datasets (every ``ogbg-mol*``: binary classification with one or
many tasks, regression) come with an official scaffold split: there the
split is used as is, its validation set picks the epoch (``selection``
does not apply), ``folds`` runs repeat it with the folds' seeds, the loss
masks unlabelled entries and the metric is OGB's ``Evaluator``'s (ROC-AUC,
AP, RMSE; RMSE is picked lowest). Regressors learn standardised targets
(`TargetScale`).

Results go to ``OUT/result.json`` and ``OUT/result.md`` (written
atomically); `format_markdown` renders the table. Each finished fold is
also kept in ``OUT/folds/fold-K.json`` with the settings and the
`code_digest` that made it; ``resume=True`` (``--resume``) reuses them,
so a killed run loses at most the fold in flight (every fold is seeded
on its own, so a resumed run gives the same numbers).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hmgraph.args import check_out_folder
from hmgraph.cache.format import atomic_path
from hmgraph.fold_records import (
    FOLD_KEYS,
    code_digest,
    fold_path,
    keep_fold,
    kept_fold,
)
from hmgraph.graph_training import (
    Ensemble,
    TargetScale,
    check_model_memory,
    evaluate,
    flat_parameters,
    target_scale,
    task_loss,
)
from hmgraph.markdown import markdown_table
from hmgraph.protocol import (
    inner_splits,
    make_folds,
    outer_splits,
    train_fold,
)
from hmgraph.selection import config_name, parse_grid, select_per_fold
from hmgraph.settings import (
    SELECTIONS,
    SMOOTH_CV,
    ClassifyConfig,
    add_arguments,
    from_args,
)

log = logging.getLogger(__name__)

# Some are re-exported from the modules they moved to (issue 35): tests and
# bench scripts import them from here.
__all__ = [
    "FOLD_KEYS",
    "SELECTIONS",
    "SMOOTH_CV",
    "ClassifyConfig",
    "Ensemble",
    "TargetScale",
    "add_parser",
    "check_model_memory",
    "code_digest",
    "command",
    "evaluate",
    "flat_parameters",
    "format_markdown",
    "inner_splits",
    "load_graph_dataset",
    "make_folds",
    "resolve_defaults",
    "run",
    "run_grid",
    "summarize",
    "target_scale",
    "task_loss",
]


def load_graph_dataset(name: str, root: str | os.PathLike):
    """A TU folder ``root/name``, or an OGB graph dataset by name.

    Raises
    ------
    hmgraph.datasets.DatasetError
        Not found (the message lists the TU folders under ``root``) or
        malformed (file and line).
    """
    from hmgraph.datasets import DatasetError
    from hmgraph.datasets.graphprop import OGB_GRAPH_DATASETS, load_ogbg
    from hmgraph.datasets.tu import read_tu

    if name in OGB_GRAPH_DATASETS:
        return load_ogbg(name, root)
    root = Path(root)
    if not (root / name).is_dir():
        found = sorted(p.name for p in root.glob("*/") if
                       (p / f"{p.name}_A.txt").is_file()) \
            if root.is_dir() else []
        raise DatasetError(
            f"dataset {name!r} not found under {root}: expected a TU folder "
            f"{root / name}/ or one of {', '.join(OGB_GRAPH_DATASETS)}; "
            f"TU folders there: {', '.join(found) or 'none'}"
        )
    return read_tu(root / name)




def resolve_defaults(config: ClassifyConfig, dataset) -> ClassifyConfig:
    """``config`` with the defaults that depend on the data and the model
    filled in, as `run` trains: ``smooth`` (1 with an official split,
    `SMOOTH_CV` under cross-validation) and ``dropout`` (the model's).
    Two configurations train alike when these and `FOLD_KEYS` agree
    and torch has as many threads."""
    # Lazy: the pooling models load DGL, which the CLI's parser does not.
    from hmgraph.models.pooling import default_dropout

    if config.smooth is None:
        config = dataclasses.replace(
            config, smooth=1 if dataset.split is not None else SMOOTH_CV)
    if config.dropout is None:
        config = dataclasses.replace(config,
                                     dropout=default_dropout(config.model))
    return config


def run(config: ClassifyConfig, dataset=None) -> dict:
    """Cross-validate ``config.model``; write ``result.json`` and ``.md``.

    Parameters
    ----------
    config : ClassifyConfig
        The settings.
    dataset : GraphDataset, optional
        Already loaded data; loaded from ``config`` when omitted.

    Returns
    -------
    dict
        ``config``, ``dataset`` (name, counts), ``protocol``, ``metric``,
        ``folds`` (per fold: best epoch, valid and test metric, seconds,
        history: per epoch the training loss, validation loss and metric,
        and the epoch's seconds, training and validation), ``summary``
        (``test_mean``, ``test_std``, ``valid_mean``, ``folds_run``) and
        ``path``.
    """
    _check_config(config)
    device = torch.device(config.device)
    if dataset is None:
        dataset = load_graph_dataset(config.dataset, config.root)
    config = resolve_defaults(config, dataset)
    check_model_memory(config, dataset)
    # (1) Splits: stratified folds, or the official split repeated.
    splits, protocol = outer_splits(config, dataset)
    # (2) One model per fold.
    records = []
    bar = tqdm(total=len(splits) * config.epochs,
               desc=f"{dataset.name} {config.model}", unit="epoch",
               disable=not config.progress, leave=False)
    with bar:
        for fold, split in enumerate(splits):
            kept = kept_fold(config, fold) if config.resume else None
            if kept is not None:
                records.append(dict(kept, resumed=True))
                bar.update(config.epochs)
                log.info("%s %s fold %d: kept in %s", dataset.name,
                         config.model, fold, fold_path(config, fold))
                continue
            records.append(train_fold(config, dataset, split, fold,
                                       device, bar))
            keep_fold(config, records[-1])
            log.info("%s %s fold %d: valid %.4f test %.4f (epoch %d)",
                     dataset.name, config.model, fold, records[-1]["valid"],
                     records[-1]["test"], records[-1]["best_epoch"])
    result = {
        "config": config.as_dict(),
        "dataset": {"name": dataset.name, "graphs": dataset.num_graphs,
                    "classes": dataset.num_classes,
                    "feat_dim": dataset.feat_dim},
        "protocol": protocol,
        "metric": dataset.metric,
        "folds": records,
        "summary": summarize(records),
    }
    # (3) JSON and markdown, atomically.
    return _write(result, Path(config.out))


def _check_config(config) -> None:
    """Refuse an unknown model or selection, or a count below 1."""
    # Lazy: the pooling models load DGL, which the CLI's parser does not.
    from hmgraph.models.pooling import POOLING_MODELS

    if config.model not in POOLING_MODELS:
        raise ValueError(f"unknown model {config.model!r}; available: "
                         f"{', '.join(sorted(POOLING_MODELS))}")
    for name in ("folds", "epochs", "patience", "batch_size", "hidden",
                 "levels", "smooth"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            raise ValueError(f"{name} must be positive; got "
                             f"{getattr(config, name)}")
    if config.selection not in SELECTIONS:
        raise ValueError(f"unknown selection {config.selection!r}; "
                         f"available: {', '.join(SELECTIONS)}")
    if config.inner_folds < 2:
        raise ValueError(f"inner_folds must be at least 2; got "
                         f"{config.inner_folds}")


def _write(result: dict, out: Path) -> dict:
    """``out/result.json`` and ``result.md``, atomically; ``path`` set."""
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "result.json") as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    with atomic_path(out / "result.md") as tmp:
        tmp.write_text(format_markdown(result))
    result["path"] = str(out / "result.json")
    return result


def run_grid(config, grid: list[dict], dataset=None) -> dict:
    """Cross-validate every configuration of ``grid``; pick per fold.

    Parameters
    ----------
    config : ClassifyConfig
        The settings the grid's keys override; each configuration writes
        its own ``result.json`` under ``config.out/<name>/``.
    grid : list of dict
        Configurations, as `hmgraph.selection.parse_grid` makes them.
    dataset : GraphDataset, optional
        Already loaded data.

    Returns
    -------
    dict
        ``config``, ``grid``, ``dataset``, ``protocol``, ``metric``,
        ``runs`` (per configuration: ``name``, ``overrides``, ``summary``),
        ``folds`` (each fold's picked record with its ``pick``),
        ``summary``, ``picks`` and ``path``; written to
        ``config.out/result.json`` and ``result.md``.
    """
    if dataset is None:
        dataset = load_graph_dataset(config.dataset, config.root)
    configs = [dataclasses.replace(
        config, **overrides,
        out=str(Path(config.out) / config_name(overrides).replace(" ", "-")))
        for overrides in grid]
    for one in configs:  # every configuration fits before the first runs
        check_model_memory(one, dataset)
    runs = []
    for overrides, one in zip(grid, configs, strict=True):
        runs.append(dict(run(one, dataset), name=config_name(overrides),
                         overrides=overrides))
    picked = select_per_fold(runs)
    folds = [dict(record, pick=runs[i]["name"]) for record, i in
             zip(picked["records"], picked["chosen"], strict=True)]
    for record in folds:
        record.pop("history", None)
    result = {
        "config": config.as_dict(), "grid": grid,
        "dataset": runs[0]["dataset"],
        "protocol": runs[0]["protocol"] + "; per fold, the configuration "
        "with the best validation score",
        "metric": runs[0]["metric"],
        "runs": [{"name": r["name"], "overrides": r["overrides"],
                  "summary": r["summary"]} for r in runs],
        "folds": folds, "summary": summarize(picked["records"]),
        "picks": picked["picks"]}
    return _write(result, Path(config.out))


def summarize(records: list[dict]) -> dict:
    """Mean and sample std over folds of the test and valid metric."""
    test = torch.tensor([r["test"] for r in records], dtype=torch.float64)
    valid = torch.tensor([r["valid"] for r in records], dtype=torch.float64)
    std = float(test.std()) if len(records) > 1 else 0.0
    return {"test_mean": float(test.mean()) if records else 0.0,
            "test_std": std,
            "valid_mean": float(valid.mean()) if records else 0.0,
            "epochs_mean": (sum(r["epochs_run"] for r in records)
                            / max(len(records), 1)),
            "seconds": sum(r["seconds"] for r in records),
            "folds_run": len(records)}


def format_markdown(result: dict) -> str:
    """The result as a markdown table: one row per fold, then mean ± std;
    after a grid search (`run_grid`), each fold's pick
    and every configuration's own mean."""
    metric, summary = result["metric"], result["summary"]
    scale = 100.0 if metric == "acc" else 1.0
    unit = "acc %" if metric == "acc" else metric
    grid = "runs" in result

    def fmt(value):
        return f"{value * scale:.2f}" if scale != 1 else f"{value:.4f}"

    picks = ["pick"] if grid else []
    rows = [[str(r["fold"]), *([r["pick"]] if grid else []),
             str(r["best_epoch"]), str(r["epochs_run"]), fmt(r["valid"]),
             fmt(r["test"]), f"{r['seconds']:.1f}"] for r in result["folds"]]
    rows.append(["**mean ± std**", *([""] if grid else []), "",
                 f"{summary['epochs_mean']:.1f}",
                 fmt(summary["valid_mean"]),
                 f"**{fmt(summary['test_mean'])} ± "
                 f"{fmt(summary['test_std'])}**",
                 f"{summary['seconds']:.1f}"])
    lines = [
        f"# {result['dataset']['name']}: {result['config']['model']}", "",
        f"Protocol: {result['protocol']}.", "",
        markdown_table(["fold", *picks, "best epoch", "epochs",
                        f"valid {unit}", f"test {unit}", "s"], rows,
                       align="r" + "l" * len(picks) + "rrrrr"),
    ]
    if grid:
        lines += ["", markdown_table(
            ["configuration", "folds picked", f"valid {unit}",
             f"test {unit} (no selection)"],
            [[r["name"], str(result["picks"].get(r["name"], 0)),
              fmt(r["summary"]["valid_mean"]),
              f"{fmt(r['summary']['test_mean'])} ± "
              f"{fmt(r['summary']['test_std'])}"] for r in result["runs"]],
            align="lrrr")]
    return "\n".join(lines) + "\n"


def add_parser(commands):
    """Add the ``classify`` subcommand to an argparse subparsers object.

    Returns the new parser; `command` runs it. The flags are those of
    `ClassifyConfig`'s fields, plus ``--grid``.
    """
    parser = commands.add_parser(
        "classify", help="graph classification with pooling models",
        description="""
        Cross-validate a graph classifier (HAP or a pooling baseline) on a
        TU dataset (stratified k-fold, validation carved from each training
        fold) or an OGB graph dataset (official split); writes JSON and a
        markdown table.""",
    )
    add_arguments(parser, ClassifyConfig, changes={"out": {"default": None}})
    parser.add_argument("--grid", default="",
                        help="search, e.g. 'batch_size=32,128;dropout=0,0.5'"
                        ": every configuration cross-validated, per fold "
                        "the best on validation scored on test (keys: "
                        "batch_size, dropout, lr, hidden, weight_decay)")
    return parser


def command(args) -> int:
    """Run ``hmgraph classify``; print the markdown table. Returns 0.

    Raises
    ------
    ValueError
        A bad value (the CLI prints it as one line).
    """
    grid = parse_grid(args.grid) if args.grid else None
    if args.ratio is not None and not 0.0 < args.ratio <= 1.0:
        raise ValueError(f"--ratio {args.ratio}: must be in (0, 1]")
    if args.inner_folds < 2:
        raise ValueError(f"--inner-folds {args.inner_folds}: must be at "
                         f"least 2")
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise ValueError(f"--lr {args.lr}: must be a positive number")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device here; "
                         f"use --device cpu")
    out = args.out or f"runs/classify-{args.dataset}-{args.model}"
    check_out_folder(out)
    config = ClassifyConfig(**from_args(ClassifyConfig, args, out=out))
    result = run_grid(config, grid) if grid else run(config)
    print(format_markdown(result), end="")
    print(f"results: {result['path']}")
    return 0

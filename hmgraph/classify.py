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

import copy
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hmgraph.cache.format import atomic_path
from hmgraph.selection import config_name, parse_grid, select_per_fold

log = logging.getLogger(__name__)

__all__ = [
    "ClassifyConfig",
    "add_parser",
    "check_model_memory",
    "code_digest",
    "command",
    "evaluate",
    "flat_parameters",
    "format_markdown",
    "load_graph_dataset",
    "make_folds",
    "run",
    "run_grid",
    "summarize",
]


@dataclass
class ClassifyConfig:
    """Settings of one cross-validated run (all JSON-serialisable).

    Attributes
    ----------
    dataset : str
        A TU folder name under ``root`` (``MUTAG``) or an OGB name
        (``ogbg-molbace``).
    model : str
        A key of `POOLING_MODELS`.
    folds : int
        Cross-validation folds (or seeds on an official split).
    max_folds : int
        Run only the first this many folds (0: all); the summary says so.
    epochs, patience : int
        Epoch cap and early-stopping patience (on validation).
    ratio : float or None
        Pooling ratio; None takes the model's default.
    dropout : float or None
        Classifier-head dropout; None takes the model's default
        (`hmgraph.models.pooling.default_dropout`: 0 for HAP, 0.5 for
        the baselines).
    selection : str
        How the epoch is picked (`SELECTIONS`): ``"inner"`` (inner
        k-fold over the training fold; the inner models predict
        together), ``"inner-retrain"`` (the same, then one model
        retrained on all of it) or ``"holdout"`` (the carved validation
        set). Official splits always select on their own validation set.
    smooth : int or None
        Epochs of the trailing mean over the validation curve that picks
        the epoch (1: the raw curve). None: `SMOOTH_CV` on
        cross-validation, 1 on an official split (OGB's protocol).
    inner_folds : int
        Inner folds of ``selection="inner"``.
    clip : float
        Gradient-norm clip (0: none).
    resume : bool
        Reuse the folds an earlier run left in ``out/folds`` (same
        settings, `FOLD_KEYS`; another setting is refused).
    """

    dataset: str = "MUTAG"
    root: str = "data"
    model: str = "hap"
    folds: int = 10
    max_folds: int = 0
    epochs: int = 100
    patience: int = 20
    batch_size: int = 128
    hidden: int = 64
    levels: int = 3
    ratio: float | None = None
    dropout: float | None = None
    lr: float = 0.001
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    selection: str = "inner"
    smooth: int | None = None
    inner_folds: int = 3
    clip: float = 0.0
    out: str = "runs/classify"
    progress: bool = True
    resume: bool = False

    def as_dict(self) -> dict:
        """The settings as a plain dict."""
        return dataclasses.asdict(self)


#: Settings a kept fold must share with the run that reuses it.
FOLD_KEYS = ("dataset", "model", "folds", "epochs", "patience", "batch_size",
             "hidden", "levels", "ratio", "dropout", "lr", "weight_decay",
             "seed", "device", "selection", "smooth", "inner_folds",
             "clip")
#: Default smoothing of the validation curve on cross-validated sets.
SMOOTH_CV = 5
#: Epoch selections (`ClassifyConfig.selection`).
SELECTIONS = ("inner", "inner-retrain", "holdout")


@functools.cache
def code_digest() -> str:
    """SHA-256 of hmgraph's Python sources (paths and bytes, in order):
    which code made a kept fold, with or without git."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _fold_path(config, fold: int) -> Path:
    return Path(config.out) / "folds" / f"fold-{fold}.json"


def _kept_fold(config, fold: int) -> dict | None:
    """Fold ``fold``'s record from ``out/folds``, or None where there is
    none.

    Raises
    ------
    hmgraph.train.CheckpointError
        The file cannot be read or was made with another setting.
    """
    from hmgraph.train import CheckpointError, check_saved_settings

    path = _fold_path(config, fold)
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"fold record {path} cannot be read ({type(err).__name__}); "
            f"delete it or run without --resume") from None
    wrong = _wrong_fold_field(kept, fold)
    if wrong:
        raise CheckpointError(
            f"fold record {path} is not hmgraph's record of fold {fold} "
            f"({wrong}); delete it or run without --resume")
    settings, record = kept["config"], kept["record"]
    check_saved_settings(f"fold record {path}", settings, config, FOLD_KEYS)
    if kept.get("code") != code_digest():
        log.warning("fold record %s was made by other hmgraph code; "
                    "reused as it is", path)
    return record


#: Numbers a kept fold's record holds: what the summary, the table and
#: the grid's selection read.
_RECORD_NUMBERS = ("best_epoch", "epochs_run", "valid", "valid_loss", "test",
                   "seconds")


def _wrong_fold_field(kept, fold: int) -> str:
    """What is wrong with the shape of a kept fold's JSON ('' when
    nothing is)."""
    if not isinstance(kept, dict):
        return (f"it holds {'null' if kept is None else _json_kind(kept)}, "
                f"not an object")
    for key in ("config", "record"):
        if not isinstance(kept.get(key), dict):
            return f"its {key!r} is {_json_kind(kept.get(key))}, not an object"
    record = kept["record"]
    if record.get("fold") != fold:
        return f"its record is of fold {record.get('fold')!r}"
    for key in _RECORD_NUMBERS:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"its record's {key!r} is {_json_kind(value)}, not a number"
    return ""


def _json_kind(value) -> str:
    """``None`` -> ``"missing"``, ``[]`` -> ``"an array"``, ..."""
    if value is None:
        return "missing"
    kinds = {dict: "an object", list: "an array", str: "a string",
             bool: "a boolean"}
    return kinds.get(type(value), "a number")


def _keep_fold(config, record: dict) -> None:
    path = _fold_path(config, record["fold"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({
            "config": {k: getattr(config, k) for k in FOLD_KEYS},
            "code": code_digest(), "record": record}))


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


def make_folds(labels: torch.Tensor, folds: int, seed: int) -> list[dict]:
    """Stratified folds, each with a validation set carved from training.

    Parameters
    ----------
    labels : torch.Tensor
        Class of each graph, shape ``(num_graphs,)``.
    folds : int
        Number of folds, at least 2 and at most the number of graphs.
    seed : int
        Seeds the fold shuffle and the validation draws.

    Returns
    -------
    list of dict
        Per fold ``train``, ``valid``, ``test``: sorted int64 graph ids;
        the tests partition all graphs, each ``valid`` is as large as its
        ``test`` and disjoint from it and from ``train``.
    """
    import numpy as np
    from sklearn.model_selection import StratifiedKFold, train_test_split

    y = np.asarray(labels)
    if not 2 <= folds <= y.size:
        raise ValueError(
            f"folds must be in [2, {y.size}] (the number of graphs); got "
            f"{folds}")
    counts = np.bincount(y)
    stratify_folds = counts[counts > 0].min() >= folds
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed) \
        if stratify_folds else None
    if splitter is None:
        from sklearn.model_selection import KFold
        splitter = KFold(folds, shuffle=True, random_state=seed)
    result = []
    for fold, (rest, test) in enumerate(splitter.split(np.zeros(y.size), y)):
        rest_counts = np.bincount(y[rest])
        stratify = y[rest] if rest_counts[rest_counts > 0].min() >= 2 \
            else None
        try:
            train, valid = train_test_split(
                rest, test_size=len(test), random_state=seed + fold,
                stratify=stratify)
        except ValueError:  # too few graphs per class to stratify
            train, valid = train_test_split(
                rest, test_size=len(test), random_state=seed + fold)
        result.append({k: torch.as_tensor(np.sort(v), dtype=torch.int64)
                       for k, v in (("train", train), ("valid", valid),
                                    ("test", test))})
    return result


#: OGB metrics where lower is better; every other metric is higher-better.
LOWER_IS_BETTER = ("rmse", "mae")


def task_loss(dataset, out, labels) -> torch.Tensor:
    """The training loss of ``dataset``'s task, a scalar.

    Cross-entropy over classes (``task == "multiclass"``, TU), binary
    cross-entropy on each task's logit (``"binary"``, OGB) or squared
    error (``"regression"``, OGB); the last two over the labelled entries
    only (NaN labels masked, as OGB's examples do).

    Parameters
    ----------
    dataset : GraphDataset
        Gives ``task``.
    out : torch.Tensor
        Model output, ``(num_graphs, num_classes)``.
    labels : torch.Tensor
        ``(num_graphs,)`` classes or ``(num_graphs, num_tasks)`` values, on
        ``out``'s device.
    """
    if dataset.task == "multiclass":
        return F.cross_entropy(out, labels)
    labelled = ~torch.isnan(labels)
    if not bool(labelled.any()):
        return out.sum() * 0.0
    if dataset.task == "binary":
        return F.binary_cross_entropy_with_logits(out[labelled],
                                                  labels[labelled])
    return F.mse_loss(out[labelled], labels[labelled])


def _score(dataset, out, labels) -> float:
    """Accuracy, or OGB's Evaluator's metric on the raw outputs (logits
    of each task, or the regressed values)."""
    if dataset.evaluator is None:
        if labels.numel() == 0:
            return 0.0
        return float((out.argmax(-1) == labels).double().mean())
    return float(dataset.evaluator.eval(
        {"y_true": labels, "y_pred": out})[dataset.metric])


def selection_sign(metric: str) -> float:
    """+1 where a higher ``metric`` is better, -1 where lower is (RMSE)."""
    return -1.0 if metric in LOWER_IS_BETTER else 1.0


@torch.no_grad()
def evaluate(model, dataset, ids, device, batch_size=512) -> dict:
    """Loss and metric of ``model`` on the graphs ``ids`` (eval mode).

    Returns
    -------
    dict
        ``loss`` (mean `task_loss`) and ``metric`` (accuracy or OGB's).
    """
    model.eval()
    outs, labels = [], []
    for start in range(0, len(ids), batch_size):
        graph, feat, y = dataset.batch(ids[start:start + batch_size])
        outs.append(model(graph, feat.to(device)).cpu())
        labels.append(y)
    if not outs:
        return {"loss": 0.0, "metric": 0.0}
    outs, labels = torch.cat(outs), torch.cat(labels)
    return {"loss": float(task_loss(dataset, outs, labels)),
            "metric": _score(dataset, outs, labels)}


_ALIGN_BYTES = 64  # PyTorch's CPU allocator's alignment


def flat_parameters(model: torch.nn.Module) -> torch.nn.Parameter:
    """``model``'s parameters as views of one, for one optimizer update.

    PyTorch 2.2's Adam costs some 60 us per parameter tensor and step on
    the CPU (for-loop and ``foreach`` alike): 2.9 ms of HAP's 48 tensors,
    a tenth of its step at batch 32. Over one flat parameter it is one
    update of the same elementwise math (the same bits, as long as every
    parameter gets a gradient each step, as every pooling model's does).
    Each parameter and its gradient become views of the flat parameter
    and its gradient, each starting 64-byte aligned as a tensor of its own
    would (GEMM kernels round by alignment on AVX-512; the gaps stay
    zero), which backward accumulates into in place; zero it
    with ``flat.grad.zero_()`` (setting it to None would end the views).
    Call after moving the model to its device.

    Returns
    -------
    torch.nn.Parameter
        The flat parameter, its gradient zero.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) != 1:
        raise ValueError(f"flat_parameters needs one dtype and device; got "
                         f"{sorted(map(str, kinds))}")
    # Each view starts 64-byte aligned, as a tensor of its own would:
    # vectorised kernels (MKL's GEMM on AVX-512) round by alignment.
    step = max(1, _ALIGN_BYTES // params[0].element_size())
    starts, end = [], 0
    for p in params:
        starts.append(end)
        end += -(-p.numel() // step) * step
    flat = torch.nn.Parameter(params[0].new_zeros(end))
    flat.grad = torch.zeros_like(flat)
    for p, start in zip(params, starts, strict=True):
        flat.data[start:start + p.numel()] = p.detach().reshape(-1)
        p.data = flat.data[start:start + p.numel()].view_as(p)
        p.grad = flat.grad[start:start + p.numel()].view_as(p)
    return flat


def _build_model(config, dataset) -> torch.nn.Module:
    from hmgraph.models.pooling import build_pooling_model

    return build_pooling_model(
        config.model, dataset.feat_dim, config.hidden, dataset.num_classes,
        num_levels=config.levels, dropout=config.dropout, ratio=config.ratio,
        max_nodes=dataset.max_nodes)


def check_model_memory(config, dataset) -> int:
    """Refuse a model whose training state does not fit the device's free
    memory, before a fold trains (see `hmgraph.train.check_model_memory`).

    Returns
    -------
    int
        Bytes of training state.

    Raises
    ------
    ValueError
        ``--hidden 100000000: training the model needs ...; use a smaller
        --hidden`` (``--hidden`` and ``--levels``, which size the model).
    """
    from hmgraph.train import check_model_memory as check

    return check(lambda: _build_model(config, dataset), config.device,
                 {"--hidden": config.hidden, "--levels": config.levels})


class TargetScale(torch.nn.Module):
    """A regressor whose outputs are ``model(...) * std + mean``.

    The model learns standardised targets (its head starts near 0, the
    training targets' mean), while the loss, the selection and OGB's
    Evaluator all see values in the targets' own units. ``mean`` and
    ``std`` (per task, from the training graphs' labelled values) are
    buffers, saved with the weights.
    """

    def __init__(self, model, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())

    def forward(self, graph, feat):
        """See the wrapped model's ``forward``; outputs rescaled."""
        return self.model(graph, feat) * self.std + self.mean

    @property
    def auxiliary_loss(self):
        """The wrapped model's ``auxiliary_loss``."""
        return self.model.auxiliary_loss


def target_scale(dataset, train_ids) -> tuple:
    """Per task, the mean and std (1 where 0 or unknown) of the labelled
    training targets of a regression ``dataset``."""
    y = dataset.labels[train_ids].double()
    seen = ~torch.isnan(y)
    count = seen.sum(0).clamp(min=1)
    mean = torch.where(seen, y, 0.0).sum(0) / count
    var = torch.where(seen, (y - mean) ** 2, 0.0).sum(0) / count
    std = var.sqrt()
    return mean, torch.where(std > 0, std, torch.ones_like(std))


class Ensemble(torch.nn.Module):
    """The mean prediction of ``models``, as one model's outputs.

    Multiclass: the log of the mean class probabilities (logits whose
    softmax is that mean); binary: the logit of the mean probability;
    regression: the mean value. `evaluate` scores it as any model.
    """

    def __init__(self, models, task: str):
        super().__init__()
        self.members = torch.nn.ModuleList(models)
        self.task = task

    def forward(self, graph, feat):
        """The members' outputs, averaged as the task's predictions."""
        outs = torch.stack([m(graph, feat) for m in self.members])
        if self.task == "multiclass":
            return torch.softmax(outs, -1).mean(0).clamp_min(1e-12).log()
        if self.task == "binary":
            return torch.logit(torch.sigmoid(outs).mean(0), eps=1e-7)
        return outs.mean(0)


class _Trainer:
    """One model, its flat Adam and its training graphs; `epoch` trains
    one epoch of mini-batches in the order seeded with ``seed + epoch``.
    A regressor learns standardised targets (`TargetScale`)."""

    def __init__(self, config, dataset, train_ids, seed, device):
        torch.manual_seed(seed)
        self.config, self.dataset, self.device = config, dataset, device
        self.train_ids, self.seed = train_ids, seed
        self.model = _build_model(config, dataset)
        if dataset.task == "regression":
            self.model = TargetScale(self.model,
                                     *target_scale(dataset, train_ids))
        self.model = self.model.to(device)
        self.flat = flat_parameters(self.model)
        self.optimizer = torch.optim.Adam([self.flat], lr=config.lr,
                                          weight_decay=config.weight_decay)

    def epoch(self, epoch: int) -> float:
        """Train one epoch; returns the mean training loss."""
        config, model, ids = self.config, self.model, self.train_ids
        model.train()
        order = torch.randperm(len(ids), generator=torch.Generator()
                               .manual_seed(self.seed + epoch))
        total, count = 0.0, 0
        # A last batch of one graph joins the one before: a graph of one
        # node would be a batch-norm batch of one (ogbg-molfreesolv's
        # 513 training graphs at batch 128 end on methane).
        starts = list(range(0, len(order), config.batch_size))
        if len(starts) > 1 and len(order) - starts[-1] == 1:
            starts.pop()
        for i, j in zip(starts, starts[1:] + [len(order)], strict=True):
            graph, feat, y = self.dataset.batch(ids[order[i:j]])
            out = model(graph, feat.to(self.device))
            loss = task_loss(self.dataset, out, y.to(self.device)) \
                + model.auxiliary_loss
            self.flat.grad.zero_()
            loss.backward()
            if config.clip > 0:
                torch.nn.utils.clip_grad_norm_([self.flat], config.clip)
            self.optimizer.step()
            total += float(loss) * len(y)
            count += len(y)
        return total / max(count, 1)


def inner_splits(dataset, ids: torch.Tensor, folds: int, seed: int):
    """``folds`` inner (train, valid) splits of the graphs ``ids``:
    stratified k-fold over their classes where every class has ``folds``
    graphs, else plain k-fold; seeded with ``seed``."""
    import numpy as np
    from sklearn.model_selection import KFold, StratifiedKFold

    if not 2 <= folds <= len(ids):
        raise ValueError(f"inner_folds must be in [2, {len(ids)}] (the "
                         f"training graphs); got {folds}")
    y = dataset.labels[ids].numpy() if dataset.task == "multiclass" \
        else np.zeros(len(ids), dtype=np.int64)
    counts = np.bincount(y)
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed) \
        if counts[counts > 0].min() >= folds else \
        KFold(folds, shuffle=True, random_state=seed)
    return [(ids[torch.as_tensor(np.sort(a))], ids[torch.as_tensor(
        np.sort(b))]) for a, b in splitter.split(np.zeros(len(ids)), y)]


def _select_epochs(config, dataset, trainers, valid_sets, device, bar,
                   fold) -> dict:
    """Train ``trainers`` in lockstep, each scored after every epoch on
    its validation set; pick the epoch on their mean curve, smoothed.

    The curve of an epoch is the mean over trainers of the validation
    metric and loss; ``config.smooth`` > 1 averages it over the last
    ``smooth`` epochs (fewer at the start). The best epoch has the best
    smoothed metric (`selection_sign`), ties broken by the lower smoothed
    loss; training stops after ``patience`` epochs without a better one.

    Returns
    -------
    dict
        ``best_epoch``, ``valid`` and ``valid_loss`` (smoothed, at the
        best epoch), ``history`` and ``states`` (each trainer's weights
        at the best epoch).
    """
    sign = selection_sign(dataset.metric)
    best, states, history, stale, best_epoch = None, None, [], 0, 0
    for epoch in range(config.epochs):
        # (1) One epoch each, then validation only.
        began = time.perf_counter()
        losses = [t.epoch(epoch) for t in trainers]
        scores = [evaluate(t.model, dataset, ids, device)
                  for t, ids in zip(trainers, valid_sets, strict=True)]
        history.append({
            "epoch": epoch, "loss": sum(losses) / len(losses),
            "valid_loss": sum(v["loss"] for v in scores) / len(scores),
            "valid": sum(v["metric"] for v in scores) / len(scores),
            "seconds": time.perf_counter() - began})
        # (2) The smoothed curve picks the epoch; patience stops.
        window = history[-config.smooth:]
        metric = sum(h["valid"] for h in window) / len(window)
        loss = sum(h["valid_loss"] for h in window) / len(window)
        if config.smooth > 1:
            history[-1].update(valid_smoothed=metric,
                               valid_loss_smoothed=loss)
        key = (sign * metric, -loss)
        if best is None or key > best:
            best, stale, best_epoch = key, 0, epoch
            states = [copy.deepcopy(t.model.state_dict()) for t in trainers]
        else:
            stale += 1
        bar.update(1)
        bar.set_postfix(fold=fold, loss=f"{history[-1]['loss']:.3f}",
                        valid=f"{history[-1]['valid']:.3f}")
        if stale >= config.patience:
            bar.update(config.epochs - epoch - 1)
            break
    return {"best_epoch": best_epoch, "valid": sign * best[0],
            "valid_loss": -best[1], "history": history, "states": states}


def _train_fold(config, dataset, split, fold, device, bar) -> dict:
    """One outer fold under ``config.selection`` (see `SELECTIONS`)."""
    seed = config.seed + 1000 * fold
    start = time.perf_counter()
    extra = {}
    if config.selection.startswith("inner") and dataset.split is None:
        # (1) Inner k-fold over train + valid picks the epoch count...
        outer = torch.cat([split["train"], split["valid"]]).sort().values
        inner = inner_splits(dataset, outer, config.inner_folds, seed)
        trainers = [_Trainer(config, dataset, tr, seed + 100 * (j + 1),
                             device) for j, (tr, _) in enumerate(inner)]
        picked = _select_epochs(config, dataset, trainers,
                                [va for _, va in inner], device, bar, fold)
        for trainer, state in zip(trainers, picked["states"], strict=True):
            trainer.model.load_state_dict(state)
        # (2) ...and the inner models at that epoch predict together
        # ("inner"), or one model trains on all of it for that many
        # epochs ("inner-retrain"; the ensemble's score kept beside).
        model = Ensemble([t.model for t in trainers], dataset.task)
        if config.selection == "inner-retrain":
            extra["test_ensemble"] = evaluate(model, dataset, split["test"],
                                              device)["metric"]
            final = _Trainer(config, dataset, outer, seed, device)
            for epoch in range(picked["best_epoch"] + 1):
                final.epoch(epoch)
            model = final.model
        sizes = {"train": int(outer.numel()),
                 "inner_valid": int(inner[0][1].numel()),
                 "test": int(split["test"].numel())}
    else:
        # (1) Hold-out: the valid set picks the epoch and stops training.
        trainer = _Trainer(config, dataset, split["train"], seed, device)
        picked = _select_epochs(config, dataset, [trainer], [split["valid"]],
                                device, bar, fold)
        model = trainer.model
        model.load_state_dict(picked["states"][0])
        sizes = {k: int(v.numel()) for k, v in split.items()}
    # (3) The picked model, scored once on the test fold.
    test = evaluate(model, dataset, split["test"], device)
    return {"fold": fold, "best_epoch": picked["best_epoch"],
            "epochs_run": len(picked["history"]), "valid": picked["valid"],
            "valid_loss": picked["valid_loss"], "test": test["metric"],
            "test_loss": test["loss"],
            "seconds": time.perf_counter() - start,
            "sizes": sizes, "history": picked["history"], **extra}


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
    from hmgraph.models.pooling import POOLING_MODELS, default_dropout

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
    device = torch.device(config.device)
    if dataset is None:
        dataset = load_graph_dataset(config.dataset, config.root)
    if config.smooth is None:
        config = dataclasses.replace(
            config, smooth=1 if dataset.split is not None else SMOOTH_CV)
    if config.dropout is None:
        config = dataclasses.replace(config,
                                     dropout=default_dropout(config.model))
    check_model_memory(config, dataset)
    # (1) Splits: stratified folds, or the official split repeated.
    if dataset.split is not None:
        splits = [dataset.split] * config.folds
        protocol = (f"official split, {config.folds} seeds; epoch picked "
                    f"and early stopping on its valid")
    else:
        splits = make_folds(dataset.labels, config.folds, config.seed)
        if config.selection.startswith("inner"):
            final = ("the inner models at that epoch, their mean "
                     "prediction, are scored on test"
                     if config.selection == "inner" else
                     "then one model trains on the whole training fold "
                     "for that many epochs and is scored on test")
            protocol = (f"stratified {config.folds}-fold CV; per fold, an "
                        f"inner stratified {config.inner_folds}-fold CV of "
                        f"the training fold picks the epoch count on its "
                        f"mean validation curve (early stopping on it); "
                        f"{final}")
        else:
            protocol = (f"stratified {config.folds}-fold CV, valid carved "
                        f"from each training fold (8:1:1 at 10 folds); "
                        f"epoch picked and early stopping on valid")
    if config.smooth > 1:
        protocol += (f"; validation curve smoothed (trailing mean of "
                     f"{config.smooth} epochs)")
    if config.clip > 0:
        protocol += f"; gradient norm clipped at {config.clip:g}"
    if config.max_folds:
        splits = splits[:config.max_folds]
        protocol += f"; first {len(splits)} of {config.folds} folds run"
    # (2) One model per fold.
    records = []
    bar = tqdm(total=len(splits) * config.epochs,
               desc=f"{dataset.name} {config.model}", unit="epoch",
               disable=not config.progress, leave=False)
    with bar:
        for fold, split in enumerate(splits):
            kept = _kept_fold(config, fold) if config.resume else None
            if kept is not None:
                records.append(dict(kept, resumed=True))
                bar.update(config.epochs)
                log.info("%s %s fold %d: kept in %s", dataset.name,
                         config.model, fold, _fold_path(config, fold))
                continue
            records.append(_train_fold(config, dataset, split, fold,
                                       device, bar))
            _keep_fold(config, records[-1])
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

    lines = [
        f"# {result['dataset']['name']}: {result['config']['model']}",
        "",
        f"Protocol: {result['protocol']}.",
        "",
        f"| fold |{' pick |' if grid else ''} best epoch | epochs | "
        f"valid {unit} | test {unit} | s |",
        f"|---:|{'---|' if grid else ''}---:|---:|---:|---:|---:|",
    ]
    for r in result["folds"]:
        pick = f" {r['pick']} |" if grid else ""
        lines.append(f"| {r['fold']} |{pick} {r['best_epoch']} | "
                     f"{r['epochs_run']}"
                     f" | {fmt(r['valid'])} | {fmt(r['test'])} | "
                     f"{r['seconds']:.1f} |")
    lines.append(
        f"| **mean ± std** |{' |' if grid else ''} | "
        f"{summary['epochs_mean']:.1f} | "
        f"{fmt(summary['valid_mean'])} | **{fmt(summary['test_mean'])} ± "
        f"{fmt(summary['test_std'])}** | {summary['seconds']:.1f} |")
    if grid:
        lines += ["", f"| configuration | folds picked | valid {unit} | "
                  f"test {unit} (no selection) |", "|---|---:|---:|---:|"]
        lines += [f"| {r['name']} | {result['picks'].get(r['name'], 0)} | "
                  f"{fmt(r['summary']['valid_mean'])} | "
                  f"{fmt(r['summary']['test_mean'])} ± "
                  f"{fmt(r['summary']['test_std'])} |"
                  for r in result["runs"]]
    return "\n".join(lines) + "\n"


def add_parser(commands):
    """Add the ``classify`` subcommand to an argparse subparsers object.

    Returns the new parser; `command` runs it.
    """
    from hmgraph.args import (
        device_name,
        fraction,
        non_negative_float,
        non_negative_int,
        positive_int,
    )
    from hmgraph.models.pooling import POOLING_MODELS

    parser = commands.add_parser(
        "classify", help="graph classification with pooling models",
        description="Cross-validate a graph classifier (HAP or a pooling "
        "baseline) on a TU dataset (stratified k-fold, validation carved "
        "from each training fold) or an OGB graph dataset (official split); "
        "writes JSON and a markdown table.",
    )
    parser.add_argument("--dataset", default="MUTAG",
                        help="TU folder under --root (MUTAG, PROTEINS, "
                        "NCI1, ENZYMES, ...) or an OGB molecule set "
                        "(ogbg-molbace, ogbg-molesol, ogbg-moltox21, ...)")
    parser.add_argument("--root", default="data",
                        help="folder holding the datasets")
    parser.add_argument("--model", default="hap",
                        choices=sorted(POOLING_MODELS))
    parser.add_argument("--folds", type=positive_int, default=10)
    parser.add_argument("--max-folds", type=non_negative_int, default=0,
                        help="run only the first N folds (default: all)")
    parser.add_argument("--epochs", type=positive_int, default=100)
    parser.add_argument("--patience", type=positive_int, default=20)
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--levels", type=positive_int, default=3,
                        help="readout levels (GIN: layers)")
    parser.add_argument("--ratio", type=float, default=None,
                        help="pooling ratio in (0, 1] (default: the "
                        "model's)")
    parser.add_argument("--dropout", type=fraction, default=None,
                        help="classifier-head dropout (default: the "
                        "model's, 0 for hap, 0.5 for the baselines)")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="cpu, cuda or cuda:N")
    parser.add_argument("--selection", choices=SELECTIONS,
                        default=ClassifyConfig.selection,
                        help="how the epoch is picked on cross-validated "
                        "sets: inner (inner k-fold of the training fold, "
                        "the inner models predict together), "
                        "inner-retrain (the same, then one model trained "
                        "on all of it) or holdout (one carved validation "
                        "set); official splits use their own valid")
    parser.add_argument("--smooth", type=positive_int, default=None,
                        help="pick the epoch on the trailing mean of this "
                        f"many epochs of the validation curve (default: "
                        f"{SMOOTH_CV} on cross-validation, 1 on an official "
                        f"split, as OGB's protocol)")
    parser.add_argument("--inner-folds", type=positive_int,
                        default=ClassifyConfig.inner_folds,
                        help="inner folds of --selection inner (>= 2)")
    parser.add_argument("--clip", type=non_negative_float, default=0.0,
                        help="clip the gradient norm (0: no clipping)")
    parser.add_argument("--out", default=None,
                        help="output folder (default runs/classify-DATASET-"
                        "MODEL)")
    parser.add_argument("--grid", default="",
                        help="search, e.g. 'batch_size=32,128;dropout=0,0.5'"
                        ": every configuration cross-validated, per fold "
                        "the best on validation scored on test (keys: "
                        "batch_size, dropout, lr, hidden, weight_decay)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the folds a killed run left in --out "
                        "(same settings)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def command(args) -> int:
    """Run ``hmgraph classify``; print the markdown table. Returns 0.

    Raises
    ------
    ValueError
        A bad value (the CLI prints it as one line).
    """
    from hmgraph.args import check_out_folder

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
    config = ClassifyConfig(
        dataset=args.dataset, root=args.root, model=args.model,
        folds=args.folds, max_folds=args.max_folds, epochs=args.epochs,
        patience=args.patience, batch_size=args.batch_size,
        hidden=args.hidden, levels=args.levels, ratio=args.ratio,
        dropout=args.dropout, lr=args.lr, weight_decay=args.weight_decay,
        seed=args.seed, device=args.device, selection=args.selection,
        smooth=args.smooth, inner_folds=args.inner_folds, clip=args.clip,
        out=out, progress=not args.no_progress, resume=args.resume,
    )
    result = run_grid(config, grid) if grid else run(config)
    print(format_markdown(result), end="")
    print(f"results: {result['path']}")
    return 0

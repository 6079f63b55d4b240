"""The protocol of ``hmgraph classify``: outer folds, the epoch picked
without the test fold (inner k-fold or a hold-out), the picked model
scored once on the test fold (see `hmgraph.classify`).
"""

from __future__ import annotations

import copy
import time

import torch

from hmgraph.graph_training import (
    Ensemble,
    Trainer,
    evaluate,
    selection_sign,
)

__all__ = ["inner_splits", "make_folds", "outer_splits", "select_epochs",
           "train_fold"]


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
    # Lazy: scikit-learn takes a second to import, and every hmgraph
    # command imports this module through the CLI.
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
        from sklearn.model_selection import KFold  # lazy, as above
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



def inner_splits(dataset, ids: torch.Tensor, folds: int, seed: int):
    """``folds`` inner (train, valid) splits of the graphs ``ids``:
    stratified k-fold over their classes where every class has ``folds``
    graphs, else plain k-fold; seeded with ``seed``."""
    # Lazy, as in make_folds: scikit-learn is slow to import.
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


def select_epochs(config, dataset, trainers, valid_sets, device, bar,
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


def train_fold(config, dataset, split, fold, device, bar) -> dict:
    """One outer fold under ``config.selection`` (see `SELECTIONS`)."""
    seed = config.seed + 1000 * fold
    start = time.perf_counter()
    extra = {}
    if config.selection.startswith("inner") and dataset.split is None:
        # (1) Inner k-fold over train + valid picks the epoch count...
        outer = torch.cat([split["train"], split["valid"]]).sort().values
        inner = inner_splits(dataset, outer, config.inner_folds, seed)
        trainers = [Trainer(config, dataset, tr, seed + 100 * (j + 1),
                             device) for j, (tr, _) in enumerate(inner)]
        picked = select_epochs(config, dataset, trainers,
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
            final = Trainer(config, dataset, outer, seed, device)
            for epoch in range(picked["best_epoch"] + 1):
                final.epoch(epoch)
            model = final.model
        sizes = {"train": int(outer.numel()),
                 "inner_valid": int(inner[0][1].numel()),
                 "test": int(split["test"].numel())}
    else:
        # (1) Hold-out: the valid set picks the epoch and stops training.
        trainer = Trainer(config, dataset, split["train"], seed, device)
        picked = select_epochs(config, dataset, [trainer], [split["valid"]],
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



def outer_splits(config, dataset) -> tuple[list[dict], str]:
    """The outer folds of ``config`` and the protocol, in words.

    Stratified folds of ``dataset`` (`make_folds`), or its official split
    repeated ``config.folds`` times; only the first ``max_folds`` where
    that is set. ``config.smooth`` is resolved already.

    Returns
    -------
    splits : list of dict
        Per fold ``train``, ``valid`` and ``test`` graph ids.
    protocol : str
        How the epoch is picked and the model scored, for the result.
    """
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
    return splits, protocol

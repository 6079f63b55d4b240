"""Model selection for graph classification: a grid of settings, each
cross-validated on the same folds, and per fold the setting with the best
validation score, scored once on that fold's test set (Errica et al.'s
selection on an inner hold-out; the GIN paper's grid of batch size and
dropout is ``"batch_size=32,128;dropout=0,0.5"``).

``hmgraph classify --grid ...`` runs it (`hmgraph.classify.run_grid`);
``bench/pooling.py`` runs the same selection over many datasets and
models.
"""

from __future__ import annotations

import argparse
import itertools

from hmgraph.args import (
    fraction,
    non_negative_float,
    positive_float,
    positive_int,
)

__all__ = ["GRID_KEYS", "config_name", "parse_grid", "select_per_fold"]

#: Settings a grid may vary, each with its parser (as the CLI's flag).
GRID_KEYS = {"batch_size": positive_int, "dropout": fraction,
             "lr": positive_float, "hidden": positive_int,
             "weight_decay": non_negative_float}


def parse_grid(text: str) -> list[dict]:
    """The configurations of a grid, its axes' product in order.

    Parameters
    ----------
    text : str
        ``KEY=V1,V2`` axes joined by ``;``, e.g.
        ``"batch_size=32,128;dropout=0,0.5"``; keys from `GRID_KEYS`.

    Returns
    -------
    list of dict
        One ``{key: value}`` per configuration (``[{}]`` for an empty
        grid).

    Raises
    ------
    ValueError
        One line naming the bad axis: not ``KEY=V1,V2``, an unknown key, a
        repeated key, a value its flag would refuse (``lr=inf``) or a value
        given twice (``batch_size=32,32``: two runs into one folder).
    """
    axes = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, values = part.partition("=")
        if key not in GRID_KEYS or not values or key in axes:
            raise ValueError(f"grid axis {part!r} is not KEY=V1,V2 with KEY "
                             f"one of {', '.join(GRID_KEYS)}, each once")
        try:
            axes[key] = [GRID_KEYS[key](v) for v in values.split(",")]
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"grid axis {part!r}: {err}") from None
        names = [f"{value:g}" for value in axes[key]]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"grid axis {part!r}: {key}={twice} is given "
                             f"twice; give each value once")
    return [dict(zip(axes, combo, strict=True))
            for combo in itertools.product(*axes.values())]


def config_name(overrides: dict) -> str:
    """``{"batch_size": 32, "dropout": 0.5}`` -> ``"batch_size=32
    dropout=0.5"`` (``"fixed"`` for no override)."""
    return " ".join(f"{k}={v:g}" for k, v in overrides.items()) or "fixed"


def select_per_fold(runs: list[dict]) -> dict:
    """Per fold, the run with the best validation score.

    Parameters
    ----------
    runs : list of dict
        Results of `hmgraph.classify.run` for the configurations of one
        grid, in grid order, each with a ``name`` (and the ``metric``:
        ``rmse`` and ``mae`` pick the lowest). Ties on validation go to
        the lower validation loss, then to the earlier configuration; the
        test score never decides.

    Returns
    -------
    dict
        ``records`` (per fold, the picked run's fold record), ``chosen``
        (per fold, the index of its pick in ``runs``) and ``picks`` (folds
        won per configuration name), over the folds that every run has.
    """
    folds = min((len(r["folds"]) for r in runs), default=0)
    sign = -1 if runs and runs[0].get("metric") in ("rmse", "mae") else 1
    picks, chosen, records = {}, [], []
    for fold in range(folds):
        index = max(range(len(runs)), key=lambda i: (
            sign * runs[i]["folds"][fold]["valid"],
            -runs[i]["folds"][fold]["valid_loss"], -i))
        chosen.append(index)
        records.append(runs[index]["folds"][fold])
        picks[runs[index]["name"]] = picks.get(runs[index]["name"], 0) + 1
    return {"records": records, "chosen": chosen, "picks": picks}

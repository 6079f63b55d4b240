"""Settings of graph classification (``hmgraph classify``), one dataclass
per concern; `ClassifyConfig` is their union.

The seed, the device and the data root are `RunSettings`' own; the rest
differ from node classification's in default or meaning and are declared
here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hmgraph.args import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from hmgraph.settings.fields import same_as, setting
from hmgraph.settings.nodes import RunSettings

__all__ = ["SELECTIONS", "SMOOTH_CV", "ClassifyConfig", "GraphModelSettings",
           "GraphRunSettings", "GraphTrainingSettings", "ProtocolSettings",
           "pooling_models"]

#: Default smoothing of the validation curve on cross-validated sets.
SMOOTH_CV = 5
#: Epoch selections (`ClassifyConfig.selection`).
SELECTIONS = ("inner", "inner-retrain", "holdout")


def pooling_models() -> list[str]:
    """The graph classification models, sorted."""
    # Lazy: the pooling models load DGL (4 s).
    from hmgraph.models.pooling import POOLING_MODELS

    return sorted(POOLING_MODELS)


@dataclass
class GraphRunSettings:
    """The job: the data and where the results go.

    Attributes
    ----------
    dataset : str
        A TU folder name under ``root`` (``MUTAG``) or an OGB name
        (``ogbg-molbace``).
    resume : bool
        Reuse the folds an earlier run left in ``out/folds`` (same
        settings, `hmgraph.fold_records.FOLD_KEYS`; another setting is
        refused).
    """

    dataset: str = setting(
        "MUTAG", "TU folder under --root (MUTAG, PROTEINS, NCI1, ENZYMES, "
        "...) or an OGB molecule set (ogbg-molbace, ogbg-molesol, "
        "ogbg-moltox21, ...)")
    root: str = same_as(RunSettings, "root")
    seed: int = same_as(RunSettings, "seed")
    device: str = same_as(RunSettings, "device")
    out: str = setting(
        "runs/classify",
        "output folder (default runs/classify-DATASET-MODEL)")
    progress: bool = same_as(RunSettings, "progress")
    resume: bool = setting(
        False, "reuse the folds a killed run left in --out (same settings)")


@dataclass
class GraphModelSettings:
    """The pooling model (a key of `hmgraph.models.pooling.POOLING_MODELS`).

    Attributes
    ----------
    ratio : float or None
        Pooling ratio; None takes the model's default.
    dropout : float or None
        Classifier-head dropout; None takes the model's default
        (`hmgraph.models.pooling.default_dropout`: 0 for HAP, 0.5 for
        the baselines).
    """

    model: str = setting("hap", choices=pooling_models)
    hidden: int = setting(64, type=positive_int)
    levels: int = setting(3, "readout levels (GIN: layers)",
                          type=positive_int)
    ratio: float | None = setting(
        None, "pooling ratio in (0, 1] (default: the model's)", type=float)
    dropout: float | None = setting(
        None, "classifier-head dropout (default: the model's, 0 for hap, "
        "0.5 for the baselines)", type=fraction)


@dataclass
class GraphTrainingSettings:
    """Optimisation: Adam on mini-batches of graphs.

    Attributes
    ----------
    epochs, patience : int
        Epoch cap and early-stopping patience (on validation).
    clip : float
        Gradient-norm clip (0: none).
    """

    epochs: int = setting(100, type=positive_int)
    patience: int = setting(20, type=positive_int)
    batch_size: int = setting(128, type=positive_int)
    lr: float = setting(0.001, type=float)
    weight_decay: float = setting(0.0, type=float)
    clip: float = setting(0.0, "clip the gradient norm (0: no clipping)",
                          type=non_negative_float)


@dataclass
class ProtocolSettings:
    """How the model is selected and scored.

    Attributes
    ----------
    folds : int
        Cross-validation folds (or seeds on an official split).
    max_folds : int
        Run only the first this many folds (0: all); the summary says so.
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
    """

    folds: int = setting(10, type=positive_int)
    max_folds: int = setting(0, "run only the first N folds (default: all)",
                             type=non_negative_int)
    selection: str = setting(
        "inner", "how the epoch is picked on cross-validated sets: inner "
        "(inner k-fold of the training fold, the inner models predict "
        "together), inner-retrain (the same, then one model trained on all "
        "of it) or holdout (one carved validation set); official splits "
        "use their own valid", choices=SELECTIONS)
    smooth: int | None = setting(
        None, f"pick the epoch on the trailing mean of this many epochs of "
        f"the validation curve (default: {SMOOTH_CV} on cross-validation, 1 "
        f"on an official split, as OGB's protocol)", type=positive_int)
    inner_folds: int = setting(3, "inner folds of --selection inner (>= 2)",
                               type=positive_int)


@dataclass
class ClassifyConfig(ProtocolSettings, GraphTrainingSettings,
                     GraphModelSettings, GraphRunSettings):
    """Settings of one cross-validated run (all JSON-serialisable): the
    fields of `GraphRunSettings`, `GraphModelSettings`,
    `GraphTrainingSettings` and `ProtocolSettings`, in that order."""

    def as_dict(self) -> dict:
        """The settings as a plain dict."""
        return dataclasses.asdict(self)

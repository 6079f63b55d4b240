"""Tuned training settings per dataset family, for ``hmgraph train``.

One table, `FAMILY_DEFAULTS`, holds the settings ``hmgraph train`` uses
for every tuning flag the user does not pass; `MODEL_DEFAULTS` and
`DATASET_DEFAULTS` refine it for one model or one dataset. A flag given on
the command line always wins, flag by flag (see `resolve`).

- ``planetoid`` (cora, citeseer, pubmed): Kipf & Welling's GCN setup (2
  layers, hidden 16, dropout 0.5 on the input and hidden layer, lr 0.01,
  weight decay 5e-4, 200 epochs) with full neighbourhoods, so one batch of
  the 140 / 120 / 60 training nodes is full-batch training; GAT as in its
  paper (8 heads of 8 features, dropout 0.6 on inputs, hidden layer and
  attention, lr 0.005).
- ``ogb`` (ogbn-*): the OGB leaderboard's reference GraphSAGE with neighbour
  sampling on ogbn-products (3 layers, 15/10/5 neighbours from the seeds
  outwards, i.e. DGL fanouts ``5,10,15``; batch 1024, hidden 256, dropout
  0.5, lr 0.003, 20 epochs); ogbn-arxiv takes the reference GCN's lr 0.01.
- ``synthetic`` (synth-*): the products-scale settings hmgraph's
  benchmarks use (batch 1024, lr 0.003, 5 epochs), meant for a large
  train split (synth-products: 192,000 nodes, 188 batches an epoch). Two
  sets with few training nodes take more steps, as measured with
  GraphSAGE over seeds 0-4 (README, "Defaults per dataset"): synth-tiny
  (1,000 train nodes, one batch of 1024 an epoch: 44.9 % test accuracy
  after 5 epochs, 82.0 % still climbing at 30) takes batch 256 and 25
  epochs (84.6 %, the best measured); synth-small (20,000 train nodes, 20
  batches: 77 % after 5 epochs) takes 8 epochs (84.6 %, 85.0 % at 12).
  synth-igb and synth-igb-large also have about 20 batches an epoch but
  were not measured.

Examples
--------
>>> settings, defaulted = resolve("cora", "gcn", {"lr": 0.02})
>>> settings["hidden"], settings["lr"], "lr" in defaulted
(16, 0.02, False)
"""

from __future__ import annotations

from hmgraph.datasets import known_datasets
from hmgraph.datasets.planetoid import PLANETOID
from hmgraph.settings import TrainConfig, default_of

__all__ = [
    "DATASET_DEFAULTS",
    "FAMILY_DEFAULTS",
    "MODEL_DEFAULTS",
    "TUNED",
    "describe",
    "family",
    "fit_fanouts",
    "resolve",
]

#: The settings the table sets, in the order `describe` prints them.
TUNED = ("fanouts", "batch_size", "hidden", "dropout", "input_dropout",
         "attn_dropout", "lr", "weight_decay", "num_heads", "epochs")

# `TrainConfig`'s own defaults: the products-scale settings.
_PRODUCTS_SCALE = {name: default_of(TrainConfig, name) for name in TUNED}

#: Settings per dataset family; every family sets every name in `TUNED`.
FAMILY_DEFAULTS = {
    "planetoid": {
        "fanouts": [-1, -1], "batch_size": 1024, "hidden": 16,
        "dropout": 0.5, "input_dropout": 0.5, "attn_dropout": 0.0,
        "lr": 0.01, "weight_decay": 5e-4, "num_heads": 4, "epochs": 200,
    },
    "ogb": dict(_PRODUCTS_SCALE, fanouts=[5, 10, 15], epochs=20),
    "synthetic": dict(_PRODUCTS_SCALE),
}

#: Refinements for one model in one family.
MODEL_DEFAULTS = {
    ("planetoid", "gat"): {
        "hidden": 64, "num_heads": 8, "dropout": 0.6, "input_dropout": 0.6,
        "attn_dropout": 0.6, "lr": 0.005,
    },
}

#: Refinements for one dataset, any model.
DATASET_DEFAULTS = {
    "ogbn-arxiv": {"lr": 0.01},
    # Few training nodes: more steps to converge (README, measured).
    "synth-tiny": {"batch_size": 256, "epochs": 25},
    "synth-small": {"epochs": 8},
}


def family(dataset: str) -> str:
    """The family of a dataset name: planetoid, ogb or synthetic.

    Raises
    ------
    ValueError
        An unknown dataset; the message lists the known ones.
    """
    if dataset not in known_datasets():
        raise ValueError(f"unknown dataset {dataset!r}; known: "
                         f"{', '.join(known_datasets())}")
    if dataset in PLANETOID:
        return "planetoid"
    if dataset.startswith("ogbn-"):
        return "ogb"
    return "synthetic"


def fit_fanouts(fanouts: list[int], layers: int) -> list[int]:
    """Default fanouts for ``layers`` layers.

    Keeps the last ``layers`` entries (the hops nearest the seeds) or
    repeats the first entry in front until there are ``layers``.

    Examples
    --------
    >>> fit_fanouts([15, 10, 5], 2), fit_fanouts([-1, -1], 3)
    ([10, 5], [-1, -1, -1])
    """
    if layers < 1:
        raise ValueError(f"layers must be positive; got {layers!r}")
    if layers <= len(fanouts):
        return list(fanouts[len(fanouts) - layers:])
    return [fanouts[0]] * (layers - len(fanouts)) + list(fanouts)


def resolve(dataset: str, model: str, given: dict) -> tuple[dict, list]:
    """The settings of a run: the table's, overridden by those given.

    Parameters
    ----------
    dataset : str
        Dataset name, e.g. ``"cora"``.
    model : str
        Model name, e.g. ``"gcn"``.
    given : dict
        Settings the user passed, by name in `TUNED`; a None value counts
        as not passed.

    Returns
    -------
    settings : dict
        A value for every name in `TUNED` (fresh lists, safe to change).
    defaulted : list of str
        The names that took the table's value, in `TUNED` order.

    Raises
    ------
    ValueError
        An unknown dataset or setting name.
    """
    unknown = sorted(set(given) - set(TUNED))
    if unknown:
        raise ValueError(f"unknown settings {unknown}; known: "
                         f"{', '.join(TUNED)}")
    group = family(dataset)
    table = dict(FAMILY_DEFAULTS[group])
    table.update(MODEL_DEFAULTS.get((group, model), {}))
    table.update(DATASET_DEFAULTS.get(dataset, {}))
    settings, defaulted = {}, []
    for name in TUNED:
        value = given.get(name)
        if value is None:
            value = table[name]
            defaulted.append(name)
        settings[name] = list(value) if isinstance(value, list) else value
    return settings, defaulted


def describe(dataset: str, model: str, settings: dict,
             defaulted: list) -> str:
    """One line naming the defaults used, e.g. for ``hmgraph train``.

    Examples
    --------
    >>> settings, defaulted = resolve("cora", "sage", {"epochs": 10})
    >>> describe("cora", "sage", settings, defaulted)[:44]
    'defaults for cora (planetoid, sage): fanouts'
    """
    def show(value):
        return ",".join(map(str, value)) if isinstance(value, list) \
            else f"{value:g}" if isinstance(value, float) else str(value)

    used = " ".join(f"{name}={show(settings[name])}" for name in defaulted)
    line = f"defaults for {dataset} ({family(dataset)}, {model}): " \
        f"{used or 'none'}"
    passed = [name for name in TUNED if name not in defaulted]
    if passed:
        line += "; from flags: " + " ".join(
            f"{name}={show(settings[name])}" for name in passed)
    return line

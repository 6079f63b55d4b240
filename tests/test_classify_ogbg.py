"""OGB molecule sets in ``hmgraph classify``: regression (``ogbg-molesol``,
RMSE), multi-task binary classification with unlabelled entries (a
tox21-shaped copy of ``ogbg-molbace``), the masked losses and OGB's own
``Evaluator``."""

from __future__ import annotations

import gzip
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hmgraph.classify import (
    ClassifyConfig,
    evaluate,
    load_graph_dataset,
    run,
    task_loss,
)
from hmgraph.datasets import DatasetError
from hmgraph.models.pooling import build_pooling_model
from hmgraph.selection import select_per_fold

TOX21_TASKS = 12


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HMGRAPH_CACHE", str(tmp_path / "cache"))


def _model(data, seed=0):
    torch.manual_seed(seed)
    return build_pooling_model("gin", data.feat_dim, 8, data.num_classes,
                               num_levels=2, max_nodes=data.max_nodes)


def test_task_loss_masks_unlabelled_entries():
    class Binary:
        task = "binary"

    class Regression:
        task = "regression"

    out = torch.tensor([[0.5, -1.0], [2.0, 0.3], [-0.2, 1.5]],
                       requires_grad=True)
    y = torch.tensor([[1.0, float("nan")], [0.0, 1.0],
                      [float("nan"), float("nan")]])
    kept = out[[0, 1, 1], [0, 0, 1]]
    expected = F.binary_cross_entropy_with_logits(
        kept, torch.tensor([1.0, 0.0, 1.0]))
    assert torch.allclose(task_loss(Binary, out, y), expected)
    expected = F.mse_loss(kept, torch.tensor([1.0, 0.0, 1.0]))
    assert torch.allclose(task_loss(Regression, out, y), expected)
    # No label at all: zero, and backward still runs.
    loss = task_loss(Regression, out[2:], y[2:])
    assert float(loss) == 0.0
    loss.backward()
    assert out.grad is not None and not out.grad[2].any()


def test_esol_regression_scored_with_ogb_rmse(shared_data, cache, tmp_path):
    if not (shared_data / "ogbg_molesol").is_dir():
        pytest.skip(f"ogbg_molesol not in {shared_data}")
    data = load_graph_dataset("ogbg-molesol", shared_data)
    assert data.task == "regression" and data.metric == "rmse"
    assert data.labels.dtype == torch.float32
    assert data.labels.shape == (1128, 1) and data.num_classes == 1
    assert {k: v.numel() for k, v in data.split.items()} == {
        "train": 902, "valid": 113, "test": 113}
    # OGB's Evaluator gives the RMSE of the raw outputs.
    model = _model(data)
    scored = evaluate(model, data, data.split["test"], "cpu")
    graph, feat, y = data.batch(data.split["test"])
    with torch.no_grad():
        pred = model(graph, feat)
    rmse = math.sqrt(float(((pred - y) ** 2).mean()))
    assert scored["metric"] == pytest.approx(rmse, rel=1e-5)
    assert scored["loss"] == pytest.approx(rmse ** 2, rel=1e-4)
    # Selection keeps the epoch of the lowest validation RMSE, unsmoothed
    # on an official split by default (OGB's protocol).
    result = run(ClassifyConfig(dataset="ogbg-molesol", model="gin",
                                folds=2, epochs=4, patience=4, hidden=8,
                                levels=2, out=str(tmp_path / "run"),
                                progress=False), data)
    assert result["metric"] == "rmse" and result["config"]["smooth"] == 1
    for fold in result["folds"]:
        curve = [h["valid"] for h in fold["history"]]
        assert fold["best_epoch"] == int(np.argmin(curve))
        assert fold["valid"] == min(curve)
        assert fold["test"] > 0
    assert "rmse" in (tmp_path / "run" / "result.md").read_text()


def _tox21_copy(source, root):
    """``ogbg_molbace`` relabelled as a 12-task set with holes (the
    layout of ``ogbg-moltox21``), in a writable folder under ``root``."""
    folder = root / "ogbg_moltox21"
    shutil.copytree(source, folder, copy_function=shutil.copyfile)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    shutil.rmtree(folder / "processed", ignore_errors=True)
    with gzip.open(folder / "raw" / "graph-label.csv.gz", "rt") as f:
        base = np.array([int(line) for line in f.read().split()])
    index = np.arange(base.size)
    labels = np.empty((base.size, TOX21_TASKS))
    for task in range(TOX21_TASKS):
        labels[:, task] = base ^ (index % (task + 3) == 0)
        labels[(index + task) % 5 == 0, task] = np.nan
    with gzip.open(folder / "raw" / "graph-label.csv.gz", "wt") as f:
        for row in labels:
            f.write(",".join("" if math.isnan(v) else str(int(v))
                             for v in row) + "\n")
    return labels


def test_multi_task_with_holes_masked_and_scored_by_ogb(shared_data, cache,
                                                       tmp_path):
    from sklearn.metrics import roc_auc_score

    if not (shared_data / "ogbg_molbace").is_dir():
        pytest.skip(f"ogbg_molbace not in {shared_data}")
    written = _tox21_copy(shared_data / "ogbg_molbace", tmp_path)
    data = load_graph_dataset("ogbg-moltox21", tmp_path)
    assert data.task == "binary" and data.metric == "rocauc"
    assert data.num_classes == TOX21_TASKS
    assert data.labels.shape == written.shape
    assert torch.equal(torch.isnan(data.labels),
                       torch.from_numpy(np.isnan(written)))
    assert int(torch.isnan(data.labels).sum()) == int(np.isnan(written).sum())
    # Loss over labelled entries only; OGB's ROC-AUC: the tasks' mean.
    model = _model(data)
    ids = data.split["test"]
    scored = evaluate(model, data, ids, "cpu")
    graph, feat, y = data.batch(ids)
    with torch.no_grad():
        out = model(graph, feat)
    seen = ~torch.isnan(y)
    assert scored["loss"] == pytest.approx(float(
        F.binary_cross_entropy_with_logits(out[seen], y[seen])), rel=1e-5)
    aucs = [roc_auc_score(y[seen[:, t], t], out[seen[:, t], t])
            for t in range(TOX21_TASKS)]
    assert scored["metric"] == pytest.approx(float(np.mean(aucs)), rel=1e-6)
    result = run(ClassifyConfig(dataset="ogbg-moltox21", root=str(tmp_path),
                                model="gin", folds=1, epochs=2, hidden=8,
                                levels=2, out=str(tmp_path / "run"),
                                progress=False), data)
    assert 0.0 <= result["summary"]["test_mean"] <= 1.0
    assert math.isfinite(result["folds"][0]["history"][-1]["loss"])


def test_non_molecule_ogb_name_is_refused_in_one_line(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_graph_dataset("ogbg-ppa", tmp_path)
    message = str(err.value)
    assert "\n" not in message and "'ogbg-ppa' not found" in message
    assert "ogbg-molesol" in message and "ogbg-moltox21" in message


def test_grid_picks_the_lowest_validation_rmse():
    def fold(valid):
        return {"valid": valid, "valid_loss": valid ** 2}

    runs = [{"name": "a", "metric": "rmse", "folds": [fold(1.2), fold(0.9)]},
            {"name": "b", "metric": "rmse", "folds": [fold(1.0), fold(1.1)]}]
    assert select_per_fold(runs)["chosen"] == [1, 0]
    for one in runs:
        one["metric"] = "rocauc"
    assert select_per_fold(runs)["chosen"] == [0, 1]


def test_regressors_learn_standardised_targets():
    from hmgraph.classify import TargetScale, target_scale

    class Data:
        labels = torch.tensor([[1.0, float("nan")], [3.0, 5.0],
                               [float("nan"), 5.0], [100.0, -1.0]])

    mean, std = target_scale(Data, torch.tensor([0, 1, 2]))
    assert mean.tolist() == [2.0, 5.0]  # graph 3 is not training
    assert std.tolist() == [1.0, 1.0]  # task 1's std is 0: kept at 1

    class Zero(torch.nn.Module):
        auxiliary_loss = 0.25

        def forward(self, graph, feat):
            return feat

    scaled = TargetScale(Zero(), torch.tensor([2.0, -1.0]),
                         torch.tensor([3.0, 0.5]))
    out = scaled(None, torch.tensor([[0.0, 0.0], [1.0, 2.0]]))
    assert out.tolist() == [[2.0, -1.0], [5.0, 0.0]]
    assert scaled.auxiliary_loss == 0.25
    assert set(scaled.state_dict()) == {"mean", "std"}

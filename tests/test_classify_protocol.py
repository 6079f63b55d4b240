"""Epoch selection in ``hmgraph classify``: the inner k-fold protocol,
the smoothed validation curve, and their bad values."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from hmgraph.classify import (
    ClassifyConfig,
    add_parser,
    command,
    inner_splits,
    load_graph_dataset,
    make_folds,
    run,
)


@pytest.fixture(scope="module")
def mutag(shared_data):
    if not (shared_data / "MUTAG").is_dir():
        pytest.skip(f"MUTAG not in {shared_data}")
    return load_graph_dataset("MUTAG", shared_data)


def test_inner_splits_partition_and_stratify(mutag):
    ids = make_folds(mutag.labels, 10, 0)[3]["train"]
    splits = inner_splits(mutag, ids, 3, seed=7)
    valids = torch.cat([v for _, v in splits]).sort().values
    assert torch.equal(valids, ids.sort().values)  # each id once
    for train, valid in splits:
        assert not set(train.tolist()) & set(valid.tolist())
        assert train.numel() + valid.numel() == ids.numel()
        share = mutag.labels[valid].float().mean()
        assert abs(float(share) - float(mutag.labels[ids].float().mean())) \
            < 0.02
    with pytest.raises(ValueError, match=r"inner_folds must be in \[2, "):
        inner_splits(mutag, ids, 1, seed=0)


@pytest.mark.parametrize("selection", ["inner", "inner-retrain"])
def test_inner_selection_picks_on_the_mean_inner_curve(mutag, tmp_path,
                                                       selection):
    result = run(ClassifyConfig(
        dataset="MUTAG", model="gin", folds=10, max_folds=2, epochs=6,
        patience=6, hidden=8, levels=2, selection=selection, inner_folds=3,
        out=str(tmp_path), progress=False), mutag)
    assert "inner stratified 3-fold CV" in result["protocol"]
    assert ("retrain" in selection) == ("one model trains on the whole"
                                        in result["protocol"])
    folds = make_folds(mutag.labels, 10, 0)
    for record, split in zip(result["folds"], folds, strict=False):
        test = split["test"].numel()
        assert record["sizes"] == {
            "train": mutag.num_graphs - test, "test": test,
            "inner_valid": record["sizes"]["inner_valid"]}
        assert record["sizes"]["inner_valid"] in (56, 57)
        curve = [h["valid"] for h in record["history"]]
        # The pick is the mean inner curve's best (ties: lower loss).
        assert record["valid"] == max(curve)
        assert record["valid"] == curve[record["best_epoch"]]
        assert ("test_ensemble" in record) == (selection == "inner-retrain")


def test_ensemble_averages_probabilities():
    from hmgraph.classify import Ensemble

    class Fixed(torch.nn.Module):
        def __init__(self, out):
            super().__init__()
            self.out = out

        def forward(self, graph, feat):
            return self.out

    a = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[-1.0, 1.0], [3.0, 0.0]])
    mean = (torch.softmax(a, -1) + torch.softmax(b, -1)) / 2
    out = Ensemble([Fixed(a), Fixed(b)], "multiclass")(None, None)
    assert torch.allclose(torch.softmax(out, -1), mean)
    out = Ensemble([Fixed(a), Fixed(b)], "binary")(None, None)
    assert torch.allclose(torch.sigmoid(out),
                          (torch.sigmoid(a) + torch.sigmoid(b)) / 2)
    out = Ensemble([Fixed(a), Fixed(b)], "regression")(None, None)
    assert torch.equal(out, (a + b) / 2)


def test_smoothed_curve_picks_the_best_trailing_mean(mutag, tmp_path):
    result = run(ClassifyConfig(
        dataset="MUTAG", model="gin", folds=10, max_folds=1, epochs=8,
        patience=8, hidden=8, levels=2, selection="holdout", smooth=3,
        out=str(tmp_path), progress=False), mutag)
    record = result["folds"][0]
    curve = [h["valid"] for h in record["history"]]
    means = [sum(curve[max(0, e - 2):e + 1]) / len(curve[max(0, e - 2):
                                                          e + 1])
             for e in range(len(curve))]
    assert [h["valid_smoothed"] for h in record["history"]] == \
        pytest.approx(means)
    assert record["valid"] == pytest.approx(max(means))
    assert means[record["best_epoch"]] == pytest.approx(max(means))
    assert "trailing mean of 3 epochs" in result["protocol"]


@pytest.mark.parametrize(("change", "words"), [
    ({"selection": "nested"},
     "unknown selection 'nested'; available: inner, inner-retrain, holdout"),
    ({"inner_folds": 1}, "inner_folds must be at least 2; got 1"),
    ({"smooth": 0}, "smooth must be positive; got 0"),
], ids=["selection", "inner-folds", "smooth"])
def test_bad_protocol_settings_are_refused(mutag, tmp_path, change, words):
    config = ClassifyConfig(dataset="MUTAG", out=str(tmp_path),
                            progress=False, **change)
    with pytest.raises(ValueError, match=re.escape(words)):
        run(config, mutag)


def test_cli_refuses_one_inner_fold_before_loading(tmp_path):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["classify", "--dataset", "NOPE", "--root",
                              str(tmp_path), "--inner-folds", "1"])
    with pytest.raises(ValueError, match=re.escape(
            "--inner-folds 1: must be at least 2")):
        command(args)


def test_default_protocol_is_inner_selection_on_a_smoothed_curve(mutag,
                                                                tmp_path):
    result = run(ClassifyConfig(dataset="MUTAG", model="gin", max_folds=1,
                                epochs=2, hidden=8, levels=2,
                                out=str(tmp_path), progress=False), mutag)
    assert result["config"]["selection"] == "inner"
    assert result["config"]["smooth"] == 5
    assert "inner stratified 3-fold CV" in result["protocol"]
    assert "trailing mean of 5 epochs" in result["protocol"]
    assert "valid_smoothed" in result["folds"][0]["history"][0]


def test_a_last_batch_of_one_single_node_graph_joins_the_one_before():
    """Batch norm cannot train on one node: a last batch of one graph
    (of one node: methane in ogbg-molfreesolv) is folded into the one
    before instead of failing."""
    from hmgraph.datasets.tu import GraphDataset
    from hmgraph.graph_training import Trainer

    data = GraphDataset.from_edges(
        "DOTS", [], [], [1] * 5, torch.eye(3)[[0, 1, 2, 0, 1]],
        [0, 1, 0, 1, 0], num_classes=2)
    config = ClassifyConfig(model="gin", batch_size=4, hidden=8, levels=2)
    trainer = Trainer(config, data, torch.arange(5), seed=0, device="cpu")
    loss = trainer.epoch(0)
    assert loss > 0 and torch.isfinite(torch.tensor(loss))

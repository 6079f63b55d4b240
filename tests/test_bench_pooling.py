"""bench/pooling.py: per-fold selection on validation, targets, merging."""

import json

import pytest
from benchscripts import load_bench

from hmgraph.classify import summarize

bench = load_bench("pooling")


def record(dataset, model, folds):
    """A run whose folds are ``(valid, valid_loss, test)`` triples."""
    folds = [{"valid": v, "valid_loss": loss, "test": t, "epochs_run": 10,
              "seconds": 1.0} for v, loss, t in folds]
    return {"dataset": dataset, "model": model, "wall_seconds": 1.0,
            "folds": folds, "summary": summarize(folds)}


def test_each_fold_picks_the_best_validation_configuration():
    records = [
        record("D", "hap", [(0.9, 0.3, 0.50), (0.7, 0.3, 0.60),
                            (0.8, 0.2, 0.70)]),
        record("D", "hap-sum", [(0.8, 0.3, 0.99), (0.9, 0.3, 0.10),
                                (0.8, 0.1, 0.20)]),
        record("D", "gin", [(0.5, 0.3, 0.40)] * 3),
    ]
    selected = bench.select_on_validation(records)
    hap = selected[("D", "hap")]
    # Fold 0: hap by valid; fold 1: hap-sum by valid; fold 2: tie on
    # valid, hap-sum by the lower valid loss. Test never decides.
    assert hap["picks"] == {"hap": 1, "hap-sum": 2}
    assert hap["summary"]["test_mean"] == pytest.approx(
        (0.50 + 0.10 + 0.20) / 3)
    assert selected[("D", "gin")]["picks"] == {"gin": 3}
    t = bench.targets(records, ["D"], selected)
    assert t["per_dataset"]["D"]["best_other"] == "gin"
    assert t["per_dataset"]["D"]["margin_points"] == pytest.approx(
        100 * ((0.80 / 3) - 0.40))
    # Without selection: hap (mean test 0.6) and hap-sum (0.43) each
    # against gin (0.4), the only non-HAP configuration.
    fixed = t["fixed"]
    assert fixed["hap"]["wins"] == 1 and fixed["hap-sum"]["wins"] == 1
    assert fixed["hap"]["margins"]["D"] == pytest.approx(20.0)


def test_full_tie_keeps_the_first_listed_configuration():
    records = [record("D", "gin-mean", [(0.5, 0.3, 0.9)]),
               record("D", "gin", [(0.5, 0.3, 0.1)])]
    picks = bench.select_on_validation(records)[("D", "gin")]["picks"]
    assert picks == {"gin": 1}


def write_run(path, models, **changes):
    config = {"folds": 10, "epochs": 100, "patience": 20, "batch_size": 128,
              "hidden": 64, "lr": 0.001, "seed": 0, "workers": 2,
              "root": "x", "datasets": ["D"], "models": models,
              "folds_run": {"D": 1}}
    config.update(changes)
    path.write_text(json.dumps({
        "config": config, "wall_seconds": 2.0,
        "records": [record("D", m, [(0.5, 0.3, 0.5)]) for m in models]}))
    return path


def test_merge_joins_runs_of_one_protocol(tmp_path):
    a = write_run(tmp_path / "a.json", ["gin", "hap"])
    b = write_run(tmp_path / "b.json", ["hap-sum"])
    merged = bench.merge([a, b])
    assert merged["config"]["models"] == ["hap", "hap-sum", "gin"]
    assert len(merged["records"]) == 3 and merged["wall_seconds"] == 4.0


def test_merge_refuses_other_settings_and_repeated_pairs(tmp_path):
    a = write_run(tmp_path / "a.json", ["hap"])
    with pytest.raises(SystemExit, match="epochs=60 differs"):
        bench.merge([a, write_run(tmp_path / "b.json", ["gin"], epochs=60)])
    with pytest.raises(SystemExit, match="D hap is in more than one run"):
        bench.merge([a, write_run(tmp_path / "c.json", ["hap"])])

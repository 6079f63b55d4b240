"""bench/ogbg.py and bench/protocol.py: the verdicts and tables they
write from their cells (RMSE lower-better, ROC-AUC higher-better)."""

from __future__ import annotations

import json

from benchscripts import load_bench

ogbg = load_bench("ogbg")
protocol = load_bench("protocol")


def cell(dataset, model, metric, mean, std, valid=None):
    return {"dataset": dataset, "model": model, "metric": metric,
            "protocol": "official split", "wall_seconds": 1.0,
            "summary": {"test_mean": mean, "test_std": std,
                        "valid_mean": mean if valid is None else valid,
                        "folds_run": 10}}


def test_hap_against_gin_counts_rmse_lower_as_better():
    cells = [cell("ogbg-molesol", "hap", "rmse", 1.10, 0.05),
             cell("ogbg-molesol", "gin", "rmse", 1.00, 0.04),  # hap below
             cell("ogbg-molfreesolv", "hap", "rmse", 2.50, 0.2),
             cell("ogbg-molfreesolv", "gin", "rmse", 2.90, 0.1),  # better
             cell("ogbg-molbace", "hap", "rocauc", 0.74, 0.02),
             cell("ogbg-molbace", "gin", "rocauc", 0.76, 0.03),  # within
             cell("ogbg-molbbbp", "hap", "rocauc", 0.60, 0.01),
             cell("ogbg-molbbbp", "gin", "rocauc", 0.66, 0.02)]  # below
    found = ogbg.verdicts(cells)
    assert {d: v["verdict"] for d, v in found.items()} == {
        "ogbg-molesol": "below", "ogbg-molfreesolv": "better",
        "ogbg-molbace": "within one std", "ogbg-molbbbp": "below"}
    text = ogbg.format_markdown({"settings": {"seeds": 10, "epochs": 100,
                                              "patience": 20},
                                 "cells": cells})
    assert "| sets where HAP is better than GIN or within one std (4 of " \
        "4 run) | 2 | >= 3 | **MISS** |" in text
    # Best of each set in bold: the lower RMSE, the higher ROC-AUC.
    assert "**1.000 ± 0.040**" in text and "**2.500 ± 0.200**" in text
    assert "**76.00 ± 3.00**" in text
    assert "| Pre-training GNNs paper" in text


def test_a_set_with_one_model_has_no_verdict_yet():
    cells = [cell("ogbg-molesol", "hap", "rmse", 1.1, 0.05)]
    assert ogbg.verdicts(cells) == {}
    text = ogbg.format_markdown({"settings": {"seeds": 10, "epochs": 100,
                                              "patience": 20},
                                 "cells": cells})
    assert "(0 of 4 run) | 0 | >= 3 | **OPEN** |" in text


def test_protocol_table_reports_each_variants_worst_gap():
    def one(variant, valid, test):
        return {"dataset": "PTC_MR", "model": "hap", "variant": variant,
                "majority": 0.558, "wall_seconds": 2.0, "gap": 100 * (
                    valid - test),
                "summary": {"test_mean": test, "test_std": 0.05,
                            "valid_mean": valid}}

    report = {"settings": {"epochs": 100, "patience": 20},
              "cells": [one("holdout", 0.65, 0.50),
                        one("inner-s5", 0.58, 0.55)]}
    text = protocol.format_markdown(report)
    assert "| holdout | 1 | +15.00 | 0 | 2 |" in text
    assert "| inner-s5 | 1 | +3.00 | 1 | 2 |" in text
    assert "55.00 ± 5.00 / 58.00 / **+3.00**" in text


def test_protocol_names_the_commit_of_the_cells_that_have_one(tmp_path):
    """A cell from before cells recorded their commit is claimed by none:
    the note names it; the cells that have one are listed by it."""
    def one(variant, commit=None):
        return {"dataset": "MUTAG", "model": "gin", "variant": variant,
                "majority": 0.665, "wall_seconds": 2.0, "gap": 1.0,
                "summary": {"test_mean": 0.8, "test_std": 0.05,
                            "valid_mean": 0.81},
                **({"commit": commit} if commit else {})}

    new = {"sha": "c" * 40, "dirty": False}
    report = {"settings": {"epochs": 100, "patience": 20},
              "cells": [one("holdout"), one("inner-s5", new)]}
    protocol._write(report, tmp_path / "protocol.json")
    assert report["commit"] == {"sha": None, "dirty": None,
                                "merged": [new]}
    text = (tmp_path / "protocol.md").read_text()
    assert f"Cells of MUTAG gin inner-s5 by commit `{'c' * 40}`." in text
    assert "MUTAG gin holdout by" not in text


def test_the_table_names_the_commit_of_every_cell(tmp_path):
    """Cells run by two commits: the JSON says ``merged`` and the table
    which cells each commit ran."""
    old, new = {"sha": "a" * 40, "dirty": False}, {"sha": "b" * 40,
                                                    "dirty": False}
    cells = [dict(cell("ogbg-molesol", "hap", "rmse", 1.1, 0.05),
                  commit=old),
             dict(cell("ogbg-molesol", "gin", "rmse", 1.0, 0.04),
                  commit=new)]
    report = {"settings": {"seeds": 10, "epochs": 100, "patience": 20},
              "cells": cells}
    ogbg._write(report, tmp_path / "ogbg.json")
    assert report["commit"] == {"sha": None, "dirty": None,
                                "merged": [old, new]}
    text = (tmp_path / "ogbg.md").read_text()
    assert f"Written by commits `{'a' * 40}`, `{'b' * 40}`" in text
    assert f"Cells of ogbg-molesol hap by commit `{'a' * 40}`." in text
    assert f"Cells of ogbg-molesol gin by commit `{'b' * 40}`." in text


def _grid_report(records, **config):
    """A pooling grid's results (`bench/pooling.py`) holding ``records``."""
    return {"config": {"folds": 10, "epochs": 100, "patience": 20,
                       "hidden": 64, "lr": 0.001, "seed": 0,
                       "grid": "batch_size=32,128;dropout=0,0.5",
                       "selection": "inner", "smooth": 5, **config},
            "records": records}


def _grid_record(model, batch_size, dropout, folds=10, test=0.8):
    return {"dataset": "MUTAG", "model": model,
            "name": f"batch_size={batch_size} dropout={dropout:g}",
            "overrides": {"batch_size": batch_size, "dropout": dropout},
            "majority": 0.665, "protocol": "inner", "wall_seconds": 7.0,
            "commit": {"sha": "d" * 40, "dirty": False},
            "summary": {"folds_run": folds},
            "folds": [{"fold": k, "best_epoch": 3, "epochs_run": 23,
                       "valid": 0.85, "test": test, "seconds": 0.7}
                      for k in range(folds)]}


def test_a_protocol_cell_of_the_grids_settings_is_taken_from_it(
        shared_data, tmp_path, capsys):
    """HAP's defaults (dropout 0 once resolved, batch 128) are a cell of
    the grid: taken with its folds and commit, not run again; GIN's
    default dropout (0.5) is not the grid's cell at 0, nor a cell of
    fewer folds or of another learning rate."""
    grid = tmp_path / "pooling-inner.json"
    records = [_grid_record("hap", 128, 0.0),
               _grid_record("hap", 32, 0.5, folds=2),
               _grid_record("gin", 128, 0.0)]
    grid.write_text(json.dumps(_grid_report(records)))
    found = protocol.grid_records(grid, shared_data)
    fields = {"epochs": 100, "patience": 20}
    taken = protocol.grid_cell(found, "MUTAG", "hap", "inner-s5", {},
                               fields, shared_data)
    assert taken["grid"] == "batch_size=128 dropout=0"
    assert taken["commit"] == records[0]["commit"]
    assert [f["test"] for f in taken["folds"]] == [0.8] * 10
    assert abs(taken["gap"] - 5.0) < 1e-9
    assert protocol.grid_cell(found, "MUTAG", "gin", "inner-s5", {},
                              fields, shared_data) is None
    assert protocol.grid_cell(found, "MUTAG", "hap", "inner-s5",
                              {"batch_size": 32, "dropout": 0.5}, fields,
                              shared_data) is None  # 2 folds of 10
    assert protocol.grid_cell(found, "MUTAG", "hap", "holdout-s5", {},
                              fields, shared_data) is None
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_grid_report(records, lr=0.01)))
    assert protocol.grid_cell(protocol.grid_records(other, shared_data),
                              "MUTAG", "hap", "inner-s5", {}, fields,
                              shared_data) is None
    # The command takes it and runs nothing.
    out = tmp_path / "protocol.json"
    assert protocol.main(["--datasets", "MUTAG", "--models", "hap",
                          "--variants", "inner-s5", "--root",
                          str(shared_data), "--grid", str(grid), "--out",
                          str(out)]) == 0
    assert "the pooling grid's batch_size=128 dropout=0" in \
        capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [c["wall_seconds"] for c in report["cells"]] == [7.0]
    assert "Taken from the pooling grid" in out.with_suffix(".md").read_text()

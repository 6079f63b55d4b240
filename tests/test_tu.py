"""TU and OGB graph datasets, folds and the classify harness."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
from pathlib import Path

import dgl
import pytest
import torch
from readonly import read_only_copy, tree_state

from hmgraph.classify import (
    ClassifyConfig,
    add_parser,
    command,
    flat_parameters,
    load_graph_dataset,
    make_folds,
    run,
)
from hmgraph.datasets import DatasetError
from hmgraph.datasets.tu import GraphDataset, TUFormatError, read_tu
from hmgraph.train import CheckpointError

TU_NAMES = ["MUTAG", "PROTEINS", "NCI1", "ENZYMES", "PTC_MR", "IMDB-BINARY"]


def readme_counts(folder):
    """The counts a dataset folder's README.md states."""
    text = (folder / "README.md").read_text()

    def number(pattern):
        match = re.search(pattern, text)
        return int(match.group(1).replace(",", "")) if match else None

    sizes = re.search(r"nodes per graph min/mean/max: \[(\d+), [\d.]+, "
                      r"(\d+)\]", text)
    labels = re.search(r"graph label counts: (\{[^}]*\})", text)
    attributes = re.search(r"node_attributes.txt: one row per node, (\d+) "
                           r"float column", text)
    return {
        "graphs": number(r"- graphs: ([\d,]+)"),
        "nodes": number(r"- nodes: ([\d,]+)"),
        "edge_lines": number(r"A.txt lines \(directed edges\): ([\d,]+)"),
        "undirected": number(r"unique undirected edges: ([\d,]+)"),
        "min_nodes": int(sizes.group(1)),
        "max_nodes": int(sizes.group(2)),
        "label_counts": {int(k): v for k, v in
                         ast.literal_eval(labels.group(1)).items()},
        "attributes": int(attributes.group(1)) if attributes else 0,
    }


@pytest.mark.parametrize("name", TU_NAMES)
def test_counts_equal_the_readme(shared_data, name):
    folder = shared_data / name
    if not folder.is_dir():
        pytest.skip(f"{name} not in {shared_data}")
    want = readme_counts(folder)
    data = read_tu(folder)
    assert data.num_graphs == want["graphs"]
    assert int(data.node_ptr[-1]) == want["nodes"]
    assert data.info["edge_lines"] == want["edge_lines"]
    assert data.src.numel() == 2 * want["undirected"]
    assert int(data.num_nodes.min()) == want["min_nodes"]
    assert data.max_nodes == want["max_nodes"]
    assert data.info["node_attributes"] == want["attributes"]
    # Labels remapped to 0..C-1 in the sorted order of the originals.
    values = sorted(want["label_counts"])
    assert data.info["label_values"] == values
    assert data.num_classes == len(values)
    assert torch.bincount(data.labels).tolist() == [
        want["label_counts"][v] for v in values]


def test_mutag_features_and_graphs(shared_data):
    data = read_tu(shared_data / "MUTAG")
    assert data.feat_dim == 7  # node labels 0..6, one-hot
    assert torch.equal(data.features.sum(1), torch.ones(3371))
    graph = data.graph(0)
    assert graph.num_nodes() == 17
    src, dst = graph.edges()
    assert set(zip(src.tolist(), dst.tolist(), strict=True)) == set(
        zip(dst.tolist(), src.tolist(), strict=True))


def test_attributes_are_standardised(shared_data):
    data = read_tu(shared_data / "ENZYMES")
    assert data.feat_dim == 3 + 18
    attributes = data.features[:, 3:].double()
    torch.testing.assert_close(attributes.mean(0),
                               torch.zeros(18, dtype=torch.float64),
                               atol=1e-5, rtol=0)


def test_batch_equals_dgl_batch(shared_data):
    data = read_tu(shared_data / "MUTAG")
    ids = torch.tensor([5, 3, 100, 7, 187])
    graph, features, labels = data.batch(ids)
    want = dgl.batch([data.graph(i) for i in ids.tolist()])
    assert torch.equal(torch.stack(graph.edges()), torch.stack(want.edges()))
    assert torch.equal(graph.batch_num_nodes(), want.batch_num_nodes())
    assert torch.equal(graph.batch_num_edges(), want.batch_num_edges())
    assert torch.equal(features, want.ndata["feat"])
    assert torch.equal(labels, data.labels[ids])


# --- malformed files -------------------------------------------------------

GOOD = {  # two graphs: nodes 1-3 (a path) and 4-5 (an edge)
    "A": "1, 2\n2, 1\n2, 3\n3, 2\n4, 5\n5, 4\n",
    "graph_indicator": "1\n1\n1\n2\n2\n",
    "graph_labels": "-1\n1\n",
    "node_labels": "0\n1\n0\n2\n0\n",
}


def write_tu(folder, name="TOY", **changes):
    folder.mkdir(parents=True, exist_ok=True)
    for kind, text in {**GOOD, **changes}.items():
        if text is not None:
            (folder / f"{name}_{kind}.txt").write_text(text)
    return folder


def test_good_toy_dataset(tmp_path):
    data = read_tu(write_tu(tmp_path / "TOY"))
    assert data.num_graphs == 2 and data.num_classes == 2
    assert data.labels.tolist() == [0, 1]
    assert data.num_nodes.tolist() == [3, 2]
    assert data.num_edges.tolist() == [4, 2]
    assert data.feat_dim == 3


# case -> (file changes, file named, line, words in the message)
MALFORMED = {
    "id-out-of-range": ({"A": "1, 2\n2, 1\n2, 9\n"}, "A", 3, "out of range"),
    "id-zero": ({"A": "0, 1\n"}, "A", 1, "out of range"),
    "edge-joins-graphs": ({"A": "1, 2\n3, 4\n"}, "A", 2, "joins graph 1"),
    "not-a-number": ({"A": "1, 2\n2, x\n"}, "A", 2, "'x' is not an integer"),
    "wrong-columns": ({"A": "1, 2\n2\n"}, "A", 2, "expected 2"),
    "blank-line": ({"A": "1, 2\n\n2, 1\n"}, "A", 2, "blank line"),
    "indicator-not-sorted": ({"graph_indicator": "1\n2\n1\n2\n2\n"},
                             "graph_indicator", 3, "not sorted"),
    "indicator-skips": ({"graph_indicator": "1\n1\n1\n3\n3\n"},
                        "graph_indicator", 4, "skips a graph id"),
    "indicator-starts-late": ({"graph_indicator": "2\n2\n2\n3\n3\n"},
                              "graph_indicator", 1, "expected 1"),
    "missing-labels": ({"graph_labels": None}, "graph_labels", None,
                       "missing"),
    "missing-edges": ({"A": None}, "A", None, "missing"),
    "too-few-labels": ({"graph_labels": "1\n"}, "graph_labels", 2,
                       "1 labels, but"),
    "too-few-node-labels": ({"node_labels": "0\n1\n"}, "node_labels", 3,
                            "2 rows"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_file_names_file_and_line(tmp_path, case):
    changes, kind, line, words = MALFORMED[case]
    folder = write_tu(tmp_path / "TOY", **changes)
    with pytest.raises(TUFormatError) as error:
        read_tu(folder)
    message = str(error.value)
    assert "\n" not in message
    where = str(folder / f"TOY_{kind}.txt")
    assert message.startswith(where + (f":{line}:" if line else ":"))
    assert words in message


def test_cli_reports_malformed_file_as_value_error(tmp_path):
    write_tu(tmp_path / "TOY", A="1, 2\n2, 7\n")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["classify", "--dataset", "TOY", "--root",
                              str(tmp_path), "--no-progress"])
    with pytest.raises(ValueError, match=r"TOY_A.txt:2: node id out of"):
        command(args)
    args = parser.parse_args(["classify", "--dataset", "NOPE", "--root",
                              str(tmp_path)])
    with pytest.raises(DatasetError, match="TU folders there: TOY"):
        command(args)


# --- folds and the harness -------------------------------------------------

def test_folds_are_stratified_and_disjoint():
    labels = torch.tensor([0] * 60 + [1] * 30 + [2] * 10)
    folds = make_folds(labels, 10, seed=0)
    tests = torch.cat([f["test"] for f in folds])
    assert torch.equal(tests.sort().values, torch.arange(100))
    for fold in folds:
        parts = [fold["train"], fold["valid"], fold["test"]]
        assert torch.cat(parts).unique().numel() == 100
        assert fold["valid"].numel() == fold["test"].numel() == 10
        assert torch.bincount(labels[fold["test"]]).tolist() == [6, 3, 1]
        assert torch.bincount(labels[fold["valid"]], minlength=3)[0] == 6
    assert [f["test"].tolist() for f in folds] == [
        f["test"].tolist() for f in make_folds(labels, 10, seed=0)]
    with pytest.raises(ValueError, match="folds"):
        make_folds(labels, 1, seed=0)


@pytest.mark.parametrize("name", ["hap", "diffpool"])
def test_adam_over_flat_parameters_takes_the_same_steps(name):
    """Three Adam steps (weight decay on) over the flat parameter leave
    every parameter with the same bits as Adam over the model's own."""
    from hmgraph.models.pooling import build_pooling_model

    dgl.seed(0)
    graphs = [dgl.batch([dgl.rand_graph(9, 30), dgl.rand_graph(6, 14)])
              for _ in range(3)]
    features = torch.randn(15, 7, generator=torch.Generator().manual_seed(0))
    trained = []
    for flat in (False, True):
        torch.manual_seed(0)
        model = build_pooling_model(name, 7, 16, 2, max_nodes=9)
        if flat:
            params = flat_parameters(model)
            # Every view starts 64-byte aligned; the gaps hold zeros.
            views = list(model.parameters())
            used = torch.zeros(params.numel(), dtype=torch.bool)
            for p in views:
                assert p.data_ptr() % 64 == 0
                used[p.storage_offset():][:p.numel()] = True
            assert params.numel() < sum(p.numel() for p in views) \
                + 16 * len(views)
        optimizer = torch.optim.Adam(
            [params] if flat else model.parameters(), lr=0.01,
            weight_decay=1e-3)
        torch.manual_seed(1)
        for graph in graphs:
            loss = torch.nn.functional.cross_entropy(
                model(graph, features), torch.tensor([0, 1])) \
                + model.auxiliary_loss
            if flat:
                params.grad.zero_()
            else:
                optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        trained.append(list(model.parameters()))
    assert not params.detach()[~used].any()
    for plain, viewed in zip(*trained, strict=True):
        assert torch.equal(plain, viewed)
        # Still views of the flat parameter, gradients too.
        assert viewed.untyped_storage().data_ptr() == \
            params.untyped_storage().data_ptr()
        assert viewed.grad.untyped_storage().data_ptr() == \
            params.grad.untyped_storage().data_ptr()


def test_flat_parameters_refuse_mixed_dtypes():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2),
                                torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one dtype and device"):
        flat_parameters(model)


def test_classify_run_on_mutag(shared_data, tmp_path):
    config = ClassifyConfig(dataset="MUTAG", root=str(shared_data),
                            model="hap", folds=10, max_folds=1, epochs=2,
                            patience=1, batch_size=64, hidden=16,
                            selection="holdout", smooth=1,
                            out=str(tmp_path), progress=False)
    result = run(config)
    assert result["summary"]["folds_run"] == 1
    fold = result["folds"][0]
    assert fold["sizes"] == {"train": 150, "valid": 19, "test": 19}
    assert 0.0 <= fold["test"] <= 1.0 and fold["best_epoch"] in (0, 1)
    assert "first 1 of 10 folds" in result["protocol"]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["summary"] == result["summary"]
    assert "| **mean ± std** |" in (tmp_path / "result.md").read_text()


def test_classify_resume_reuses_the_folds_a_killed_run_kept(shared_data,
                                                          tmp_path):
    """Every finished fold is kept; ``resume`` reuses them and trains the
    rest to an unbroken run's numbers; other settings are refused."""
    config = ClassifyConfig(dataset="MUTAG", root=str(shared_data),
                            model="gin", folds=10, max_folds=2, epochs=3,
                            patience=3, batch_size=64, hidden=8,
                            out=str(tmp_path), progress=False)
    whole = run(config)
    folds = tmp_path / "folds"
    assert sorted(p.name for p in folds.iterdir()) == ["fold-0.json",
                                                       "fold-1.json"]
    # As if killed in fold 1, fold 0's record marked to be recognised.
    (folds / "fold-1.json").unlink()
    kept = json.loads((folds / "fold-0.json").read_text())
    assert kept["config"]["dropout"] == 0.5 and len(kept["code"]) == 64
    kept["record"]["test"] = 0.125
    (folds / "fold-0.json").write_text(json.dumps(kept))
    resumed = run(dataclasses.replace(config, resume=True))
    assert resumed["folds"][0]["test"] == 0.125
    assert resumed["folds"][0]["resumed"] is True
    assert "resumed" not in resumed["folds"][1]
    for key in ("test", "best_epoch", "epochs_run"):
        assert resumed["folds"][1][key] == whole["folds"][1][key]
    assert resumed["folds"][1]["valid_loss"] == pytest.approx(
        whole["folds"][1]["valid_loss"], rel=1e-5)
    assert resumed["summary"]["test_mean"] == pytest.approx(
        (0.125 + whole["folds"][1]["test"]) / 2)
    # Without resume, every fold trains again.
    assert "resumed" not in run(config)["folds"][0]
    with pytest.raises(CheckpointError, match=r"fold-0.json was written "
                       r"with dropout=0.5, but this run has dropout=0.0;"):
        run(dataclasses.replace(config, resume=True, dropout=0.0))
    (folds / "fold-0.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"fold-0.json cannot be read "
                       r"\(JSONDecodeError\); delete it or run without"):
        run(dataclasses.replace(config, resume=True))


def test_classify_grid_picks_per_fold_on_validation(shared_data, tmp_path,
                                                   capsys):
    """``hmgraph classify --grid``: every configuration runs the same
    folds; each fold's pick is the best on validation and its test score
    is that configuration's on that fold."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args([
        "classify", "--dataset", "MUTAG", "--root", str(shared_data),
        "--model", "gin", "--max-folds", "2", "--epochs", "2",
        "--patience", "1", "--hidden", "8", "--no-progress",
        "--grid", "batch_size=32,128;dropout=0,0.5", "--out",
        str(tmp_path), "--resume"])  # nothing kept yet: every fold runs
    assert command(args) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    names = [r["name"] for r in result["runs"]]
    assert names == ["batch_size=32 dropout=0", "batch_size=32 dropout=0.5",
                     "batch_size=128 dropout=0", "batch_size=128 dropout=0.5"]
    runs = {name: json.loads((tmp_path / name.replace(" ", "-")
                              / "result.json").read_text())
            for name in names}
    assert sum(result["picks"].values()) == len(result["folds"]) == 2
    for fold in result["folds"]:
        pick = runs[fold["pick"]]["folds"][fold["fold"]]
        assert fold["test"] == pick["test"]
        assert pick["valid"] == max(r["folds"][fold["fold"]]["valid"]
                                    for r in runs.values())
    assert runs["batch_size=32 dropout=0.5"]["config"]["dropout"] == 0.5
    assert "| configuration | folds picked |" in capsys.readouterr().out


@pytest.mark.parametrize("grid, words", [
    ("ratio=1", "'ratio=1' is not KEY=V1,V2"),
    ("batch_size=32,x", "'batch_size=32,x': 'x' is not a positive integer"),
    ("dropout=0,1", "'dropout=0,1': '1' is not a number in [0, 1)"),
    ("lr=0.1;lr=0.2", "'lr=0.2' is not KEY=V1,V2"),
])
def test_classify_grid_refuses_bad_axes_before_loading(tmp_path, grid,
                                                       words):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["classify", "--dataset", "NOPE", "--root",
                              str(tmp_path), "--grid", grid])
    with pytest.raises(ValueError, match=re.escape(words)):
        command(args)


def test_ogb_molbace_from_read_only_copy(shared_data, tmp_path,
                                         monkeypatch):
    """A folder without write bits is copied to hmgraph's cache, where ogb
    writes its processed files; the folder is left exactly as it was."""
    if not (shared_data / "ogbg_molbace").is_dir():
        pytest.skip(f"ogbg_molbace not in {shared_data}")
    cache = tmp_path / "cache"
    monkeypatch.setenv("HMGRAPH_CACHE", str(cache))
    root = tmp_path / "data"
    with read_only_copy(shared_data / "ogbg_molbace",
                        root / "ogbg_molbace") as folder:
        before = tree_state(folder)
        data = load_graph_dataset("ogbg-molbace", root)
        assert tree_state(folder) == before
    copy = Path(data.info["folder"])  # ogbg/<digest of its source>/
    assert copy.parent.parent == cache / "ogbg"
    assert copy.name == "ogbg_molbace"
    assert (copy / "processed").is_dir()
    assert isinstance(data, GraphDataset)
    assert data.num_graphs == 1513 and int(data.node_ptr[-1]) == 51577
    assert data.src.numel() == 2 * 55768
    assert data.task == "binary" and data.labels.shape == (1513, 1)
    assert torch.bincount(data.labels.view(-1).long()).tolist() == [822, 691]
    assert {k: v.numel() for k, v in data.split.items()} == {
        "train": 1210, "valid": 151, "test": 152}
    assert data.metric == "rocauc" and data.feat_dim == 174
    result = run(ClassifyConfig(dataset="ogbg-molbace", model="gin",
                                folds=1, epochs=1, hidden=8,
                                out=str(tmp_path), progress=False), data)
    assert 0.0 <= result["summary"]["test_mean"] <= 1.0
    assert "official split" in result["protocol"]


def test_unknown_ogb_layout_is_reported(tmp_path):
    with pytest.raises(DatasetError, match="ogbg-molhiv not found"):
        load_graph_dataset("ogbg-molhiv", tmp_path)


def test_degree_features_without_labels(tmp_path):
    folder = write_tu(tmp_path / "TOY", node_labels=None)
    data = read_tu(folder)
    assert data.info["degree_one_hot"] == 3  # degrees 0..2
    assert data.features.argmax(1).tolist() == [1, 2, 1, 1, 1]

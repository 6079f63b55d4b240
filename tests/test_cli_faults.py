"""Faults a probe found in the CLI (issue 32): each is one line on stderr,
exit status 2, before any work (no fold trains, no folder is written).

Cases: ``classify --device bogus``; a model too large for memory
(``--hidden 100000000`` in train, classify and the grid); a kept fold JSON
of the wrong shape (``classify --resume``); grid values a flag refuses or
given twice; ``classify --out`` a file; and a killed ``partition``'s
temporary folders, removed by the next run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from hmgraph.cli import main

#: ``training the model needs 320000.4 TB (...), more than the 21.3 GB
#: free on cpu``: the numbers are this machine's.
NEEDS = (r"training the model needs [\d.]+ [KMGT]?B \(weights, gradients, "
         r"Adam state\), more than the [\d.]+ [KMGT]?B free on cpu")


def one_line(capsys, *argv: str) -> str:
    """The one line ``hmgraph ARGV`` prints on stderr (exit status 2)."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


def write_toy(base):
    """A TU dataset ``TOY`` of 12 three-node paths in two classes, under
    ``base/data``; returns that root."""
    folder = base / "data" / "TOY"
    folder.mkdir(parents=True)
    edges, indicator = [], []
    for graph in range(12):
        a, b, c = 3 * graph + 1, 3 * graph + 2, 3 * graph + 3
        edges += [(a, b), (b, a), (b, c), (c, b)]
        indicator += [graph + 1] * 3
    files = {"A": "".join(f"{u}, {v}\n" for u, v in edges),
             "graph_indicator": "".join(f"{g}\n" for g in indicator),
             "graph_labels": "".join(f"{g % 2}\n" for g in range(12)),
             "node_labels": "".join(f"{n % 3}\n" for n in range(36))}
    for kind, text in files.items():
        (folder / f"TOY_{kind}.txt").write_text(text)
    return folder.parent


@pytest.fixture()
def toy(tmp_path):
    return write_toy(tmp_path)


def classify_args(root, out, *more: str) -> list[str]:
    return ["classify", "--dataset", "TOY", "--root", str(root), "--model",
            "gin", "--folds", "3", "--max-folds", "1", "--epochs", "1",
            "--out", str(out), "--no-progress", *more]


@pytest.fixture()
def no_training(monkeypatch):
    """Fail the test if a fold starts training."""
    from hmgraph import classify

    def refuse(*args, **kwargs):
        raise AssertionError("a fold trained before the error")

    monkeypatch.setattr(classify, "train_fold", refuse)


def test_classify_device_bogus_is_one_line(capsys):
    assert one_line(capsys, "classify", "--device", "bogus") == (
        "hmgraph classify: error: argument --device: 'bogus' is not a "
        "device: cpu, cuda or cuda:N")


def test_train_hidden_past_memory_is_one_line(capsys, data_root, tmp_path):
    line = one_line(capsys, "train", "--dataset", "synth-tiny", "--root",
                    str(data_root), "--hidden", "100000000", "--epochs", "1",
                    "--no-progress", "--out", str(tmp_path / "out"))
    assert re.fullmatch(rf"hmgraph train: error: --hidden 100000000: "
                        rf"{NEEDS}; use a smaller --hidden", line), line
    assert not (tmp_path / "out").exists()


#: Where the huge hidden size comes from: the flag, or the grid (whose
#: first configuration would otherwise train first).
HUGE_HIDDEN = {"flag": ["--hidden", "100000000"],
               "grid": ["--grid", "hidden=16,100000000"]}


@pytest.mark.parametrize("given", HUGE_HIDDEN.values(), ids=HUGE_HIDDEN)
def test_classify_hidden_past_memory_is_one_line(capsys, toy, tmp_path,
                                                 no_training, given):
    out = tmp_path / "out"
    line = one_line(capsys, *classify_args(toy, out, *given))
    assert re.fullmatch(rf"hmgraph classify: error: --hidden 100000000 "
                        rf"--levels 3: {NEEDS}; use a smaller --hidden or "
                        rf"--levels", line), line
    assert not out.exists()


@pytest.fixture(scope="module")
def kept_fold(tmp_path_factory):
    """A classify run's folder whose fold 0 is kept, and its data root."""
    base = tmp_path_factory.mktemp("kept")
    root = write_toy(base)
    out = base / "run"
    assert main(classify_args(root, out)) == 0
    assert (out / "folds" / "fold-0.json").is_file()
    return root, out


#: A kept fold's JSON bent out of shape -> what the message says of it.
SHAPES = {
    "array": (lambda kept: [], "it holds an array, not an object"),
    "config-array": (lambda kept: dict(kept, config=[]),
                     "its 'config' is an array, not an object"),
    "record-missing": (lambda kept: {"config": kept["config"]},
                       "its 'record' is missing, not an object"),
    "test-text": (lambda kept: dict(kept, record=dict(kept["record"],
                                                      test="high")),
                  "its record's 'test' is a string, not a number"),
    "other-fold": (lambda kept: dict(kept, record=dict(kept["record"],
                                                       fold=1)),
                   "its record is of fold 1"),
}


@pytest.mark.parametrize("case", SHAPES, ids=SHAPES)
def test_kept_fold_of_the_wrong_shape_is_one_line(capsys, kept_fold,
                                                  tmp_path, no_training,
                                                  case):
    root, made = kept_fold
    out = tmp_path / "run"
    shutil.copytree(made, out)
    path = out / "folds" / "fold-0.json"
    bend, why = SHAPES[case]
    path.write_text(json.dumps(bend(json.loads(path.read_text()))))
    capsys.readouterr()
    assert one_line(capsys, *classify_args(root, out, "--resume")) == (
        f"hmgraph classify: error: fold record {path} is not hmgraph's "
        f"record of fold 0 ({why}); delete it or run without --resume")


#: Values a flag refuses, in a grid as on the flag, and values twice.
BAD_VALUES = {
    "grid-lr-inf": (["--grid", "lr=inf"], "hmgraph classify: error: grid "
                    "axis 'lr=inf': 'inf' is not a positive number"),
    "grid-weight-decay-inf": (
        ["--grid", "weight_decay=0,inf"], "hmgraph classify: error: grid "
        "axis 'weight_decay=0,inf': 'inf' is not a non-negative number"),
    "grid-duplicate": (
        ["--grid", "batch_size=32,32"], "hmgraph classify: error: grid axis "
        "'batch_size=32,32': batch_size=32 is given twice; give each value "
        "once"),
    "grid-duplicate-spelling": (
        ["--grid", "dropout=0,0.0"], "hmgraph classify: error: grid axis "
        "'dropout=0,0.0': dropout=0 is given twice; give each value once"),
}


@pytest.mark.parametrize("case", BAD_VALUES, ids=BAD_VALUES)
def test_grid_values_are_checked_as_the_flags(capsys, toy, tmp_path,
                                              no_training, case):
    given, message = BAD_VALUES[case]
    assert one_line(capsys, *classify_args(toy, tmp_path / "out",
                                           *given)) == message
    assert not (tmp_path / "out").exists()


def test_train_lr_inf_is_refused(capsys, data_root, tmp_path):
    assert one_line(capsys, "train", "--dataset", "synth-tiny", "--root",
                    str(data_root), "--lr", "inf", "--out",
                    str(tmp_path / "out")) == (
        "hmgraph train: error: argument --lr: 'inf' is not a positive "
        "number")


def test_classify_out_file_is_refused_before_training(capsys, toy, tmp_path,
                                                      no_training):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert one_line(capsys, *classify_args(toy, afile)) == (
        f"hmgraph classify: error: --out {afile} is a file; give a folder")
    assert afile.read_text() == "x"


def test_partition_removes_what_a_killed_partition_left(data_root, tmp_path,
                                                        capsys):
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    running = subprocess.Popen(["sleep", "300"])
    try:
        # A killed writer's work folder and its moved-aside old output,
        # and the work folder of a writer still running.
        left = [tmp_path / f".parts.tmp-{dead.pid}-k1ll3d",
                tmp_path / f".parts.old-{dead.pid}"]
        live = tmp_path / f".parts.tmp-{running.pid}-busy"
        for folder in [*left, live]:
            folder.mkdir()
            (folder / "graph.dgl").write_text("half written")
        assert main(["partition", "--dataset", "synth-tiny", "--root",
                     str(data_root), "--parts", "2", "--method", "random",
                     "--out", str(tmp_path / "parts"), "--no-stats",
                     "--no-progress"]) == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [live.name, "parts"])
    finally:
        running.kill()
        running.wait()
    assert os.listdir(tmp_path / "parts")

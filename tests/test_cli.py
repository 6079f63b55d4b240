"""The command line: bad input gives one line and a non-zero exit."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from hmgraph.cache.format import DATA_OFFSET
from hmgraph.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``hmgraph ARGS`` in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "hmgraph.cli", *args],
        capture_output=True, text=True, timeout=300,
    )


def run_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """Run `hmgraph.cli.main` in this process (faster than `run_cli`)."""
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def assert_one_line_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture()
def own_root(tiny, data_root, tmp_path):
    """A private copy of the loaded synth-tiny root, free to damage."""
    shutil.copytree(data_root / "synth_tiny", tmp_path / "synth_tiny")
    return tmp_path


BAD_ARGS = {
    "unknown-dataset": (["--dataset", "ogbn-nope"],
                        ["unknown dataset 'ogbn-nope'", "synth-tiny",
                         "ogbn-arxiv", "cora"]),
    "missing-root": (["--root", "/nonexistent/hmgraph-root"],
                     ["'/nonexistent/hmgraph-root' does not exist"]),
    "fanout-zero": (["--fanouts", "0"], ["invalid fanouts '0'"]),
    "fanout-letters": (["--fanouts", "a,b"], ["invalid fanouts 'a,b'",
                                              "'a' is not"]),
    "layers-mismatch": (["--fanouts", "5,5", "--layers", "3"],
                        ["--layers 3 does not match --fanouts 5,5"]),
    "bad-batch-size": (["--batch-size", "-4"], ["'-4' is not a positive"]),
    "negative-lr": (["--lr", "-1"],
                    ["argument --lr: '-1' is not a positive number"]),
    "negative-weight-decay": (["--weight-decay", "-2"],
                              ["argument --weight-decay: '-2' is not a "
                               "non-negative number"]),
    "bogus-device": (["--device", "bogus"],
                     ["'bogus' is not a device: cpu, cuda or cuda:N"]),
    "budget-over-100": (["--device-budget", "150%"],
                        ["device budget: budget '150%' is more than 100%"]),
}


def test_bad_paths_fail_before_loading(capsys, data_root, tmp_path):
    """--out or --root naming a file, an unparsable budget: one line, and
    no output folder left behind."""
    file = tmp_path / "a-file"
    file.write_text("x")
    base = ["train", "--dataset", "synth-tiny", "--root", str(data_root),
            "--epochs", "1"]
    assert_one_line_error(run_main(capsys, *base, "--out", str(file)),
                          f"--out {file} is a file; give a folder")
    assert_one_line_error(
        run_main(capsys, *base, "--out", str(file / "sub")),
        f"{file} is a file, not a folder")
    out = tmp_path / "never-made"
    assert_one_line_error(
        run_main(capsys, "train", "--dataset", "synth-tiny", "--root",
                 str(file), "--out", str(out)),
        "is a file, not a folder; pass a folder as --root")
    assert_one_line_error(
        run_main(capsys, *base, "--host-budget", "lots", "--out", str(out)),
        "host budget:")
    assert not out.exists()


@pytest.mark.parametrize("args,fragments", BAD_ARGS.values(),
                         ids=BAD_ARGS.keys())
def test_bad_arguments(capsys, data_root, args, fragments):
    proc = run_main(capsys, "train", "--dataset", "synth-tiny", "--root",
                   str(data_root), "--epochs", "1", *args)
    assert_one_line_error(proc, *fragments)


def test_truncated_feature_file(own_root):
    path = own_root / "synth_tiny" / "hmgraph" / "node-feat.bin"
    with open(path, "r+b") as f:
        f.truncate(DATA_OFFSET + 4096)
    proc = run_cli("train", "--dataset", "synth-tiny", "--root",
                   str(own_root), "--epochs", "1")
    assert_one_line_error(proc, str(path), "truncated")


def test_checksum_mismatch(capsys, own_root):
    path = own_root / "synth_tiny" / "hmgraph" / "node-feat.bin"
    with open(path, "r+b") as f:
        f.seek(DATA_OFFSET + 10)
        f.write(b"\x00\x01\x02\x03")
    proc = run_main(capsys, "train", "--dataset", "synth-tiny", "--root",
                   str(own_root), "--epochs", "1")
    assert_one_line_error(proc, str(path), "fails its checksum")


def test_help_lists_datasets(capsys):
    proc = run_main(capsys, "train", "--help")
    assert proc.returncode == 0
    text = "".join(proc.stdout.split())  # help text wraps at hyphens
    assert "synth-products" in text and "ogbn-papers100M" in text


def test_disk_prints_and_caches_the_model(capsys, tmp_path):
    import json

    import numpy as np

    from hmgraph.cache.format import write_feature_file

    path = tmp_path / "node-feat.bin"
    write_feature_file(path, np.ones((4000, 100), dtype=np.float32))
    assert main(["disk", str(path), "--threads", "2", "--refresh"]) == 0
    out = capsys.readouterr().out
    assert "random 4 KiB reads/s at queue depth 2" in out
    cached = json.loads((tmp_path / "node-feat.bin.disk.json").read_text())
    cached = cached["models"]["2"]
    assert cached["queue_depth"] == 2 and cached["iops"] > 0
    printed = json.loads(out[out.index("{"):])
    assert printed["iops"] == cached["iops"]
    assert main(["disk", str(tmp_path / "missing.bin")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_amortizes_over_the_given_epochs(capsys):
    from hmgraph.cli import _build_parser

    args = _build_parser().parse_args(["bench", "--amortize-epochs", "3"])
    assert args.amortize_epochs == 3
    assert _build_parser().parse_args(["bench"]).amortize_epochs == 10
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["bench", "--amortize-epochs", "0"])
    assert "--amortize-epochs" in capsys.readouterr().err

"""The README's troubleshooting catalogue says what hmgraph really prints.

Each row of the table names a case, the bad input and the one-line
message. The rows that can be reproduced cheaply in this process are, and
their message must read exactly as in the README; the others are listed
here with the reason, so a new row cannot go unchecked unnoticed.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import dgl
import pytest
import torch

import hmgraph
from hmgraph.cache.feature import TensorFeature, check_ids
from hmgraph.cache.format import read_manifest, verify_feature_file
from hmgraph.cache.plan import make_plan
from hmgraph.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Troubleshooting: bad inputs and their messages"
#: Where the catalogue was made; the test's own folder stands in for it.
MADE_IN = "/tmp/rc"
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \| (.*) \|$")

#: Rows not reproduced here, and why.
NOT_REPRODUCED = {
    "out-unwritable": "the errno depends on the user's rights",
    "budget-over-memory": "its numbers are the machine's free memory",
    "renumbered-file-corrupt": "needs METIS clusters and a renumbering",
    "resume-fewer-epochs": "needs a training run (tests/test_train.py)",
    "empty-split": "no message (an epoch of no batches)",
    "launcher-killed": "no message (tests/test_distributed.py)",
    "feature-file-missing": "no message: rebuilt (tests/test_faults.py)",
    "hidden-past-memory": "its numbers are the machine's free memory "
                          "(tests/test_cli_faults.py)",
    "fold-record-wrong-shape": "needs a classify run "
                               "(tests/test_cli_faults.py)",
    "partition-killed": "no message (tests/test_cli_faults.py)",
}


def catalogue() -> dict[str, str]:
    """Case -> message (without backticks) of the README's table."""
    text = README.read_text()
    assert SECTION in text, "the troubleshooting section is gone"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = ROW.match(line)
        if found:
            case, _, message = found.groups()
            rows[case] = message.strip().strip("`")
    return rows


def cli(*args: str) -> str:
    """stderr of ``hmgraph train`` on synth-tiny under ``root``, run here."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(["train", "--dataset", "synth-tiny", "--root",
                         "root", "--epochs", "1", "--no-progress", *args])
        except SystemExit as exit_:
            code = exit_.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    return lines[0]


def raised(call) -> str:
    """The one-line message ``call`` raises."""
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def graph():
    g = dgl.rand_graph(100, 500)
    g.ndata["feat"] = torch.randn(100, 8)
    return g


def loader(*args, **kwargs):
    return lambda: hmgraph.DataLoader(graph(), *args, **kwargs)


SAMPLER = dgl.dataloading.NeighborSampler([2])
IDS = torch.arange(10)


def feature_file(tiny, damage=None) -> Path:
    """synth-tiny's feature file copied to ``root/``, damaged."""
    path = Path("root/synth_tiny/hmgraph/node-feat.bin")
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny.feature_path, path)
    if damage is not None:
        with open(path, "r+b") as file:
            damage(file)
    return path


def cut(file):
    file.truncate(8192)


def overwrite(file):
    from hmgraph.cache.format import DATA_OFFSET

    file.seek(DATA_OFFSET + 10)
    file.write(bytes([0, 1, 2, 3]))


def own_file(cut_to: int) -> str:
    """``own.bin`` of `graph`'s rows, written here and cut short."""
    from hmgraph.cache.format import write_feature_file

    write_feature_file("own.bin", torch.randn(100, 8))
    os.truncate("own.bin", cut_to)
    return "own.bin"


def file_error(check, tiny, damage) -> str:
    path = feature_file(tiny, damage)
    if damage is None:
        path.unlink()
    return f"hmgraph train: error: {raised(lambda: check(path))}"


def swapped_feature_file(tiny) -> str:
    """synth-tiny's meta beside a same-shape feature file of zeros."""
    import numpy as np

    from hmgraph.cache.format import write_feature_file
    from hmgraph.datasets.synthetic import check_feature_file

    folder = Path("root/synth_tiny")
    path = feature_file(tiny)
    shutil.copy(tiny.info["folder"] / "hmgraph-meta.json", folder)
    write_feature_file(path, np.zeros((tiny.num_nodes, 100), np.float32))
    return ("hmgraph train: error: "
            f"{raised(lambda: check_feature_file(folder))}")


def payload(path: str, write) -> Path:
    """``path`` holding a pickle that would call ``exec`` (``write`` it)."""
    from test_untrusted import Payload

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, Payload(Path("PAYLOAD-RAN").absolute()))
    return path


def split_payload() -> str:
    from hmgraph.datasets.pickles import load_torch

    path = payload("root/synth_tiny/split/random/split_dict.pt",
                   lambda path, obj: torch.save({"train": obj}, path))
    return ("hmgraph train: error: "
            f"{raised(lambda: load_torch(path, 'split file'))}")


def planetoid_payload() -> str:
    import pickle

    payload("Cora/ind.cora.x",
            lambda path, obj: path.write_bytes(pickle.dumps(obj, 2)))
    Path("Cora/ind.cora.graph").touch()
    return cli("--dataset", "cora", "--root", ".")


def classify_cli(*args: str) -> str:
    """The one line ``hmgraph classify ARGS`` prints on stderr, run here
    (before it loads a dataset)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(["classify", *args])
        except SystemExit as exit_:
            code = exit_.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    return lines[0]


def disk_cli(*args: str) -> str:
    """The one line ``hmgraph disk ARGS`` prints on stderr, run here."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["disk", *args])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    return lines[0]


def disk_warning(key: str, value) -> str:
    """The warning for a cached disk model holding ``key: value``."""
    import json
    import logging

    from hmgraph.cache import disk

    path = Path("node-feat.bin.disk.json")
    record = disk.FALLBACK.as_dict()
    path.write_text(json.dumps({
        "version": disk._MODEL_VERSION, "device": record["device"],
        "models": {str(record["queue_depth"]): dict(record,
                                                    **{key: value})}}))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(disk.__name__)
    logger.addHandler(handler)
    try:
        assert disk._load(path, record["device"], record["queue_depth"]) \
            is None
    finally:
        logger.removeHandler(handler)
    return f"WARNING {disk.__name__}: {records[0].getMessage()}"


def made(make, path: str) -> str:
    make(path)
    return path


REPRODUCE = {
    "root-missing": lambda _: cli("--root", "/nonexistent/root"),
    "root-file": lambda _: cli("--root", "afile"),
    "out-file": lambda _: cli("--out", "afile"),
    "out-under-file": lambda _: cli("--out", "afile/sub"),
    "device-bogus": lambda _: cli("--device", "bogus"),
    "lr-negative": lambda _: cli("--lr", "-1"),
    "weight-decay-negative": lambda _: cli("--weight-decay", "-2"),
    "batch-size-fraction": lambda _: cli("--batch-size", "2.5"),
    "fanouts-zero": lambda _: cli("--fanouts", "0"),
    "layers-mismatch": lambda _: cli("--fanouts", "5,5", "--layers", "3"),
    "dataset-unknown": lambda _: cli("--dataset", "ogbn-nope"),
    "cache-unknown": lambda _: cli("--cache", "fifo"),
    "budget-unparsable": lambda _: cli("--host-budget", "lots"),
    "budget-over-100": lambda _: cli("--device-budget", "150%"),
    "budget-below-metadata": lambda _: raised(lambda: make_plan(
        "hmgraph", 100_000, 400, 0, 1_000_000,
        counts=torch.zeros(100_000))),
    "budget-below-metadata-device-rows": lambda _: raised(
        lambda: make_plan("lru", 100_000, 400, 2500 * 400, 1_000_000)),
    "feature-file-truncated": lambda tiny: file_error(read_manifest, tiny,
                                                      cut),
    "feature-file-corrupt": lambda tiny: file_error(verify_feature_file,
                                                    tiny, overwrite),
    "features-file-truncated": lambda _: raised(
        loader(IDS, SAMPLER, features=own_file(cut_to=4096))),
    "features-missing-path": lambda _: raised(
        loader(IDS, SAMPLER, features="nope.bin")),
    "features-path-directory": lambda _: raised(
        loader(IDS, SAMPLER, features="root")),
    "features-path-fifo": lambda _: raised(
        loader(IDS, SAMPLER, features=made(os.mkfifo, "fifo"))),
    "features-path-symlink-loop": lambda _: raised(loader(
        IDS, SAMPLER, features=made(lambda p: os.symlink(p, p), "loop"))),
    "features-path-dangling-symlink": lambda _: raised(loader(
        IDS, SAMPLER,
        features=made(lambda p: os.symlink("gone", p), "dangling"))),
    "feature-file-swapped": swapped_feature_file,
    "split-file-payload": lambda _: split_payload(),
    "planetoid-file-payload": lambda _: planetoid_payload(),
    "disk-not-feature-file": lambda _: disk_cli("afile"),
    "disk-model-bad-value": lambda _: disk_warning("iops", float("nan")),
    "features-wrong-rows": lambda _: raised(
        loader(IDS, SAMPLER, features=torch.randn(99, 8))),
    "features-wrong-shape": lambda _: raised(
        loader(IDS, SAMPLER, features=torch.randn(100))),
    "batch-size-float": lambda _: raised(
        loader(IDS, SAMPLER, batch_size=2.5)),
    "indices-2d": lambda _: raised(
        loader(torch.arange(10).view(2, 5), SAMPLER)),
    "indices-float": lambda _: raised(loader(torch.rand(10), SAMPLER)),
    "indices-out-of-range": lambda _: raised(
        loader(torch.tensor([1, 100]), SAMPLER)),
    "ids-2d": lambda _: raised(lambda: TensorFeature(
        torch.randn(100, 8)).read(torch.zeros(2, 2, dtype=torch.int64))),
    "ids-out-of-range": lambda _: raised(
        lambda: check_ids(torch.tensor([3, 700, 912, 5]), 600)),
    "ids-float": lambda _: raised(
        lambda: check_ids(torch.tensor([1.0]), 600)),
    "cache-unknown-python": lambda _: raised(
        loader(IDS, SAMPLER, cache="fifo")),
    "staging-share": lambda _: raised(
        lambda: make_plan("lru", 1000, 100, 0, 40_000, staging=1.0)),
    "lr-infinite": lambda _: cli("--lr", "inf"),
    "classify-device-bogus": lambda _: classify_cli("--device", "bogus"),
    "classify-out-file": lambda _: classify_cli("--out", "afile"),
    "grid-value-refused": lambda _: classify_cli("--grid", "lr=inf"),
    "grid-value-twice": lambda _: classify_cli("--grid", "batch_size=32,32"),
}


def test_every_row_is_reproduced_or_excused():
    rows = set(catalogue())
    assert rows == set(REPRODUCE) | set(NOT_REPRODUCED), (
        "README rows and this test disagree: "
        f"{sorted(rows ^ (set(REPRODUCE) | set(NOT_REPRODUCED)))}")
    assert not set(REPRODUCE) & set(NOT_REPRODUCED)


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """The catalogue's folder: ``root/`` and a plain file ``afile``."""
    (tmp_path / "root").mkdir()
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("case", sorted(REPRODUCE))
def test_readme_message_is_what_hmgraph_says(case, workdir, request):
    expected = catalogue()[case].replace(MADE_IN, str(workdir))
    tiny = request.getfixturevalue("tiny") \
        if case.startswith("feature-file") else None
    assert REPRODUCE[case](tiny) == expected
    assert os.listdir(workdir / "root") in ([], ["synth_tiny"])

"""DGL's own example scripts, run on `hmgraph.DataLoader` by one import.

``tests/dgl_examples`` holds DGL 2.1.0's GraphSAGE examples
(``node_classification.py`` on ogbn-products, ``link_pred.py`` on
ogbl-citation2). Each runs twice in a subprocess, seeded alike: as DGL
ships it, and with ``from dgl.dataloading import (`` changed to
``from hmgraph.dataloading import (`` -- the only line that differs. The
printed losses and metrics must agree.

There is no internet here, so the scripts' unmodified data loading is
pointed at Cora: the test writes it in ogb's layout (``dataset/<dir>/``
with ``RELEASE_v<version>.txt``, ``processed/dgl_data_processed`` and
``split/<split>/split_dict.pt``, which ogb reads as they are).
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent / "dgl_examples"
SHARED_EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / \
    "dgl_examples"
SCRIPTS = ("node_classification", "link_pred")
HEADER_END = "unmodified below this header.\n\n"
DGL_IMPORT = "from dgl.dataloading import ("
HMGRAPH_IMPORT = "from hmgraph.dataloading import ("
SEED = 0
# Largest allowed difference between the two runs' printed numbers.
LOSS_TOL = 1e-3
METRIC_TOL = 0.02
RUN_TIMEOUT_SECONDS = 600
# Link prediction: held-out edges per split and negatives per edge.
HELD_OUT = 200
NEGATIVES = 20


def _ogb_meta(kind: str, name: str) -> dict:
    """ogb's ``master.csv`` column for ``name`` (version, split, ...)."""
    import ogb
    import pandas as pd

    path = Path(ogb.__file__).parent / kind / "master.csv"
    return pd.read_csv(path, index_col=0, keep_default_na=False)[name]


def _ogb_folder(root: Path, kind: str, name: str) -> tuple[Path, Path]:
    """Create ``root/<dir_name>`` as ogb finds it; its processed file and
    split folder."""
    meta = _ogb_meta(kind, name)
    folder = root / name.replace("-", "_")
    (folder / "processed").mkdir(parents=True)
    # Without the release marker ogb asks on stdin whether to re-download.
    (folder / f"RELEASE_v{meta['version']}.txt").touch()
    split = folder / "split" / meta["split"]
    split.mkdir(parents=True)
    return folder / "processed" / "dgl_data_processed", split


def _write_products(root: Path, cora: dict) -> None:
    """Cora as ``ogbn-products``: bidirected graph, ``feat``, labels of
    shape (N, 1); valid and test are Planetoid's, train all other nodes."""
    import dgl
    import torch

    processed, split = _ogb_folder(root, "nodeproppred", "ogbn-products")
    graph = dgl.graph((torch.from_numpy(cora["src"]),
                       torch.from_numpy(cora["dst"])),
                      num_nodes=cora["num_nodes"])
    graph.ndata["feat"] = cora["feat"]
    dgl.save_graphs(str(processed), [graph],
                    {"labels": cora["label"].view(-1, 1)})
    held = torch.zeros(cora["num_nodes"], dtype=torch.bool)
    held[cora["valid"]] = True
    held[cora["test"]] = True
    torch.save({"train": torch.nonzero(~held).view(-1),
                "valid": cora["valid"], "test": cora["test"]},
               split / "split_dict.pt")


def _write_citation2(root: Path, cora: dict) -> None:
    """Cora as ``ogbl-citation2``: each undirected edge once; valid and
    test hold out `HELD_OUT` edges each, with `NEGATIVES` random
    negatives; the graph keeps the other edges and ``feat``."""
    import dgl
    import torch

    processed, split = _ogb_folder(root, "linkproppred", "ogbl-citation2")
    once = cora["src"] < cora["dst"]
    src, dst = cora["src"][once], cora["dst"][once]
    rng = np.random.default_rng(SEED)
    order = rng.permutation(src.size)
    parts = {"valid": order[:HELD_OUT],
             "test": order[HELD_OUT:2 * HELD_OUT],
             "train": order[2 * HELD_OUT:]}
    edges = {}
    for part, ids in parts.items():
        edges[part] = {"source_node": torch.from_numpy(src[ids]),
                       "target_node": torch.from_numpy(dst[ids])}
        if part != "train":
            edges[part]["target_node_neg"] = torch.from_numpy(rng.integers(
                0, cora["num_nodes"], size=(ids.size, NEGATIVES)))
    graph = dgl.graph((edges["train"]["source_node"],
                       edges["train"]["target_node"]),
                      num_nodes=cora["num_nodes"])
    graph.ndata["feat"] = cora["feat"]
    dgl.save_graphs(str(processed), [graph], {})
    torch.save(edges, split / "split_dict.pt")


WRITERS = {"node_classification": _write_products,
           "link_pred": _write_citation2}


@pytest.fixture(scope="module")
def cora(shared_data) -> dict:
    """Cora from the shared Planetoid files (`read_planetoid`'s dict)."""
    from hmgraph.datasets.planetoid import find_planetoid, read_planetoid

    folder = find_planetoid("cora", shared_data)
    if folder is None:
        pytest.skip(f"Cora's Planetoid files not found under {shared_data}")
    return read_planetoid("cora", folder)


def _swapped(text: str) -> str:
    """The script with its DataLoader import taken from hmgraph."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip() == DGL_IMPORT]
    assert len(hits) == 1, f"expected one {DGL_IMPORT!r} line, found {hits}"
    lines[hits[0]] = HMGRAPH_IMPORT + "\n"
    swapped = "".join(lines)
    changed = [line for line in difflib.ndiff(text.splitlines(),
                                              swapped.splitlines())
               if line.startswith(("- ", "+ "))]
    assert changed == ["- " + DGL_IMPORT, "+ " + HMGRAPH_IMPORT], changed
    return swapped


def _launch(script: Path, cwd: Path, tag: str):
    """Start ``run.py script SEED`` in ``cwd``; DGL caches in a fresh
    folder, stdout and stderr go to files (tqdm writes a lot)."""
    download_dir = cwd / f"dgl_download_{tag}"
    download_dir.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
               DGL_DOWNLOAD_DIR=str(download_dir), OUTDATED_IGNORE="1",
               PYTHONHASHSEED=str(SEED))
    with open(cwd / f"{tag}.out", "w") as out, \
            open(cwd / f"{tag}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, str(EXAMPLES / "run.py"), str(script),
             str(SEED)],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
            stderr=err,
        )


def _wait(procs: dict, timeout: float) -> dict:
    """Wait for all of ``procs``; each one's seconds until it ended."""
    start = time.perf_counter()
    seconds = {}
    try:
        while len(seconds) < len(procs):
            elapsed = time.perf_counter() - start
            if elapsed > timeout:
                raise TimeoutError(f"still running after {timeout}s: "
                                   f"{sorted(set(procs) - set(seconds))}")
            for run, proc in procs.items():
                if run not in seconds and proc.poll() is not None:
                    seconds[run] = elapsed
            time.sleep(0.05)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return seconds


_EPOCH = re.compile(r"^Epoch (\d+) \| Loss ([-\d.naif]+)"
                    r"(?: \| Accuracy ([-\d.naif]+))?", re.M)
_FINAL = {
    "node_classification": re.compile(r"^Test Accuracy ([-\d.naif]+)", re.M),
    "link_pred": re.compile(
        r"^Validation MRR ([-\d.naif]+), Test MRR ([-\d.naif]+)", re.M),
}


def _parse(name: str, stdout: str) -> dict:
    """Per-epoch losses (and accuracies) and the final metrics printed."""
    epochs = _EPOCH.findall(stdout)
    final = _FINAL[name].search(stdout)
    assert epochs and final, f"unexpected output:\n{stdout}"
    return {
        "loss": [float(loss) for _, loss, _ in epochs],
        "accuracy": [float(acc) for _, _, acc in epochs if acc],
        "final": [float(value) for value in final.groups()],
    }


def _close(a: list[float], b: list[float], tol: float) -> bool:
    """Same length, and each pair within ``tol``."""
    return len(a) == len(b) and all(
        abs(x - y) <= tol for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_script_matches_dgl(name, cora, tmp_path):
    """The script prints the same numbers on hmgraph's DataLoader."""
    WRITERS[name](tmp_path / "dataset", cora)
    original = (EXAMPLES / f"{name}.py").read_text()
    scripts = {"dgl": tmp_path / f"{name}.py",
               "hmgraph": tmp_path / f"{name}_hmgraph.py"}
    scripts["dgl"].write_text(original)
    scripts["hmgraph"].write_text(_swapped(original))

    # Both at once: each is single-threaded and they share nothing but the
    # dataset folder, which ogb only reads.
    procs = {run: _launch(script, tmp_path, f"{name}_{run}")
             for run, script in scripts.items()}
    seconds = _wait(procs, RUN_TIMEOUT_SECONDS)
    results = {}
    for run, proc in procs.items():
        stdout = (tmp_path / f"{name}_{run}.out").read_text()
        stderr = (tmp_path / f"{name}_{run}.err").read_text()
        print(f"--- {name} on {run}'s DataLoader: exit {proc.returncode} "
              f"after {seconds[run]:.1f}s\n{stdout}")
        assert proc.returncode == 0, (
            f"{name} on {run}'s DataLoader exited {proc.returncode}; "
            f"stderr ends:\n{stderr[-3000:]}"
        )
        results[run] = _parse(name, stdout)

    dgl_run, hm_run = results["dgl"], results["hmgraph"]
    print(f"{name}: dgl {dgl_run}\n{name}: hmgraph {hm_run}")
    # Training must do something, or agreeing would prove nothing.
    assert dgl_run["loss"][-1] < dgl_run["loss"][0], dgl_run
    assert _close(dgl_run["loss"], hm_run["loss"], LOSS_TOL), (dgl_run,
                                                                 hm_run)
    assert _close(dgl_run["accuracy"], hm_run["accuracy"], METRIC_TOL), (
        dgl_run, hm_run)
    assert _close(dgl_run["final"], hm_run["final"], METRIC_TOL), (dgl_run,
                                                                   hm_run)


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_copies_are_unmodified(name):
    """Below the licence header, the copies are DGL's scripts byte for
    byte (checked against the shared copies where present)."""
    text = (EXAMPLES / f"{name}.py").read_text()
    header, sep, body = text.partition(HEADER_END)
    assert sep and all(line.startswith("# ") for line in
                       header.splitlines()), header
    assert "tag v2.1.0" in header and "Apache License 2.0" in header
    shared = SHARED_EXAMPLES / f"{name}.py"
    if not shared.is_file():
        pytest.skip(f"DGL's scripts not found at {SHARED_EXAMPLES}")
    assert body == shared.read_text()

"""Runs that share a dataset root: derived files per content, written once.

Two trainings on one ``--root`` with different seeds profile different
batches, so their hot-first permutations differ. Each must read the rows of
its own permutation, whatever the other writes meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hmgraph.cache.format import open_feature_file
from hmgraph.datasets.renumbered import DERIVED_RECORD, permuted

#: One training's preparation and first batches, as `hmgraph train` runs
#: them: load, profile, rewrite hot-first, then (once the other run has
#: rewritten too) read batches through the cache and check every row
#: against the source file's row of this run's own permutation.
WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path

    import numpy as np

    from hmgraph import datasets
    from hmgraph.cache.format import open_feature_file
    from hmgraph.train import TrainConfig, make_loader, make_sampler

    root, seed, ready, other, out = sys.argv[1:]
    config = TrainConfig(
        dataset="synth-tiny", root=root, seed=int(seed), fanouts=[5, 5],
        batch_size=256, features_on="disk", cache="hmgraph",
        device_budget="5%", host_budget="20%", layout="hot-first",
        profile_batches=8, prefetch=1, progress=False)
    data = datasets.load("synth-tiny", root, features_on="disk")
    _, source = open_feature_file(data.feature_path)
    dataset, sampler = make_sampler(config, data)
    Path(ready).touch()
    deadline = time.monotonic() + 300
    while not Path(other).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    loader, _ = make_loader(config, dataset, sampler, "cpu")
    perm = dataset.info["perm"].numpy()
    rows = wrong = 0
    for step, (input_nodes, _, blocks) in enumerate(loader):
        feat = blocks[0].srcdata["feat"].numpy()
        want = source[perm[input_nodes.numpy()]]
        wrong += int((feat != want).any(axis=1).sum())
        rows += int(input_nodes.numel())
        if step == 7:
            break
    loader.close()
    Path(out).write_text(json.dumps({
        "rows": rows, "wrong": wrong, "path": str(dataset.feature_path),
        "perm": perm.tolist()}))
""")


@pytest.fixture()
def shared_root(data_root, tmp_path) -> Path:
    """A root of its own holding synth-tiny (copied, not regenerated)."""
    root = tmp_path / "root"
    shutil.copytree(data_root / "synth_tiny", root / "synth_tiny",
                    ignore=shutil.ignore_patterns("renumbered-*", "metis-*"))
    return root


def test_two_runs_on_one_root_read_their_own_rows(shared_root, tmp_path):
    """Seeds 111 and 110 side by side: both rewrite hot-first, then read.

    Each waits for the other to have rewritten before it reads, the order
    in which one run used to read the other's permutation.
    """
    runs = {}
    for seed, other in ((111, 110), (110, 111)):
        runs[seed] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(shared_root), str(seed),
             str(tmp_path / f"ready-{seed}"), str(tmp_path / f"ready-{other}"),
             str(tmp_path / f"out-{seed}.json")],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    results = {}
    for seed, process in runs.items():
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
        results[seed] = json.loads(
            (tmp_path / f"out-{seed}.json").read_text())
    assert results[111]["perm"] != results[110]["perm"]
    for seed, result in results.items():
        assert result["rows"] > 0, seed
        assert result["wrong"] == 0, (seed, result["wrong"], result["rows"])
    assert results[111]["path"] != results[110]["path"]
    for result in results.values():
        # The folder each read stays its own: its perm.npy is its order.
        folder = Path(result["path"]).parent
        assert folder.name.startswith("renumbered-hot-first-")
        assert np.load(folder / "perm.npy").tolist() == result["perm"]


def _private(tiny, tmp_path):
    """``tiny`` with its feature file copied to a folder of the test's."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(tiny.feature_path, folder / tiny.feature_path.name)
    return dataclasses.replace(tiny, feature_path=folder /
                               tiny.feature_path.name)


def test_two_permutations_keep_two_folders(tiny, tmp_path):
    source = _private(tiny, tmp_path)
    generator = torch.Generator().manual_seed(0)
    perms = [torch.randperm(tiny.num_nodes, generator=generator)
             for _ in range(2)]
    first, second = (permuted(source, p, "t") for p in perms)
    assert first.info["folder"] != second.info["folder"]
    # Neither rewrote the other: both are reused, rows exact.
    _, rows = open_feature_file(source.feature_path)
    for perm, derived in zip(perms, (first, second), strict=True):
        again = permuted(source, perm, "t")
        assert again.info["reused"]
        assert again.feature_path == derived.feature_path
        _, new = open_feature_file(again.feature_path, verify=True)
        np.testing.assert_array_equal(new, rows[perm.numpy()])


#: Ways ``perm.npy`` can disagree with its record.
PERM_DAMAGE = ["other-order", "short", "int32", "not-npy", "missing"]


@pytest.mark.parametrize("damage", PERM_DAMAGE, ids=PERM_DAMAGE)
def test_reused_folder_checks_its_perm(tiny, tmp_path, damage):
    """A ``perm.npy`` that is not the recorded permutation is rewritten."""
    source = _private(tiny, tmp_path)
    perm = torch.randperm(tiny.num_nodes,
                          generator=torch.Generator().manual_seed(1))
    folder = permuted(source, perm, "t").info["folder"]
    stored = np.load(folder / "perm.npy")
    path = folder / "perm.npy"
    if damage == "missing":
        path.unlink()
    elif damage == "not-npy":
        path.write_bytes(b"not a numpy file")
    else:
        bad = {"other-order": stored[::-1], "short": stored[:-1],
               "int32": stored.astype(np.int32)}[damage]
        np.save(path, np.ascontiguousarray(bad))
    again = permuted(source, perm, "t")
    assert not again.info["reused"]
    np.testing.assert_array_equal(np.load(path), stored)
    assert json.loads((folder / DERIVED_RECORD).read_text())["checksum"]
    assert permuted(source, perm, "t").info["reused"]


def test_one_writer_the_others_wait_and_reuse(tiny, tmp_path):
    """Four callers of one order at once: one writes, three reuse."""
    import threading

    source = _private(tiny, tmp_path)
    perm = torch.randperm(tiny.num_nodes,
                          generator=torch.Generator().manual_seed(2))
    start, results, errors = threading.Barrier(4), [], []

    def derive():
        start.wait()
        try:
            results.append(permuted(source, perm, "t", verify=False))
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=derive) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(r.info["reused"] for r in results) == [False] + [True] * 3
    assert len({r.feature_path for r in results}) == 1
    _, rows = open_feature_file(source.feature_path)
    _, new = open_feature_file(results[0].feature_path, verify=True)
    np.testing.assert_array_equal(new, rows[perm.numpy()])

"""Fault injection on the fetch path: after each fault the loader stops
with one line or recovers, and the next epoch's rows are bit-exact.

The suite also runs under ``python -O`` (`test_suite_under_python_O`), so
no guarantee rests on an ``assert``.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading

import dgl
import numpy as np
import pytest
import torch

import hmgraph
from hmgraph.cache.feature import TensorFeature
from hmgraph.inputs import PATH_REMEDY

POLICIES = ["lru", "clock", "degree", "presample", "hmgraph"]


@pytest.fixture(scope="module")
def graph():
    generator = torch.Generator().manual_seed(0)
    g = dgl.rand_graph(600, 6000)
    g.ndata["feat"] = torch.randn(600, 16, generator=generator)
    g.ndata["label"] = torch.randint(0, 4, (600,), generator=generator)
    return g


class FlakySource(TensorFeature):
    """Rows in memory whose ``fail_at``-th read raises EIO (once)."""

    def __init__(self, rows, fail_at: int):
        super().__init__(rows)
        self.reads = 0
        self.fail_at = fail_at

    def _read(self, ids):
        self.reads += 1
        if self.reads == self.fail_at:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return super()._read(ids)


def loader_for(graph, features, policy, prefetch, **kwargs):
    row_bytes = 16 * 4
    return hmgraph.DataLoader(
        graph, torch.arange(0, 600, 2), dgl.dataloading.NeighborSampler(
            [4, 4]), batch_size=32, shuffle=True, seed=0, features=features,
        cache=policy, device_budget_bytes=60 * row_bytes,
        host_budget_bytes=120 * row_bytes, prefetch=prefetch, **kwargs)


def check(condition, message="check failed") -> None:
    """``assert`` that survives ``python -O``."""
    if not condition:
        raise AssertionError(message)


def exact_epoch(loader, rows) -> int:
    """Iterate one epoch; every batch's rows must equal ``rows``'."""
    count = 0
    for batch in loader:
        check(torch.equal(batch.x, rows[batch[0].long()]),
              f"batch {count}: rows differ from the source")
        count += 1
    check(count == len(loader), f"{count} of {len(loader)} batches")
    return count


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("policy", POLICIES)
def test_failed_source_read_leaves_the_cache_as_it_was(graph, policy,
                                                       prefetch):
    rows = graph.ndata["feat"]
    # Reads during construction (the static fill) come first: fail later.
    source = FlakySource(rows, fail_at=10**9)
    loader = loader_for(graph, source, policy, prefetch)
    source.fail_at = source.reads + 4
    with pytest.raises(OSError, match="Input/output error") as info:
        exact_epoch(loader, rows)
    check("\n" not in str(info.value))
    # The source reads again: every later epoch is exact, twice over.
    exact_epoch(loader, rows)
    exact_epoch(loader, rows)
    check(loader.stats.hit_rate("source") < 1.0)


def test_feature_file_truncated_mid_epoch(tiny, tmp_path):
    from hmgraph.cache.format import open_feature_file

    path = tmp_path / "node-feat.bin"
    shutil.copy(tiny.feature_path, path)
    for extra in tiny.feature_path.parent.glob(
            tiny.feature_path.name + ".*"):
        shutil.copy(extra, tmp_path / extra.name)
    _, mapped = open_feature_file(tiny.feature_path)
    rows = torch.from_numpy(np.asarray(mapped))
    size = path.stat().st_size
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"], dgl.dataloading.NeighborSampler(
            [5, 5]), batch_size=100, shuffle=True, seed=0, features=path,
        cache="hmgraph", device_budget_bytes=1 << 20,
        host_budget_bytes=1 << 20, prefetch=2)  # half the rows: misses
    try:
        batches = iter(loader)
        first = next(batches)
        check(torch.equal(first.x, rows[first[0]]))
        with open(path, "r+b") as file:
            file.truncate(size // 3)
        with pytest.raises(ValueError, match="is truncated") as info:
            for batch in batches:
                check(torch.equal(batch.x, rows[batch[0]]))
        check("\n" not in str(info.value))
        # A file given by path may be the user's own: the way out says so.
        check(str(info.value).endswith(PATH_REMEDY), str(info.value))
        shutil.copy(tiny.feature_path, path)  # the file is whole again
        exact_epoch(loader, rows)
    finally:
        loader.close()


#: Datasets whose feature file hmgraph makes again once deleted.
REBUILT = ["synth-tiny", "cora"]


@pytest.mark.parametrize("name", REBUILT, ids=REBUILT)
def test_deleted_feature_file_is_rebuilt_bit_identical(name, data_root,
                                                       tmp_path, request):
    """Truncated: refused with "delete it to rebuild it". Deleted: the
    next load makes it again, the same bytes as before."""
    from hmgraph import datasets
    from hmgraph.cache.format import REBUILD, FeatureFileError

    root = tmp_path / "root"
    if name == "cora":  # skips where the shared datasets are absent
        shared_data = request.getfixturevalue("shared_data")
        shutil.copytree(shared_data / "Cora", root / "Cora",
                        copy_function=shutil.copyfile)
        (root / "Cora").chmod(0o755)
    else:
        shutil.copytree(data_root / "synth_tiny", root / "synth_tiny",
                        ignore=shutil.ignore_patterns("renumbered-*"))
    first = datasets.load(name, root, features_on="disk")
    path = first.feature_path
    whole = path.read_bytes()
    with open(path, "r+b") as file:
        file.truncate(8192)
    with pytest.raises(FeatureFileError, match="is truncated: 8192 bytes") \
            as info:
        datasets.load(name, root, features_on="disk")
    check(str(info.value).endswith(REBUILD), str(info.value))
    path.unlink()
    again = datasets.load(name, root, features_on="disk")
    check(again.feature_path == path)
    check(path.read_bytes() == whole, "the rebuilt file differs")
    again = datasets.load(name, root)  # and reused as it is
    check(path.read_bytes() == whole)


def test_damaged_files_hmgraph_does_not_make_name_what_works(graph,
                                                             tmp_path):
    """A file of the user's own, or a partition's, is not made again by
    hmgraph: its message names what works instead of deleting it."""
    from hmgraph.cache.format import FeatureFileError, write_feature_file
    from hmgraph.distributed.feature import (
        PARTITION_REMEDY,
        PartitionFeature,
    )

    own = tmp_path / "own.bin"
    write_feature_file(own, graph.ndata["feat"])
    with open(own, "r+b") as file:
        file.truncate(8192)
    with pytest.raises(FeatureFileError, match="is truncated") as info:
        loader_for(graph, own, "lru", 0)
    check(str(info.value).endswith(PATH_REMEDY), str(info.value))
    part = tmp_path / "part0"
    part.mkdir()
    np.save(part / "local_ids.npy", np.arange(600))
    shutil.copy(own, part / "feat.bin")
    with pytest.raises(FeatureFileError, match="is truncated") as info:
        PartitionFeature(part, remote=None)
    check(str(info.value).endswith(PARTITION_REMEDY), str(info.value))
    check("delete it" not in str(info.value), str(info.value))


class FailingOnce(dgl.dataloading.NeighborSampler):
    """Raises on its ``fail_at``-th call, once."""

    def __init__(self, fanouts, fail_at):
        super().__init__(fanouts)
        self.calls = 0
        self.fail_at = fail_at

    def sample(self, g, seeds, exclude_eids=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("sampler failed (injected)")
        return super().sample(g, seeds, exclude_eids)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_sampler_that_raises(graph, prefetch):
    rows = graph.ndata["feat"]
    sampler = FailingOnce([4, 4], fail_at=3)
    loader = hmgraph.DataLoader(graph, torch.arange(0, 600, 2), sampler,
                                batch_size=32, shuffle=True, cache="lru",
                                host_budget_bytes=4000, prefetch=prefetch)
    with pytest.raises(RuntimeError, match=r"^sampler failed \(injected\)$"):
        exact_epoch(loader, rows)
    exact_epoch(loader, rows)


def test_prefetch_thread_that_dies_without_a_word(graph, monkeypatch):
    from hmgraph import pipeline

    rows = graph.ndata["feat"]
    loader = loader_for(graph, rows, "hmgraph", prefetch=2)
    real = pipeline.Prefetcher._run
    monkeypatch.setattr(pipeline.Prefetcher, "_run",
                        lambda self: None)  # returns: no item, no end
    with pytest.raises(RuntimeError, match="died without a result"):
        exact_epoch(loader, rows)
    monkeypatch.setattr(pipeline.Prefetcher, "_run", real)
    exact_epoch(loader, rows)


@pytest.mark.parametrize("policy", POLICIES)
def test_two_concurrent_iterators(graph, policy):
    """As DGL, a new iteration may start while one runs: both are exact."""
    rows = graph.ndata["feat"]
    loader = loader_for(graph, rows, policy, prefetch=2)
    first, second = iter(loader), iter(loader)
    seen = 0
    for a, b in zip(first, second, strict=True):
        check(torch.equal(a.x, rows[a[0]]))
        check(torch.equal(b.x, rows[b[0]]))
        seen += 1
    check(seen == len(loader))
    exact_epoch(loader, rows)


def test_iterators_in_two_threads(graph):
    rows = graph.ndata["feat"]
    loader = loader_for(graph, rows, "hmgraph", prefetch=1)
    errors = []

    def run():
        try:
            exact_epoch(loader, rows)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check(not errors, errors)


REPEAT = """
import hashlib, torch, dgl, hmgraph
edges = torch.randint(0, 2000, (2, 30000),
                      generator=torch.Generator().manual_seed(0))
g = dgl.graph((edges[0], edges[1]), num_nodes=2000)
g.ndata["feat"] = torch.arange(2000 * 4, dtype=torch.float32).view(2000, 4)
loader = hmgraph.DataLoader(g, torch.arange(0, 2000, 3),
    dgl.dataloading.NeighborSampler([5, 5]), batch_size=64, shuffle=True,
    seed=3, prefetch={prefetch}, cache="lru", host_budget_bytes=8000)
order, inputs = hashlib.sha256(), hashlib.sha256()
for _ in range(2):
    for batch in loader:
        order.update(batch[1].numpy().tobytes())
        inputs.update(batch[0].numpy().tobytes())
print(order.hexdigest(), inputs.hexdigest())
"""


def test_seeded_runs_repeat_at_any_prefetch_depth():
    """With ``seed``: the order and the sampled blocks repeat, run after
    run and at any prefetch depth."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {}
    for prefetch in (0, 0, 2, 2):
        run = subprocess.run(
            [sys.executable, "-c", REPEAT.format(prefetch=prefetch)],
            env=env, capture_output=True, text=True, timeout=300)
        check(run.returncode == 0, run.stderr[-2000:])
        runs.setdefault(prefetch, []).append(run.stdout.split())
    check(runs[0][0] == runs[0][1] == runs[2][0] == runs[2][1])


@pytest.mark.skipif(not __debug__, reason="already running under -O")
def test_suite_under_python_O():
    """The same faults with asserts compiled out: nothing rests on them."""
    here = os.path.dirname(__file__)
    run = subprocess.run(
        [sys.executable, "-O", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-x", os.path.join(here, "test_faults.py"), "-k",
         "not under_python_O and not repeat"],
        capture_output=True, text=True, timeout=900,
        cwd=os.path.dirname(here))
    check(run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:])

"""Out of core: with features on disk nothing holds the feature matrix.

Disk mode keeps rows only in the feature file; evaluation reads through
the cache; preparation streams; memory stays bounded by the graph, the
budgets and a working set, whatever the size of the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hmgraph import datasets
from hmgraph.cache import FeatureFileError, FeatureFileWriter, FrozenView
from hmgraph.cache.budget import auto_host_budget
from hmgraph.cache.format import read_manifest, write_feature_file
from hmgraph.datasets import synthetic
from hmgraph.datasets.synthetic import (
    SPECS,
    feature_rows,
    generate,
    generate_graph,
    write_features,
)
from hmgraph.train import TrainConfig, train

TINY = SPECS["synth-tiny"]


def _run_python(code: str, timeout: int = 300) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- streaming preparation -------------------------------------------------

def test_feature_rows_do_not_depend_on_chunking():
    """Any slicing of the generator gives the same rows."""
    graph = generate_graph(TINY)
    whole = feature_rows(TINY, graph["label"], graph["centroid"], 0,
                         TINY.num_nodes)
    parts = [feature_rows(TINY, graph["label"], graph["centroid"], a,
                          min(a + 777, TINY.num_nodes))
             for a in range(0, TINY.num_nodes, 777)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(generate(TINY)["node_feat"], whole)


def test_streamed_file_equals_in_memory_file(tmp_path, monkeypatch):
    """Written block by block (ten blocks here), the file is byte-identical
    to writing the in-memory generator's matrix at once, and the same on a
    second run."""
    monkeypatch.setattr(synthetic, "FEATURE_BLOCK_ROWS", 1000)
    graph = generate_graph(TINY)
    first = write_features(TINY, graph["label"], graph["centroid"],
                           tmp_path / "a.bin")
    again = write_features(TINY, graph["label"], graph["centroid"],
                           tmp_path / "b.bin")
    whole = write_feature_file(tmp_path / "c.bin",
                               generate(TINY)["node_feat"])
    assert first == again == whole
    data = [(tmp_path / f"{n}.bin").read_bytes() for n in "abc"]
    assert data[0] == data[1] == data[2]


def test_writer_refuses_short_or_misshaped_input(tmp_path):
    path = tmp_path / "feat.bin"
    with pytest.raises(FeatureFileError, match="got 3 of its 10 rows"):
        with FeatureFileWriter(path, (10, 4), "float32") as out:
            out.write(np.zeros((3, 4), np.float32))
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # no temporary file left
    with pytest.raises(FeatureFileError, match="does not fit"):
        with FeatureFileWriter(path, (10, 4), "float32") as out:
            out.write(np.zeros((3, 5), np.float32))
    with pytest.raises(FeatureFileError, match="12 rows written"):
        with FeatureFileWriter(path, (10, 4), "float32") as out:
            out.write(np.zeros((12, 4), np.float32))
    assert not list(tmp_path.iterdir())


def test_killed_generation_leaves_nothing_trusted(tmp_path, monkeypatch):
    """A generation that dies mid-way leaves no dataset folder; the next
    run builds it and removes builds of dead processes."""
    def die(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "write_features", die)
    with pytest.raises(KeyboardInterrupt):
        synthetic.make_synthetic("synth-tiny", tmp_path)
    assert not (tmp_path / "synth_tiny").exists()
    monkeypatch.undo()
    stale = tmp_path / ".synth_tiny-999999999-abc"  # no such pid
    stale.mkdir()
    folder = synthetic.make_synthetic("synth-tiny", tmp_path)
    assert not stale.exists()
    assert read_manifest(synthetic.feature_path(folder)).shape == (
        TINY.num_nodes, TINY.feat_dim)


def test_older_layout_is_rebuilt(tmp_path):
    """A folder from the generator before streaming (no format 2) is not
    trusted: its features lived in ogb's files, not the feature file."""
    folder = synthetic.make_synthetic("synth-tiny", tmp_path)
    meta = folder / "hmgraph-meta.json"
    record = json.loads(meta.read_text())
    del record["format"]
    meta.write_text(json.dumps(record))
    synthetic.feature_path(folder).unlink()
    data = datasets.load("synth-tiny", tmp_path, features_on="disk")
    assert json.loads(meta.read_text())["format"] == 2
    assert data.feature_bytes == TINY.num_nodes * TINY.feat_dim * 4


# -- disk mode -------------------------------------------------------------

@pytest.mark.parametrize("features_on", ["disk", "memory"])
def test_disk_mode_holds_no_feature_matrix(data_root, features_on):
    """Load, train an epoch and evaluate layer-wise in a fresh process,
    then look at every live tensor and array: with features on disk none
    is half as large as the feature matrix and the graph holds no rows;
    with features in memory (the control) the scan finds the matrix."""
    result = _run_python(f"""
        import gc, json
        import numpy as np, torch
        from hmgraph import datasets
        from hmgraph.train import TrainConfig, train
        data = datasets.load("synth-tiny", {str(data_root)!r},
                             features_on={features_on!r})
        config = TrainConfig(dataset="synth-tiny", root={str(data_root)!r},
                             fanouts=[5, 5], epochs=1, hidden=16,
                             features_on={features_on!r}, cache="hmgraph",
                             host_budget="10%", eval="layerwise",
                             out={str(data_root / features_on)!r},
                             progress=False)
        result = train(config, data)
        limit = data.feature_bytes
        big = []
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                size = obj.untyped_storage().nbytes()
            elif isinstance(obj, np.ndarray) and \\
                    not isinstance(obj, np.memmap):
                size = obj.nbytes
            else:
                continue
            if size >= limit // 2:
                big.append([type(obj).__name__, list(obj.shape)])
        print(json.dumps({{"big": big, "ndata": list(data.graph.ndata),
                          "memory": result["memory"],
                          "valid": result["summary"]["valid_mean"]}}))
    """)
    memory = result["memory"]
    assert memory["host_budget_bytes"] == memory["feature_bytes"] // 10
    assert memory["peak_rss_bytes"] > memory["graph_bytes"] > 0
    # The plan's figure is a promise: graph + budgets (+ rows in memory)
    # + the batches in flight (three on disk: one training, one fetched,
    # one being fetched) + 2 GiB, and the run kept it.
    assert memory["batches_in_flight"] == (3 if features_on == "disk"
                                           else 4)
    rows = memory["feature_bytes"] if features_on == "memory" else 0
    assert memory["promise_bytes"] == memory["graph_bytes"] + rows \
        + memory["host_budget_bytes"] + memory["device_budget_bytes"] \
        + memory["batches_in_flight"] * memory["batch_input_bytes"] \
        + (2 << 30)
    assert memory["batch_input_bytes"] > 0
    assert memory["within_promise"] and \
        memory["peak_rss_bytes"] <= memory["promise_bytes"]
    assert 0.0 < result["valid"] <= 1.0
    if features_on == "memory":
        assert [TINY.num_nodes, TINY.feat_dim] in [b[1] for b in
                                                   result["big"]]
        assert "feat" in result["ndata"]
    else:
        assert result["big"] == []
        assert "feat" not in result["ndata"]


def test_disk_mode_features_are_the_file(data_root):
    disk = datasets.load("synth-tiny", data_root, features_on="disk")
    memory = datasets.load("synth-tiny", data_root)
    assert "feat" not in disk.graph.ndata
    assert isinstance(disk.features, np.memmap)
    assert not disk.features.flags.writeable
    np.testing.assert_array_equal(np.asarray(disk.features),
                                  memory.features.numpy())
    assert disk.feat_dim == memory.feat_dim == TINY.feat_dim
    assert disk.feature_bytes == memory.features.numel() * 4


def test_disk_mode_inference_equals_memory_mode(data_root):
    """Layer-wise inference reading rows through a frozen view of a disk
    cache equals inference over the in-memory matrix (the rows are bit
    for bit the same; the logits to float rounding, since two in-memory
    passes already differ by the order of threaded sums), and leaves the
    cache's counters and contents untouched."""
    import dgl

    from hmgraph.loader import DataLoader
    from hmgraph.models import build_model, layerwise_inference

    memory = datasets.load("synth-tiny", data_root)
    disk = datasets.load("synth-tiny", data_root, features_on="disk")
    torch.manual_seed(0)
    model = build_model("sage", TINY.feat_dim, 32, TINY.num_classes,
                        num_layers=2)
    want = layerwise_inference(model, memory.graph, memory.features,
                               batch_size=1000)
    loader = DataLoader(disk.graph, disk.split["train"],
                        dgl.dataloading.NeighborSampler([5, 5]),
                        features=disk.feature_path, batch_size=256,
                        cache="hmgraph", host_budget_bytes=400_000)
    # One epoch fills the host tier whatever static share the profile chose
    # (a share of 0 leaves it empty at construction).
    for _ in loader:
        pass
    requests = loader.cache["_N"].stats.requests
    held = {s.name: s.id_of.clone() for s in loader.cache["_N"].stores}
    assert all((s.id_of >= 0).any() for s in loader.cache["_N"].stores)
    view = FrozenView(loader.cache["_N"])
    ids = torch.randperm(TINY.num_nodes)[:3000]
    assert torch.equal(view.read(ids), memory.features[ids])
    got = layerwise_inference(model, disk.graph, view, batch_size=1000)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert view.stats.hits["host"] > 0 and view.stats.hits["source"] > 0
    assert loader.cache["_N"].stats.requests == requests
    for store in loader.cache["_N"].stores:
        assert torch.equal(store.id_of, held[store.name])
    loader.close()


def test_sampled_evaluation_runs_on_disk(data_root, tmp_path):
    config = TrainConfig(dataset="synth-tiny", root=str(data_root),
                         fanouts=[5, 5], epochs=1, hidden=16,
                         features_on="disk", cache="hmgraph",
                         eval="sampled", out=str(tmp_path / "run"),
                         progress=False)
    result = train(config)
    assert result["eval"] == "sampled"
    epoch = result["runs"][0]["epochs"][0]
    assert 0.0 < epoch["valid"] <= 1.0 and 0.0 < epoch["test"] <= 1.0
    assert epoch["train"] == epoch["train_running"]


def test_rss_stays_bounded_over_a_file_larger_than_the_budget(tmp_path):
    """Three epochs over a 410 MB feature file with a 4 MB host tier read
    more than the file, yet the process grows by far less than the file
    at its peak (batches in flight, allocator slack), and what it holds
    once freed memory is trimmed does not grow from epoch to epoch: rows
    stream through, nothing accumulates."""
    result = _run_python(f"""
        import ctypes, json
        import dgl, numpy as np, psutil, torch
        from hmgraph.cache.format import FeatureFileWriter
        from hmgraph.loader import DataLoader
        n, d = 100_000, 1024
        path = {str(tmp_path / "feat.bin")!r}
        rng = np.random.default_rng(0)
        block = rng.standard_normal((4096, d), dtype=np.float32)
        with FeatureFileWriter(path, (n, d), "float32") as out:
            for start in range(0, n, 4096):
                out.write(block[:min(4096, n - start)] + np.float32(start))
        del block
        dgl.seed(0)
        graph = dgl.rand_graph(n, 10 * n)
        loader = DataLoader(graph, torch.arange(0, n, 20),
                            dgl.dataloading.NeighborSampler([4, 4]),
                            features=path, batch_size=64, shuffle=True,
                            cache="hmgraph", host_budget_bytes=4_000_000,
                            prefetch=0)  # threads' arenas add noise
        process = psutil.Process()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        before = process.memory_info().rss
        peak, live = before, []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                peak = max(peak, process.memory_info().rss)
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            live.append(process.memory_info().rss - before)
        print(json.dumps({{"peak": peak - before, "live": live,
                          "file": n * d * 4,
                          "read": loader.stats.storage.bytes_read}}))
    """)
    assert result["read"] > result["file"]
    assert result["peak"] < result["file"] // 3, result
    # Held memory does not grow with the bytes streamed: the third epoch
    # ends where the first did (within allocator noise).
    first, _, third = result["live"]
    assert third - first < result["file"] // 16, result


# -- budgets ---------------------------------------------------------------

def test_auto_host_budget_fits_what_is_free():
    gib = 1 << 30
    assert auto_host_budget(10 * gib, 3 * gib, 2 * gib,
                            available=20 * gib) == 10 * gib
    assert auto_host_budget(30 * gib, 3 * gib, 2 * gib,
                            available=20 * gib) == 15 * gib
    assert auto_host_budget(30 * gib, 19 * gib, 2 * gib,
                            available=20 * gib) == 0


def test_an_auto_host_budget_that_holds_the_file_reads_it_once(data_root):
    """Features on disk with room for all of them: construction reads
    the file once, in large requests, and the epoch reads nothing more
    (no row is staged or evicted, every row is a host hit)."""
    import dgl

    from hmgraph.train import make_loader

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    config = TrainConfig(dataset="synth-tiny", root=str(data_root),
                         fanouts=[5, 5], batch_size=64, features_on="disk",
                         cache="hmgraph", progress=False)
    loader, memory = make_loader(
        config, data, dgl.dataloading.NeighborSampler([5, 5]), "cpu")
    plan, storage = loader.plan["_N"], loader.stats.storage
    assert memory["host_budget_bytes"] > data.feature_bytes
    # Every row held, none dynamic: the plan is presample's.
    assert (plan.policy, plan.host_rows, plan.staging_rows) == (
        "presample", data.num_nodes, 0)
    built = storage.bytes_read
    assert data.feature_bytes <= built < 1.01 * data.feature_bytes
    for _ in loader:
        pass
    loader.close()
    stats = loader.stats.cache
    assert storage.bytes_read == built
    assert stats.hits["host"] == stats.rows_requested > 0
    assert sum(stats.evicted.values()) == 0


def test_host_budget_that_does_not_fit_is_refused(data_root, tmp_path):
    config = TrainConfig(dataset="synth-tiny", root=str(data_root),
                         fanouts=[5, 5], epochs=1, features_on="disk",
                         cache="hmgraph", host_budget="100TB",
                         out=str(tmp_path / "run"), progress=False)
    with pytest.raises(ValueError, match=r"host budget 100\.0 TB plus the "
                       r"run's working set .* exceeds the .* available"):
        train(config)


# -- OGB datasets larger than memory ---------------------------------------

def _fake_papers100m(root, num_nodes=3000, num_edges=20000):
    """A small dataset in ogbn-papers100M's raw layout (binary npz)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    edge_index = rng.integers(0, num_nodes, (2, num_edges))
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    feat = rng.standard_normal((num_nodes, 128), dtype=np.float32)
    np.savez_compressed(folder / "raw" / "data.npz", edge_index=edge_index,
                        node_feat=feat, node_year=np.zeros((num_nodes, 1)),
                        num_nodes_list=np.array([num_nodes]),
                        num_edges_list=np.array([edge_index.shape[1]]))
    label = rng.integers(0, 172, num_nodes).astype(np.float64)
    label[rng.random(num_nodes) < 0.5] = np.nan  # unlabelled papers
    np.savez_compressed(folder / "raw" / "node-label.npz",
                        node_label=label.reshape(-1, 1))
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    ids = rng.permutation(np.flatnonzero(~np.isnan(label)))
    for part, chunk in zip(("train", "valid", "test"),
                           np.array_split(ids, [len(ids) // 2,
                                                3 * len(ids) // 4]),
                           strict=True):
        pd.DataFrame(np.sort(chunk)).to_csv(split / f"{part}.csv.gz",
                                            header=False, index=False,
                                            compression="gzip")
    return edge_index, feat, label


def test_papers100m_is_streamed_from_ogb_raw_files(tmp_path, monkeypatch):
    """ogbn-papers100M's raw files become the feature file chunk by chunk
    (chunks far smaller than the matrix here), the graph is bidirected,
    labels and split are OGB's, and a second load reuses both."""
    from hmgraph.datasets import ogb_stream

    edge_index, feat, label = _fake_papers100m(tmp_path)
    monkeypatch.setattr(ogb_stream, "_CHUNK_BYTES", 128 * 4 * 100)
    chunks = list(ogb_stream.npz_member(
        tmp_path / "ogbn_papers100M" / "raw" / "data.npz",
        "node_feat").chunks(128 * 4 * 100))
    assert len(chunks) == 30
    data = datasets.load("ogbn-papers100M", tmp_path, features_on="disk")
    assert "feat" not in data.graph.ndata
    np.testing.assert_array_equal(np.asarray(data.features), feat)
    src, dst = data.graph.edges()
    got = set(zip(src.tolist(), dst.tolist(), strict=True))
    want = {*zip(*edge_index.tolist(), strict=True),
            *zip(*edge_index[::-1].tolist(), strict=True)}
    assert got == want
    known = ~np.isnan(label)
    np.testing.assert_array_equal(data.labels.numpy()[known],
                                  label[known].astype(np.int64))
    assert (data.labels.numpy()[~known] == -1).all()
    assert data.evaluator.eval_metric == "acc"
    cache = data.feature_path.parent
    assert (cache / "graph.dgl").is_file()
    stamp = data.feature_path.stat().st_mtime_ns
    again = datasets.load("ogbn-papers100M", tmp_path)
    assert data.feature_path.stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(again.features.numpy(), feat)
    assert again.graph.num_edges() == data.graph.num_edges()


def test_papers100m_feature_file_follows_its_raw_files(tmp_path):
    """Raw files replaced in place (same shape, other rows): the feature
    file and the cached graph are made again from them; deleted, the
    feature file is made again."""
    _fake_papers100m(tmp_path)
    data = datasets.load("ogbn-papers100M", tmp_path, features_on="disk")
    npz = tmp_path / "ogbn_papers100M" / "raw" / "data.npz"
    with np.load(npz) as arrays:
        contents = dict(arrays)
    contents["node_feat"] = contents["node_feat"][::-1] * 2
    contents["edge_index"] = contents["edge_index"][:, :1000]
    contents["num_edges_list"] = np.array([1000])
    np.savez_compressed(npz, **contents)
    again = datasets.load("ogbn-papers100M", tmp_path, features_on="disk")
    assert again.feature_path == data.feature_path
    np.testing.assert_array_equal(np.asarray(again.features),
                                  contents["node_feat"])
    assert again.graph.num_edges() <= 2000 < data.graph.num_edges()
    again.feature_path.unlink()
    third = datasets.load("ogbn-papers100M", tmp_path, features_on="disk")
    np.testing.assert_array_equal(np.asarray(third.features),
                                  contents["node_feat"])


def test_papers100m_missing_raw_files_are_named(tmp_path):
    with pytest.raises(datasets.DatasetError,
                       match=r"expected .*ogbn_papers100M/raw/data\.npz"):
        datasets.load("ogbn-papers100M", tmp_path, features_on="disk")


def test_build_folders_of_killed_runs_are_removed(data_root):
    """Even when the dataset is complete, a killed build's folder goes."""
    from hmgraph.datasets.synthetic import folder_name, make_synthetic

    stale = data_root / f".{folder_name('synth-tiny')}-99999999-x1"
    (stale / "build").mkdir(parents=True)
    make_synthetic("synth-tiny", data_root)
    assert not stale.exists()


def test_auto_evaluation_prices_layerwise_reads_with_the_disk_model(
        data_root, monkeypatch):
    """``eval="auto"`` keeps layer-wise inference while the disk model, at
    the storage tier's depth, prices its reads (every chunk reading every
    uncached byte) under the limit."""
    import dgl

    from hmgraph import evaluation
    from hmgraph import train as training
    from hmgraph.cache.disk import disk_model

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    config = TrainConfig(dataset="synth-tiny", root=str(data_root),
                         fanouts=[5, 5], features_on="disk",
                         cache="hmgraph", host_budget="10%", eval="auto",
                         progress=False)
    sampler = dgl.dataloading.NeighborSampler(config.fanouts)
    loader, _ = training.make_loader(config, data, sampler, "cpu")
    try:
        model = disk_model(data.feature_path)
        held = loader.plan["_N"].device_rows + loader.plan["_N"].host_rows
        row_bytes = data.manifest.row_bytes
        uncached = (data.num_nodes - held) * row_bytes
        chunks = -(-data.num_nodes // config.eval_batch_size)
        seconds = training.layerwise_read_seconds(config, data, loader)
        assert seconds == pytest.approx(chunks * model.seconds(
            uncached / max(model.gap_bytes, row_bytes), uncached))
        assert seconds > 0
        assert training.resolve_eval(config, data, loader) == "layerwise"
        # resolve_eval reads the limit where it lives (hmgraph.evaluation).
        monkeypatch.setattr(evaluation, "LAYERWISE_READ_LIMIT_SECONDS",
                            seconds / 2)
        assert training.resolve_eval(config, data, loader) == "sampled"
    finally:
        loader.close()


@pytest.mark.parametrize("window", [0, 4, 16, 64])
def test_rows_are_bit_exact_at_every_window(data_root, window):
    """The hmgraph cache over the O_DIRECT tier, looking 0 to 64 batches
    ahead (staging, rows brought along, the dynamic part refilled from
    the window): every batch's rows are the feature file's."""
    import dgl

    from hmgraph.loader import DataLoader

    memory = datasets.load("synth-tiny", data_root)
    disk = datasets.load("synth-tiny", data_root, features_on="disk")
    feature_bytes = disk.feature_bytes
    loader = DataLoader(
        disk.graph, disk.split["train"][:600],
        dgl.dataloading.NeighborSampler([5, 5]), batch_size=64,
        shuffle=True, features=disk.feature_path, cache="hmgraph",
        device_budget_bytes=feature_bytes // 20,
        host_budget_bytes=feature_bytes // 5, window=window, seed=0,
        prefetch=1)
    try:
        batches = 0
        for batch in loader:
            expected = memory.features[batch.input_nodes]
            assert batch.x.numpy().tobytes() == expected.numpy().tobytes()
            batches += 1
        assert batches == 10
        assert loader.stats.storage.rows_read > 0
    finally:
        loader.close()


def test_layerwise_hidden_layers_go_to_the_run_folder_when_they_do_not_fit(
        data_root, tmp_path, monkeypatch):
    """Features on disk and two layers' outputs over free memory: the
    hidden layers are written to the run's folder and read back (nothing
    left there after), and the working set holds the logits, not the two
    layers."""
    from hmgraph import evaluation, memory
    from hmgraph.models import inference

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    results, scratches = [], []
    layerwise = inference.layerwise_inference

    def spy(*args, scratch=None, **kwargs):
        scratches.append(scratch)
        return layerwise(*args, scratch=scratch, **kwargs)

    monkeypatch.setattr(evaluation, "layerwise_inference", spy)
    for fits in (True, False):
        config = TrainConfig(dataset="synth-tiny", root=str(data_root),
                             fanouts=[5, 5], epochs=1, hidden=16, seed=0,
                             features_on="disk", cache="hmgraph",
                             host_budget="10%", eval="layerwise",
                             out=str(tmp_path / str(fits)), progress=False)
        need = memory.layerwise_buffer_bytes(config, data) + \
            memory.HOST_RESERVE_BYTES
        monkeypatch.setattr(memory, "available_bytes",
                            lambda _, free=need - (not fits): free)
        assert memory.layerwise_on_disk(config, data) is not fits
        results.append((train(config, data), memory.working_set_bytes(
            config, data, None, 0, "cpu", batch_bytes=0)))
        assert not list((tmp_path / str(fits)).glob("hmgraph-layers-*"))
    assert scratches == [None, tmp_path / "False"]
    (held_run, held), (on_disk_run, on_disk) = results
    assert held - on_disk == memory.layerwise_buffer_bytes(config, data) \
        - data.num_nodes * data.num_classes * 4
    # (the logits equal those held in memory: tests/test_models.py)
    for run in (held_run, on_disk_run):
        assert 0.0 <= run["summary"]["test_mean"] <= 1.0

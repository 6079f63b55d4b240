"""`hmgraph.DataLoader` keeps DGL's mini-batch contract."""

from __future__ import annotations

import gc
import weakref

import dgl
import numpy as np
import pytest
import torch

from hmgraph import DataLoader
from hmgraph.cache.format import open_feature_file

SAMPLERS = {
    "neighbor": lambda: dgl.dataloading.NeighborSampler([5, 3]),
    "full": lambda: dgl.dataloading.MultiLayerFullNeighborSampler(2),
    "labor": lambda: dgl.dataloading.LaborSampler([4, 4]),
}


@pytest.mark.parametrize("make_sampler", SAMPLERS.values(),
                         ids=SAMPLERS.keys())
def test_batches_follow_dgl_contract(tiny, make_sampler):
    seeds = tiny.split["valid"]
    loader = DataLoader(tiny.graph, seeds, make_sampler(), batch_size=128,
                        shuffle=True, seed=3)
    seen = []
    for input_nodes, output_nodes, blocks in loader:
        assert len(blocks) == 2
        assert torch.equal(blocks[-1].dstdata[dgl.NID], output_nodes)
        assert torch.equal(blocks[0].srcdata[dgl.NID], input_nodes)
        # Output nodes come first among the inputs, as DGL promises.
        n = output_nodes.numel()
        assert torch.equal(input_nodes[:n], output_nodes)
        assert torch.equal(blocks[0].srcdata["feat"],
                           tiny.features[input_nodes])
        assert torch.equal(blocks[-1].dstdata["label"],
                           tiny.labels[output_nodes])
        seen.append(output_nodes)
    seen = torch.cat(seen)
    assert len(seen) == seeds.numel()
    assert torch.equal(seen.sort().values, seeds.sort().values)
    assert loader.stats.batches == len(loader) == 4
    assert loader.stats.rows_requested > seeds.numel()


def test_rows_equal_the_feature_file(tiny):
    """Reading rows from the memmapped feature file gives the same batch."""
    _, rows = open_feature_file(tiny.feature_path)
    sampler = dgl.dataloading.NeighborSampler([5, 3])
    from_file = DataLoader(tiny.graph, tiny.split["train"], sampler,
                           batch_size=300, features=rows)
    for batch in from_file:
        assert torch.equal(batch.x, tiny.features[batch.input_nodes])
        assert torch.equal(batch.x, torch.from_numpy(
            np.asarray(rows[batch.input_nodes.numpy()])))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_stages_count_their_threads_cpu_seconds(tiny, prefetch):
    """CPU seconds per stage: the sampling and fetching threads' in their
    stage (never more than the stage's wall seconds) and the storage
    tier's threads', for rows read from the file; zeroed by reset."""
    loader = DataLoader(tiny.graph, tiny.split["train"],
                        dgl.dataloading.NeighborSampler([5, 3]),
                        batch_size=250, features=tiny.feature_path,
                        prefetch=prefetch, seed=0)
    try:
        for _ in loader:
            pass
        stats = loader.stats
        for stage in ("sample", "fetch"):
            assert 0.0 < stats.cpu_seconds[stage] \
                <= stats.seconds[stage] + 0.01
        assert stats.storage.cpu_seconds > 0.0
        assert stats.as_dict()["cpu_seconds"] == stats.cpu_seconds
        stats.reset()
        assert stats.cpu_seconds == {"sample": 0.0, "fetch": 0.0}
        assert stats.storage.cpu_seconds == 0.0
    finally:
        loader.close()


def test_shuffle_is_seeded_per_epoch(tiny):
    sampler = dgl.dataloading.NeighborSampler([2])
    loader = DataLoader(tiny.graph, tiny.split["train"], sampler,
                        batch_size=100, shuffle=True, seed=7)

    def order():
        return torch.cat([b.output_nodes for b in loader])

    loader.set_epoch(0)
    first = order()
    second = order()  # the next pass is epoch 1, with no call needed
    assert not torch.equal(first, second)
    loader.set_epoch(0)
    assert torch.equal(first, order())
    assert torch.equal(second, order())
    again = DataLoader(tiny.graph, tiny.split["train"], sampler,
                       batch_size=100, shuffle=True, seed=7)
    assert torch.equal(first, torch.cat([b.output_nodes for b in again]))


@pytest.mark.parametrize("drop_last,expected", [(False, 4), (True, 3)],
                         ids=["keep-last", "drop-last"])
def test_len_and_drop_last(tiny, drop_last, expected):
    seeds = tiny.split["train"][:350]
    loader = DataLoader(tiny.graph, seeds,
                        dgl.dataloading.NeighborSampler([2]),
                        batch_size=100, drop_last=drop_last)
    sizes = [b.output_nodes.numel() for b in loader]
    assert len(loader) == len(sizes) == expected
    assert sizes[-1] == (100 if drop_last else 50)


BAD = {
    "id-too-large": (dict(indices=torch.tensor([0, 10_000])),
                     ValueError, "node id 10000 out of range: the graph "
                     "has 10000 nodes"),
    "negative-id": (dict(indices=torch.tensor([-3, 1])),
                    ValueError, "node id -3 out of range"),
    "float-ids": (dict(indices=torch.tensor([0.5])),
                  TypeError, "indices must be integer ids, got torch.float32"),
    "zero-batch": (dict(batch_size=0), ValueError, "batch_size must be"),
    "fractional-batch": (dict(batch_size=2.5), ValueError,
                         "batch_size must be an integer >= 1, got 2.5"),
    "2-d-ids": (dict(indices=torch.zeros(3, 2, dtype=torch.int64)),
                ValueError, r"indices must be 1-D, got shape \(3, 2\)"),
    "short-features": (dict(features=torch.zeros(5, 3)), ValueError,
                       "features have 5 rows, but the graph has 10000"),
}


@pytest.mark.parametrize("kwargs,error,match", BAD.values(), ids=BAD.keys())
def test_bad_arguments(tiny, kwargs, error, match):
    args = dict(indices=tiny.split["train"], batch_size=10)
    args.update(kwargs)
    indices = args.pop("indices")
    with pytest.raises(error, match=match):
        DataLoader(tiny.graph, indices,
                   dgl.dataloading.NeighborSampler([2]), **args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_cuda(tiny):
    loader = DataLoader(tiny.graph, tiny.split["valid"],
                        dgl.dataloading.NeighborSampler([5, 3]),
                        batch_size=128, device="cuda")
    for batch in loader:
        assert batch.x.is_cuda and batch.y.is_cuda
        assert torch.equal(batch.x.cpu(), tiny.features[batch.input_nodes])


@pytest.mark.parametrize("cache", [None, "hmgraph"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_dropped_batch_is_freed_without_the_collector(tiny, prefetch,
                                                        cache):
    # A batch in a reference cycle waits for the garbage collector; with
    # synth-igb's 1.2 GB of rows per batch that held 10 GB more.
    loader = DataLoader(
        tiny.graph, tiny.split["train"][:512], SAMPLERS["neighbor"](),
        batch_size=128, features=tiny.feature_path, cache=cache,
        device_budget_bytes=4096 if cache else 0, prefetch=prefetch)
    gc.collect()
    gc.disable()
    try:
        last = []
        for batch in loader:  # the last batch is gone once the next comes
            assert all(ref() is None for ref in last)
            last = [weakref.ref(batch.x), weakref.ref(batch.blocks[0])]
            assert torch.equal(batch.x, tiny.features[batch.input_nodes])
        assert len(last) == 2
    finally:
        gc.enable()
        loader.close()


def test_each_finished_epoch_hands_freed_memory_back(tiny, monkeypatch):
    import hmgraph.pipeline

    calls = []
    monkeypatch.setattr(hmgraph.pipeline, "release_freed_memory",
                        lambda: calls.append(1) or True)
    loader = DataLoader(tiny.graph, tiny.split["train"][:300],
                        SAMPLERS["neighbor"](), batch_size=128, prefetch=2)
    for epoch in range(2):
        for _ in loader:
            pass
        assert len(calls) == epoch + 1
    for _ in loader:  # left early: handed back too
        break
    loader.close()
    assert len(calls) == 3
    monkeypatch.undo()
    assert isinstance(hmgraph.pipeline.release_freed_memory(), bool)


@pytest.mark.parametrize("cache", [None, "hmgraph"])
def test_an_epoch_left_early_keeps_no_batch_buffers(tiny, cache):
    """``break`` (or an iterator dropped after one ``next``, as a step
    timed alone takes one batch) lets go of the buffers kept for the
    epoch's batches; the batch taken stays whole."""
    rows = tiny.features if cache is None else tiny.feature_path
    loader = DataLoader(tiny.graph, tiny.split["train"][:512],
                        SAMPLERS["neighbor"](), batch_size=64,
                        features=rows, cache=cache, prefetch=1,
                        device_budget_bytes=4096 if cache else 0)
    feature = loader.cache["_N"] if cache else loader.feature["_N"]
    pool = feature._compiled.pool if cache else feature._pool
    for _ in loader:
        assert pool.nbytes > 0
        break
    assert pool.nbytes == 0
    batch = next(iter(loader))
    assert pool.nbytes == 0
    assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    loader.close()


@pytest.mark.parametrize("parts", [1, 2])
def test_a_batchs_lookahead_ids_are_its_sorted_unique_inputs(parts):
    """`SampledBatch.unique_inputs` (the cache's lookahead window): the
    sorted unique ids of the batch's reads, per node type, by the
    compiled radix sort where one read has them."""
    from hmgraph.dglbatch import Lazy
    from hmgraph.stages.batches import SampledBatch

    generator = torch.Generator().manual_seed(parts)
    ids = torch.randperm(3_000_000, generator=generator)[:5000]
    reads = [Lazy(0, "node", 0, "feat", "feat", "_N", chunk)
             for chunk in ids.chunk(parts)]
    if parts == 2:  # a repeat across reads is read once
        reads.append(Lazy(0, "node", 1, "feat", "feat", "_N", ids[:10]))
    batch = SampledBatch(0, None, reads, [], 0.0)
    (unique,) = batch.unique_inputs.values()
    assert torch.equal(unique, torch.unique(ids))
    none = Lazy(0, "node", 0, "feat", "feat", "_N",
                torch.zeros(0, dtype=torch.int64))
    empty = SampledBatch(0, None, [none], [], 0.0)
    assert empty.unique_inputs["_N"].numel() == 0

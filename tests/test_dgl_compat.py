"""`hmgraph.DataLoader` against `dgl.dataloading.DataLoader` 2.1.

Every keyword DGL's loader takes is accepted with DGL's meaning or refused
with one line; the batches (seeds, order, sampled graphs) are DGL's own
under the same seeds; every sampler's lazy features arrive resolved, with
rows bit-identical to the graph's in every cache mode.
"""

from __future__ import annotations

import contextlib
import os
import time

import dgl
import numpy as np
import psutil
import pytest
import torch
import torch.multiprocessing as mp
from dgl.dataloading import (
    ClusterGCNSampler,
    MultiLayerFullNeighborSampler,
    NeighborSampler,
    SAINTSampler,
    ShaDowKHopSampler,
    as_edge_prediction_sampler,
    negative_sampler,
)

import hmgraph


@pytest.fixture(scope="module")
def graph():
    """A small random graph with node, label and edge features."""
    generator = torch.Generator().manual_seed(0)
    g = dgl.rand_graph(400, 4000)
    g.ndata["feat"] = torch.randn(400, 8, generator=generator)
    g.ndata["h"] = torch.randn(400, 3, generator=generator)
    g.ndata["label"] = torch.randint(0, 5, (400,), generator=generator)
    g.edata["w"] = torch.randn(4000, 2, generator=generator)
    return g


@contextlib.contextmanager
def one_dgl_thread():
    """DGL samples with one generator per OpenMP thread: use one."""
    old = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        yield
    finally:
        dgl.utils.set_num_threads(old)


def epochs(loader, count=2, part=1):
    """``part`` of every batch of ``count`` passes."""
    return [batch[part] for _ in range(count) for batch in loader]


def check_rows(graph, batch, name="feat"):
    """The cached feature's rows equal the graph's, in the block and x."""
    input_nodes, blocks = batch[0], batch[-1]
    expected = graph.ndata[name][input_nodes.long()]
    assert torch.equal(blocks[0].srcdata[name], expected)
    assert torch.equal(batch.x, expected)


# -- same batches as DGL ----------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_batches_as_dgl(graph, shuffle, drop_last, num_workers):
    seeds = torch.arange(0, 400, 3)
    sampler = NeighborSampler([4, 4])
    kwargs = dict(batch_size=32, shuffle=shuffle, drop_last=drop_last,
                  num_workers=num_workers)
    np.random.seed(11)
    theirs = dgl.dataloading.DataLoader(graph, seeds, sampler, **kwargs)
    expected = epochs(theirs)
    np.random.seed(11)
    ours = hmgraph.DataLoader(graph, seeds, sampler, **kwargs)
    got = epochs(ours)
    assert len(ours) == len(theirs)
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_same_sampled_blocks_as_dgl_and_no_reseeding(graph):
    """Under the same seeds both loaders draw the same neighbours: hmgraph
    neither reseeds DGL's generator nor draws from it differently."""
    sampler = NeighborSampler([3, 3])
    runs = []
    for cls in (dgl.dataloading.DataLoader, hmgraph.DataLoader):
        with one_dgl_thread():
            np.random.seed(2)
            torch.manual_seed(2)
            dgl.seed(2)
            loader = cls(graph, torch.arange(100), sampler, batch_size=25,
                         shuffle=True)
            inputs = epochs(loader, part=0)
            runs.append((inputs, torch.rand(3)))  # torch's stream, too
    (dgl_inputs, dgl_after), (our_inputs, our_after) = runs
    assert all(torch.equal(a, b) for a, b in zip(dgl_inputs, our_inputs,
                                                 strict=True))
    assert torch.equal(dgl_after, our_after)


def test_reshuffles_every_epoch_and_follows_numpy_seed(graph):
    """DGL 2.1 shuffles with NumPy's global generator (np.random.shuffle
    in TensorizedDataset.shuffle), a new order every pass."""
    loader = hmgraph.DataLoader(graph, torch.arange(200), NeighborSampler(
        [2]), batch_size=50, shuffle=True)
    np.random.seed(4)
    first, second = (torch.cat(epochs(loader, 1)) for _ in range(2))
    assert not torch.equal(first, second)
    assert torch.equal(first.sort().values, torch.arange(200))
    fresh = hmgraph.DataLoader(graph, torch.arange(200), NeighborSampler(
        [2]), batch_size=50, shuffle=True)
    np.random.seed(4)
    assert torch.equal(first, torch.cat(epochs(fresh, 1)))


def test_generator_draws_the_order(graph):
    def order(seed):
        loader = hmgraph.DataLoader(
            graph, torch.arange(200), NeighborSampler([2]), batch_size=50,
            shuffle=True, generator=torch.Generator().manual_seed(seed))
        return [torch.cat(epochs(loader, 1)) for _ in range(2)]

    state = np.random.get_state()[1].copy()
    a, b, c = order(1), order(1), order(2)
    assert np.array_equal(state, np.random.get_state()[1])  # untouched
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], c[0])


def test_seed_and_set_epoch_repeat_an_epoch(graph):
    def loader():
        return hmgraph.DataLoader(graph, torch.arange(200), NeighborSampler(
            [2]), batch_size=50, shuffle=True, seed=9)

    first = loader()
    orders = [torch.cat(epochs(first, 1)) for _ in range(3)]
    assert not torch.equal(orders[0], orders[1])
    second = loader()
    second.set_epoch(2)
    assert torch.equal(torch.cat(epochs(second, 1)), orders[2])


# -- keywords -----------------------------------------------------------------

def _record_worker(worker_id):
    folder = os.environ["HMGRAPH_TEST_WORKERS"]
    open(os.path.join(folder, f"worker-{worker_id}"), "w").close()


ACCEPTED = {
    "device-none": dict(device=None),
    "device-cpu": dict(device="cpu"),
    "num-workers": dict(num_workers=2),
    "persistent-workers": dict(num_workers=1, persistent_workers=True),
    "prefetch-factor": dict(num_workers=1, prefetch_factor=4),
    "timeout": dict(num_workers=1, timeout=60),
    "generator": dict(generator=torch.Generator().manual_seed(0)),
    "ddp-seed": dict(ddp_seed=5),
    "use-ddp-false": dict(use_ddp=False),
    "prefetch-thread": dict(use_prefetch_thread=True),
    "no-prefetch-thread": dict(use_prefetch_thread=False),
    "no-alternate-streams": dict(use_alternate_streams=False),
    "no-pin-prefetcher": dict(pin_prefetcher=False),
    "use-uva-false": dict(use_uva=False),
    "gpu-cache-none": dict(gpu_cache=None),
    "multiprocessing-context": dict(num_workers=1,
                                    multiprocessing_context="fork"),
}


@pytest.mark.parametrize("kwargs", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_dgl_keyword_accepted(graph, kwargs):
    sampler = NeighborSampler([3, 3], prefetch_node_feats=["feat"],
                              prefetch_labels=["label"])
    seeds = torch.arange(0, 400, 2)
    loader = hmgraph.DataLoader(graph, seeds, sampler, batch_size=40,
                                shuffle=True, **kwargs)
    # DGL refuses a prefetch thread on the CPU; hmgraph fetches in it.
    theirs = dgl.dataloading.DataLoader(
        graph, seeds, sampler, batch_size=40, shuffle=True,
        **{k: v for k, v in kwargs.items() if k != "use_prefetch_thread"})
    assert len(loader) == len(theirs) == 5
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == 5
        assert torch.equal(torch.cat([b[1] for b in batches]).sort().values,
                           seeds)
        for batch in batches:
            check_rows(graph, batch)
            assert torch.equal(batch[2][-1].dstdata["label"],
                               graph.ndata["label"][batch[1]])


def test_positional_arguments_as_dgl(graph):
    seeds = torch.arange(100)
    args = (graph, seeds, NeighborSampler([2]), "cpu", False, 0, 30, True)
    ours, theirs = hmgraph.DataLoader(*args), dgl.dataloading.DataLoader(*args)
    assert ours.device == theirs.device == torch.device("cpu")
    assert len(ours) == len(theirs) == 3  # batch_size 30, drop_last


def test_worker_init_fn_runs_in_each_worker(graph, tmp_path, monkeypatch):
    monkeypatch.setenv("HMGRAPH_TEST_WORKERS", str(tmp_path))
    loader = hmgraph.DataLoader(graph, torch.arange(100), NeighborSampler(
        [2]), batch_size=10, num_workers=2, worker_init_fn=_record_worker)
    assert len(list(loader)) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "worker-0", "worker-1"]


class _SlowSampler(NeighborSampler):
    def sample(self, g, seeds, exclude_eids=None):
        time.sleep(1.0)
        return super().sample(g, seeds, exclude_eids)


def test_timeout_bounds_waiting_on_the_loader_threads(graph):
    loader = hmgraph.DataLoader(graph, torch.arange(20), _SlowSampler([2]),
                                batch_size=10, prefetch=1, timeout=0.2)
    with pytest.raises(RuntimeError, match=r"gave no batch in 0.2 s"):
        list(loader)


REFUSED = {
    "use-uva": (dict(use_uva=True), ValueError, "use_uva=True needs CUDA"),
    "pin-prefetcher": (dict(pin_prefetcher=True), ValueError,
                       "pin_prefetcher=True needs a CUDA device"),
    "alternate-streams": (dict(use_alternate_streams=True), ValueError,
                          "use_alternate_streams=True needs a CUDA"),
    "gpu-cache": (dict(gpu_cache={"node": {"feat": 10}}), ValueError,
                  "gpu_cache needs a CUDA device"),
    "ddp-without-dist": (dict(use_ddp=True), RuntimeError,
                         "use_ddp=True needs torch.distributed"),
    "prefetch-factor-no-workers": (dict(prefetch_factor=2), ValueError,
                                   "prefetch_factor"),
    "persistent-no-workers": (dict(persistent_workers=True), ValueError,
                              "persistent_workers"),
    "collate-fn": (dict(collate_fn=list), TypeError, "'collate_fn'"),
    "unknown": (dict(fanout=3), TypeError, "fanout"),
    "edge-id-range": (dict(indices=torch.tensor([0, 10**6])), ValueError,
                      "node id 1000000 out of range: the graph has 400 "
                      "nodes"),
}


@pytest.mark.parametrize("kwargs,error,match", REFUSED.values(),
                         ids=REFUSED.keys())
def test_dgl_keyword_refused_in_one_line(graph, kwargs, error, match):
    kwargs = dict(kwargs)
    indices = kwargs.pop("indices", torch.arange(10))
    with pytest.raises(error, match=match) as info:
        hmgraph.DataLoader(graph, indices, NeighborSampler([2]),
                           batch_size=5, **kwargs)
    assert "\n" not in str(info.value)


def _ddp_rank(rank, world, store, drop_last, out):
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    seeds = torch.arange(1000, 1103)  # 103 seeds: ranks need padding
    sampler = NeighborSampler([2])
    results = {}
    for name, cls in (("dgl", dgl.dataloading.DataLoader),
                      ("hmgraph", hmgraph.DataLoader)):
        np.random.seed(rank)
        loader = cls(dgl.rand_graph(1200, 100), seeds, sampler,
                     batch_size=10, shuffle=True, use_ddp=True,
                     drop_last=drop_last)
        results[name] = [torch.cat([b[1] for b in loader])
                         for _ in range(2)]
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("drop_last", [False, True])
def test_use_ddp_splits_seeds_across_ranks_as_dgl(tmp_path, drop_last):
    world = 2
    mp.spawn(_ddp_rank, args=(world, tmp_path / "store", drop_last,
                              str(tmp_path)), nprocs=world)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
             for r in range(world)]
    for result in ranks:  # each rank: DGL's batches, reshuffled per epoch
        for ours, theirs in zip(result["hmgraph"], result["dgl"],
                                strict=True):
            assert torch.equal(ours, theirs)
        assert not torch.equal(*result["hmgraph"])
    shares = [set(r["hmgraph"][0].tolist()) for r in ranks]
    assert not shares[0] & shares[1]
    union = shares[0] | shares[1]
    if drop_last:  # 51 seeds each, the last cut to 50
        assert len(union) == 100
    else:  # 52 each, padding repeats a rank's own seeds
        assert union == set(range(1000, 1103))
        assert all(r["hmgraph"][0].numel() == 52 for r in ranks)


@pytest.mark.skipif(len(psutil.Process().cpu_affinity()) < 2,
                    reason="needs two cores")
def test_enable_cpu_affinity(graph, capsys):
    before = psutil.Process().cpu_affinity()
    loader = hmgraph.DataLoader(graph, torch.arange(100), NeighborSampler(
        [2]), batch_size=10, num_workers=1)
    with loader.enable_cpu_affinity(loader_cores=[before[0]],
                                    compute_cores=[before[1]]):
        assert psutil.Process().cpu_affinity() == [before[1]]
        assert len(list(loader)) == 10
    assert psutil.Process().cpu_affinity() == before
    assert "1 DL workers are assigned to cpus" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs num_workers > 0"):
        with hmgraph.DataLoader(graph, torch.arange(10), NeighborSampler(
                [2])).enable_cpu_affinity():
            pass


# -- every sampler, every lazy feature ----------------------------------------

CACHES = {
    "no-cache": dict(),
    "lru": dict(cache="lru", device_budget_bytes=40 * 32,
                host_budget_bytes=80 * 32),
    "hmgraph": dict(cache="hmgraph", device_budget_bytes=40 * 32,
                    host_budget_bytes=80 * 32, prefetch=2),
}


@pytest.mark.parametrize("cache", CACHES.values(), ids=CACHES.keys())
def test_any_names_resolved_as_dgl(graph, cache):
    sampler = NeighborSampler([3, 3], prefetch_node_feats=["h", "feat"],
                              prefetch_labels=["label"],
                              prefetch_edge_feats=["w"])
    loader = hmgraph.DataLoader(graph, torch.arange(120), sampler,
                                batch_size=30, shuffle=True, **cache)
    for batch in loader:
        input_nodes, output_nodes, blocks = batch
        check_rows(graph, batch)
        assert torch.equal(blocks[0].srcdata["h"], graph.ndata["h"][
            input_nodes])
        assert torch.equal(blocks[-1].dstdata["label"], graph.ndata[
            "label"][output_nodes])
        for block in blocks:
            assert torch.equal(block.edata["w"], graph.edata["w"][
                block.edata[dgl.EID]])


def test_graph_without_feat(graph):
    bare = dgl.graph(graph.edges(), num_nodes=graph.num_nodes())
    bare.ndata["x"] = graph.ndata["h"]
    sampler = NeighborSampler([2], prefetch_node_feats=["x"])
    loader = hmgraph.DataLoader(bare, torch.arange(20), sampler,
                                batch_size=10)
    for batch in loader:
        assert batch.x is None
        assert torch.equal(batch[2][0].srcdata["x"], bare.ndata["x"][
            batch[0]])
    named = hmgraph.DataLoader(bare, torch.arange(20), sampler,
                               batch_size=10, feature_name="x", cache="lru",
                               host_budget_bytes=120)
    for batch in named:
        check_rows(bare, batch, "x")
    assert named.stats.cache.rows_requested > 0


@pytest.mark.parametrize("negatives", [0, 2])
@pytest.mark.parametrize("cache", CACHES.values(), ids=CACHES.keys())
def test_edge_prediction(graph, negatives, cache):
    sampler = as_edge_prediction_sampler(
        NeighborSampler([3, 3], prefetch_node_feats=["feat"]),
        negative_sampler=negative_sampler.Uniform(negatives)
        if negatives else None)
    seeds = torch.arange(0, 4000, 7)
    loader = hmgraph.DataLoader(graph, seeds, sampler, batch_size=64,
                                shuffle=True, **cache)
    assert len(loader) == len(dgl.dataloading.DataLoader(
        graph, seeds, sampler, batch_size=64))
    count = 0
    for batch in loader:
        assert len(batch) == (4 if negatives else 3)
        pair_graph = batch[1]
        check_rows(graph, batch)
        eids = pair_graph.edata[dgl.EID]
        src, dst = graph.find_edges(eids)
        ids = pair_graph.ndata[dgl.NID]
        local_src, local_dst = pair_graph.edges()
        assert torch.equal(ids[local_src], src)
        assert torch.equal(ids[local_dst], dst)
        count += eids.numel()
    assert count == seeds.numel()
    with pytest.raises(ValueError, match="edge id 4000 out of range: the "
                       "graph has 4000 edges"):
        hmgraph.DataLoader(graph, torch.tensor([4000]), sampler)


@pytest.fixture(scope="module")
def hetero():
    generator = torch.Generator().manual_seed(1)
    g = dgl.heterograph({
        ("user", "buys", "item"): (
            torch.randint(0, 60, (300,), generator=generator),
            torch.randint(0, 40, (300,), generator=generator)),
        ("item", "bought-by", "user"): (
            torch.randint(0, 40, (300,), generator=generator),
            torch.randint(0, 60, (300,), generator=generator)),
    })
    g.nodes["user"].data["feat"] = torch.randn(60, 4, generator=generator)
    g.nodes["item"].data["feat"] = torch.randn(40, 6, generator=generator)
    g.nodes["item"].data["label"] = torch.arange(40)
    return g


@pytest.mark.parametrize("cache", [None, "lru", "degree"])
def test_heterograph_dict_indices_cache_per_type(hetero, cache):
    sampler = NeighborSampler([3, 3], prefetch_labels={"item": ["label"]})
    seeds = {"item": torch.arange(40), "user": torch.arange(0, 60, 2)}
    loader = hmgraph.DataLoader(hetero, seeds, sampler, batch_size=16,
                                shuffle=True, cache=cache,
                                host_budget_bytes=2000)
    theirs = dgl.dataloading.DataLoader(hetero, seeds, sampler,
                                        batch_size=16)
    assert len(loader) == len(theirs)
    seen = {"item": [], "user": []}
    for input_nodes, output_nodes, blocks in loader:
        for ntype, ids in input_nodes.items():
            rows = hetero.nodes[ntype].data["feat"][ids]
            assert torch.equal(blocks[0].srcnodes[ntype].data["feat"], rows)
        for ntype, ids in output_nodes.items():
            seen[ntype].append(ids)
        if "item" in output_nodes:
            assert torch.equal(blocks[-1].dstnodes["item"].data["label"],
                               output_nodes["item"])
    for ntype, ids in seeds.items():
        assert torch.equal(torch.cat(seen[ntype]).sort().values, ids)
    assert set(loader.cache) == {"user", "item"}
    if cache is None:  # caching off: rows straight from the graph
        assert "cache" not in loader.stats.as_dict()
    else:
        assert set(loader.stats.as_dict()["cache"]) == {"user", "item"}
    if cache == "lru":
        assert loader.stats.hit_rate("host") > 0


def test_heterograph_profiled_cache_refused(hetero):
    with pytest.raises(ValueError, match="on heterographs use 'lru'"):
        hmgraph.DataLoader(hetero, {"item": torch.arange(4)},
                           NeighborSampler([2]), cache="hmgraph",
                           host_budget_bytes=1000)


@pytest.mark.parametrize("cache", CACHES.values(), ids=CACHES.keys())
def test_int32_graph(graph, cache):
    small = graph.int()
    loader = hmgraph.DataLoader(small, torch.arange(100), NeighborSampler(
        [3, 3]), batch_size=25, **cache)
    for batch in loader:
        assert batch[0].dtype == torch.int32
        check_rows(small, batch)


def test_subgraph_samplers(graph, tmp_path):
    cluster = ClusterGCNSampler(graph, 8, cache_path=str(tmp_path / "c.pkl"),
                                prefetch_ndata=["feat", "label"],
                                prefetch_edata=["w"])
    shadow = ShaDowKHopSampler([3, 3], prefetch_node_feats=["feat"])
    saint = SAINTSampler("node", 60, prefetch_ndata=["feat"])
    for sampler, indices, batch_size in ((cluster, torch.arange(8), 2),
                                         (shadow, torch.arange(40), 8),
                                         (saint, torch.arange(4), 1)):
        loader = hmgraph.DataLoader(graph, indices, sampler,
                                    batch_size=batch_size, shuffle=True,
                                    cache="lru", host_budget_bytes=100 * 32)
        batches = list(loader)
        assert len(batches) == len(loader) > 0
        for batch in batches:
            subgraph = batch[-1] if isinstance(batch, tuple) else batch
            ids = subgraph.ndata[dgl.NID]
            assert torch.equal(subgraph.ndata["feat"],
                               graph.ndata["feat"][ids])
            if sampler is cluster:
                assert torch.equal(subgraph.ndata["label"],
                                   graph.ndata["label"][ids])
                assert torch.equal(subgraph.edata["w"], graph.edata["w"][
                    subgraph.edata[dgl.EID]])
        assert loader.stats.cache.rows_requested > 0  # through the cache


def test_full_neighbour_inference_loader(graph):
    sampler = MultiLayerFullNeighborSampler(1, prefetch_node_feats=["feat"])
    loader = hmgraph.DataLoader(graph, torch.arange(graph.num_nodes()),
                                sampler, batch_size=100)
    outputs = torch.cat([b[1] for b in loader])
    assert torch.equal(outputs, torch.arange(400))


def test_attach_data(graph):
    from dgl.frame import LazyFeature

    class Tagged(NeighborSampler):
        def sample(self, g, seeds, exclude_eids=None):
            batch = super().sample(g, seeds, exclude_eids)
            return (*batch, LazyFeature("score", seeds))

    scores = torch.randn(400, 1)
    loader = hmgraph.DataLoader(graph, torch.arange(30), Tagged([2]),
                                batch_size=10)
    loader.attach_data("score", scores)
    for batch in loader:
        assert torch.equal(batch[3], scores[batch[1]])


@pytest.mark.parametrize("cache", ["lru", "hmgraph"])
def test_edge_prediction_from_the_storage_tier(tiny, cache):
    """Edge batches read the feature file through O_DIRECT and the cache:
    rows identical to the file, storage counters moving."""
    from hmgraph.cache.format import open_feature_file

    _, rows = open_feature_file(tiny.feature_path)
    sampler = as_edge_prediction_sampler(
        NeighborSampler([4, 4]), negative_sampler=negative_sampler.Uniform(1))
    row_bytes = rows[0].nbytes
    loader = hmgraph.DataLoader(
        tiny.graph, torch.arange(0, tiny.graph.num_edges(), 97), sampler,
        batch_size=128, shuffle=True, features=tiny.feature_path,
        cache=cache, device_budget_bytes=500 * row_bytes,
        host_budget_bytes=1500 * row_bytes, prefetch=2, seed=0)
    try:
        for batch in loader:
            expected = torch.from_numpy(np.asarray(rows[batch[0].numpy()]))
            assert torch.equal(batch.x, expected)
            assert torch.equal(batch[-1][0].srcdata["feat"], expected)
        assert loader.stats.storage.bytes_read > 0
        assert loader.stats.hit_rate("source") < 1.0
    finally:
        loader.close()

"""Cluster sampling, renumbering and layer-aware placement."""

from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

import hmgraph
from hmgraph.cache.format import open_feature_file
from hmgraph.cache.policies import layer_aware_score, make_policy
from hmgraph.datasets.renumbered import renumbered, to_original
from hmgraph.models import GraphSAGE, layerwise_inference
from hmgraph.samplers.cluster import ClusterSampler, metis_clusters
from hmgraph.samplers.presample import presample

FANOUTS = [6, 4]


@pytest.fixture(scope="module")
def clusters(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("metis") / "metis-20.npy"
    parts = metis_clusters(tiny.graph, 20, path)
    assert path.is_file()
    again = metis_clusters(tiny.graph, 20, path)  # from the cache
    assert torch.equal(parts, again)
    return parts


def test_metis_clusters_are_balanced_and_local(tiny, clusters):
    sizes = torch.bincount(clusters, minlength=20)
    assert sizes.numel() == 20 and int(sizes.min()) > 0
    src, dst = tiny.graph.edges()
    inside = (clusters[src] == clusters[dst]).float().mean()
    assert inside > 0.5  # METIS keeps most edges inside clusters


LOCALITIES = [0.0, 0.5, 1.0]


@pytest.mark.parametrize("locality", LOCALITIES)
def test_blocks_are_valid(tiny, clusters, locality):
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters,
                             locality=locality)
    seeds = sampler.order_seeds(tiny.split["train"], 0)[:128]
    input_nodes, output_nodes, blocks = sampler.sample(tiny.graph, seeds)
    assert torch.equal(output_nodes, seeds)
    for block, fanout in zip(blocks, FANOUTS, strict=True):
        src_ids, dst_ids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
        assert torch.equal(src_ids[: dst_ids.numel()], dst_ids)
        assert int(block.in_degrees().max()) <= fanout
    assert torch.equal(blocks[0].srcdata[dgl.NID], input_nodes)
    if locality == 1.0:  # every sampled edge stays inside a cluster
        for block in blocks:
            src, dst = block.edges()
            src = block.srcdata[dgl.NID][src]
            dst = block.dstdata[dgl.NID][dst]
            assert torch.equal(clusters[src], clusters[dst])


def test_locality_one_matches_weighted_sampling_with_real_edge_ids(
        tiny, clusters):
    # locality 1 samples the intra-cluster subgraph uniformly: the same
    # distribution as DGL's weighted sampler with weights 1 inside, 0
    # outside, and edge ids that name the graph's own edges.
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters, locality=1.0)
    src, dst = tiny.graph.edges()
    weight = (clusters[src] == clusters[dst]).float()
    tiny.graph.edata["_w"] = weight
    weighted = dgl.dataloading.NeighborSampler(FANOUTS, prob="_w")
    seeds = sampler.order_seeds(tiny.split["train"], 0)[:256]
    try:
        ours = mean_in_degrees(sampler, tiny.graph, seeds)
        theirs = mean_in_degrees(weighted, tiny.graph, seeds)
    finally:
        del tiny.graph.edata["_w"]
    assert torch.allclose(ours, theirs, rtol=0.02), (ours, theirs)
    _, _, blocks = sampler.sample(tiny.graph, seeds)
    for block in blocks:
        bsrc, bdst = block.edges()
        eids = block.edata[dgl.EID]
        gsrc, gdst = tiny.graph.find_edges(eids)
        assert torch.equal(gsrc, block.srcdata[dgl.NID][bsrc])
        assert torch.equal(gdst, block.dstdata[dgl.NID][bdst])
    # Excluded edges (graph ids) never come back.
    banned = blocks[-1].edata[dgl.EID]
    _, _, again = sampler.sample(tiny.graph, seeds, exclude_eids=banned)
    assert not torch.isin(again[-1].edata[dgl.EID], banned).any()


def mean_in_degrees(sampler, graph, seeds, repeats=30):
    totals = torch.zeros(len(FANOUTS), dtype=torch.float64)
    for repeat in range(repeats):
        dgl.seed(repeat)
        _, _, blocks = sampler.sample(graph, seeds)
        for layer, block in enumerate(blocks):
            totals[layer] += block.in_degrees().double().mean()
    return totals / repeats


def test_locality_zero_matches_neighbor_sampler(tiny, clusters):
    seeds = tiny.split["train"][:512]
    ours = mean_in_degrees(ClusterSampler(tiny.graph, FANOUTS, clusters,
                                          locality=0.0), tiny.graph, seeds)
    dgls = mean_in_degrees(dgl.dataloading.NeighborSampler(FANOUTS),
                           tiny.graph, seeds)
    assert torch.allclose(ours, dgls, rtol=0.02), (ours, dgls)


def test_locality_shrinks_the_inputs(tiny, clusters):
    seeds_by = {}
    for locality in (0.0, 1.0):
        sampler = ClusterSampler(tiny.graph, FANOUTS, clusters,
                                 locality=locality)
        seeds = sampler.order_seeds(tiny.split["train"], 0)[:100]
        inputs, _, _ = sampler.sample(tiny.graph, seeds)
        seeds_by[locality] = inputs.numel()
    assert seeds_by[1.0] < seeds_by[0.0]


def test_seed_order_groups_clusters(tiny, clusters):
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters)
    seeds = tiny.split["train"]
    order = sampler.order_seeds(seeds, 5)
    assert torch.equal(order.sort().values, seeds.sort().values)
    runs = (clusters[order][1:] != clusters[order][:-1]).sum() + 1
    assert int(runs) == clusters[seeds].unique().numel()  # one run each
    assert torch.equal(order, sampler.order_seeds(seeds, 5))
    assert not torch.equal(order, sampler.order_seeds(seeds, 6))


def test_bad_locality_and_clusters(tiny, clusters):
    with pytest.raises(ValueError, match="locality must be in"):
        ClusterSampler(tiny.graph, FANOUTS, clusters, locality=1.5)
    with pytest.raises(ValueError, match="clusters has 3 entries"):
        ClusterSampler(tiny.graph, FANOUTS, torch.zeros(3))


def test_renumbering_round_trips(tiny, clusters):
    new = renumbered(tiny, clusters, "test-20")
    perm, inverse = new.info["perm"], new.info["inverse"]
    # Clusters are contiguous id ranges in the new numbering.
    assert bool((clusters[perm][1:] >= clusters[perm][:-1]).all())
    _, old_rows = open_feature_file(tiny.feature_path)
    _, new_rows = open_feature_file(new.feature_path, verify=True)
    v = torch.arange(tiny.num_nodes)
    np.testing.assert_array_equal(new_rows[inverse[v].numpy()], old_rows)
    assert torch.equal(new.labels[inverse], tiny.labels)
    for part in ("train", "valid", "test"):
        assert torch.equal(perm[new.split[part]], tiny.split[part])
    # Same edges under the new names.
    src, dst = new.graph.edges()
    old = set(zip(*(t.tolist() for t in tiny.graph.edges()), strict=True))
    assert set(zip(perm[src].tolist(), perm[dst].tolist(),
                   strict=True)) == old
    # The same model evaluates the same in original ids.
    torch.manual_seed(0)
    model = GraphSAGE(tiny.feat_dim, 16, tiny.num_classes, num_layers=2)
    before = layerwise_inference(model, tiny.graph, tiny.features)
    after = to_original(new, layerwise_inference(model, new.graph,
                                                 new.features))
    assert torch.allclose(before, after, atol=1e-5)
    for part in ("valid", "test"):
        assert tiny.evaluate(before, part) == new.evaluate(
            layerwise_inference(model, new.graph, new.features), part)
    # A second call reuses the rewritten file.
    stamp = new.feature_path.stat().st_mtime_ns
    assert renumbered(tiny, clusters, "test-20").feature_path.stat(
    ).st_mtime_ns == stamp


def test_renumbering_reads_fewer_pages(tiny, clusters):
    """Cluster batches read fewer pages once clusters are id ranges."""
    pages = {}
    for name, data, parts in (
            ("original", tiny, clusters),
            ("renumbered", renumbered(tiny, clusters, "test-20"), None)):
        if parts is None:
            parts = clusters[data.info["perm"]]
        sampler = ClusterSampler(data.graph, FANOUTS, parts, locality=1.0)
        loader = hmgraph.DataLoader(data.graph, data.split["train"], sampler,
                                    features=data.feature_path,
                                    batch_size=128)
        for _ in loader:
            pass
        pages[name] = loader.stats.storage.bytes_read
        loader.close()
    assert pages["renumbered"] < 0.5 * pages["original"], pages


def test_layer_aware_score_prefers_near_hops():
    hop_counts = torch.tensor([[2, 0, 0], [0, 2, 0], [0, 0, 2]])
    score = layer_aware_score(hop_counts)
    assert score[0] > score[1] > score[2]
    policy = make_policy("layer-aware", 3, 1, hop_counts=hop_counts)
    assert policy.warm().tolist() == [0]


def test_presample_counts_hops(tiny):
    sampler = dgl.dataloading.NeighborSampler(FANOUTS)
    profile = presample(tiny.graph, sampler, tiny.split["train"], 100, 3)
    assert profile.hop_counts.shape == (len(FANOUTS) + 1, tiny.num_nodes)
    assert torch.equal(profile.hop_counts.sum(0), profile.counts)
    # Seeds are hop 0: 3 batches of 100 seeds.
    assert int(profile.hop_counts[0].sum()) == 300


def test_presample_follows_the_loaders_order(tiny):
    # A loader without shuffling profiles the batches it will train on:
    # hop 0 of the first profiled batch is the first 100 seeds.
    sampler = dgl.dataloading.NeighborSampler(FANOUTS)
    seeds = tiny.split["train"]
    first = set(seeds[:100].tolist())
    hop0 = presample(tiny.graph, sampler, seeds, 100, 1,
                     shuffle=False).hop_counts[0]
    assert set(torch.nonzero(hop0).flatten().tolist()) == first
    hop0 = presample(tiny.graph, sampler, seeds, 100, 1).hop_counts[0]
    assert set(torch.nonzero(hop0).flatten().tolist()) != first
    loader = hmgraph.DataLoader(
        tiny.graph, seeds, sampler, batch_size=100, shuffle=False,
        cache="presample", host_budget_bytes=400 * 1000, profile_batches=1)
    profiled = set(torch.nonzero(loader.profile.hop_counts[0]).flatten()
                   .tolist())
    assert profiled == first
    loader.close()


def test_loader_with_cluster_sampler_and_layer_aware_cache(tiny, clusters):
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters, locality=0.5)
    budget = tiny.features.numel() * 4 // 5
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"], sampler, features=tiny.feature_path,
        batch_size=128, shuffle=True, cache="hmgraph", placement="layer-aware",
        device_budget_bytes=budget // 4, host_budget_bytes=budget,
        prefetch=2, profile_batches=4)
    for batch in loader:
        assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    assert loader.stats.hit_rate("device") > 0
    loader.close()


def test_groups_mix_a_few_clusters(tiny, clusters):
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters, group_size=4)
    order = sampler.order_seeds(tiny.split["train"], 0)
    for start in range(0, order.numel(), 64):
        batch = order[start:start + 64]
        assert clusters[batch].unique().numel() <= 8  # within <= 2 groups
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        ClusterSampler(tiny.graph, FANOUTS, clusters, group_size=0)

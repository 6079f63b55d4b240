"""Cluster sampling, renumbering and layer-aware placement."""

from __future__ import annotations

import importlib
import pickle
import threading

import dgl
import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hmgraph
from hmgraph.cache.format import open_feature_file
from hmgraph.cache.policies import layer_aware_score, make_policy
from hmgraph.datasets.renumbered import renumbered, to_original
from hmgraph.models import GraphSAGE, layerwise_inference
from hmgraph.samplers.cluster import ClusterSampler, metis_clusters
from hmgraph.samplers.locality import partition_rows
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


def edge_counts(sampler, graph, seeds, draws, first_seed):
    """Times each graph edge was sampled into the seeds' block (the last),
    over ``draws`` draws seeded ``first_seed``, ``first_seed + 1``, ..."""
    counts = torch.zeros(graph.num_edges(), dtype=torch.int64)
    for draw in range(draws):
        dgl.seed(first_seed + draw)
        _, _, blocks = sampler.sample(graph, seeds)
        counts += torch.bincount(blocks[-1].edata[dgl.EID],
                                 minlength=graph.num_edges())
    return counts


def same_inclusion_pvalue(ours, theirs, draws):
    """P-value of "each edge is sampled with the same probability by both".

    Per edge, a 2x2 chi-square of (sampled, not) in ``draws`` independent
    draws of each sampler, summed over the edges that some draw took and
    some did not: under the hypothesis each term has mean 1, and the sum is
    compared with a chi-square of one degree of freedom per edge.
    """
    pooled = (ours + theirs).double() / (2 * draws)
    tested = (pooled > 0) & (pooled < 1)
    variance = 2 * draws * pooled[tested] * (1 - pooled[tested])
    statistic = ((ours - theirs)[tested].double() ** 2 / variance).sum()
    return float(scipy.stats.chi2.sf(float(statistic), int(tested.sum())))


@pytest.mark.parametrize("locality", [0.5, 1.0])
def test_locality_matches_dgl_weighted_sampling_with_real_edge_ids(
        tiny, clusters, locality):
    """The compiled engine samples as DGL's weighted sampler with weights 1
    inside and ``1 - locality`` outside does, edge by edge, and its edge
    ids name the graph's own edges.

    A two-sample test over 200 independent draws of each compares how often
    every edge is sampled into the seeds' block; a sampler with the same
    support and in-degrees but a bias inside the cluster (weight 2 for
    neighbours of odd id) must fail the same test.
    """
    graph, fanouts, draws = tiny.graph, [4], 200
    sampler = ClusterSampler(graph, fanouts, clusters, locality=locality)
    assert sampler.engine == "compiled"
    src, dst = graph.edges()
    inside = clusters[src] == clusters[dst]
    weight = torch.where(inside, 1.0, 1.0 - locality)
    graph.edata["_w"] = weight
    graph.edata["_biased"] = weight * torch.where(inside, 1.0 + src % 2, 1.0)
    weighted = dgl.dataloading.NeighborSampler(fanouts, prob="_w")
    biased = dgl.dataloading.NeighborSampler(fanouts, prob="_biased")
    seeds = sampler.order_seeds(tiny.split["train"], 0)[:256]
    try:
        ours = edge_counts(sampler, graph, seeds, draws, 0)
        theirs = edge_counts(weighted, graph, seeds, draws, draws)
        control = edge_counts(biased, graph, seeds, draws, draws)
    finally:
        del graph.edata["_w"], graph.edata["_biased"]
    # Exact: a seed with at most 4 eligible neighbours gets all of them in
    # every draw, others 4 per draw; at locality 1 no edge leaves a cluster.
    eligible = inside if locality == 1.0 else torch.ones_like(inside)
    to_seed = torch.isin(dst, seeds) & eligible
    count = torch.bincount(dst[to_seed], minlength=graph.num_nodes())
    few = to_seed & (count[dst] <= fanouts[0])
    assert int(ours[~eligible].sum()) == 0
    assert bool((ours[few] == draws).all())
    assert int(ours.sum()) == draws * int(
        count[seeds].clamp(max=fanouts[0]).sum())
    # The rest, edge by edge: ours against DGL's, and the biased control
    # (same support, same in-degrees) against DGL's.
    p_ours = same_inclusion_pvalue(ours, theirs, draws)
    p_control = same_inclusion_pvalue(control, theirs, draws)
    assert p_ours > 1e-4, (p_ours, p_control)
    assert p_control < 1e-12, (p_ours, p_control)
    _, _, blocks = sampler.sample(graph, seeds)
    for block in blocks:
        bsrc, bdst = block.edges()
        eids = block.edata[dgl.EID]
        gsrc, gdst = graph.find_edges(eids)
        assert torch.equal(gsrc, block.srcdata[dgl.NID][bsrc])
        assert torch.equal(gdst, block.dstdata[dgl.NID][bdst])
    # Excluded edges (graph ids) never come back (DGL's engine serves it).
    banned = blocks[-1].edata[dgl.EID]
    _, _, again = sampler.sample(graph, seeds, exclude_eids=banned)
    assert not torch.isin(again[-1].edata[dgl.EID], banned).any()


# -- The compiled engine against its torch reference ------------------------

ENGINE_LOCALITIES = [0.25, 0.5, 0.9, 1.0]
ENGINE_FANOUTS = {"15,10,5": [15, 10, 5], "all,3": [-1, 3],
                  "1,40": [1, 40], "0,2": [0, 2]}


def assert_same_blocks(sample, other):
    """Two ``sample`` results: the same ids, edges and edge ids."""
    assert torch.equal(sample[0], other[0])
    assert torch.equal(sample[1], other[1])
    assert len(sample[2]) == len(other[2])
    for ours, theirs in zip(sample[2], other[2], strict=True):
        for data in ("srcdata", "dstdata"):
            assert torch.equal(getattr(ours, data)[dgl.NID],
                               getattr(theirs, data)[dgl.NID])
        assert torch.equal(ours.edata[dgl.EID], theirs.edata[dgl.EID])
        for mine, reference in zip(ours.edges(), theirs.edges(),
                                   strict=True):
            assert torch.equal(mine, reference)
        assert torch.equal(ours.in_degrees(), theirs.in_degrees())


def engines(graph, fanouts, clusters, locality, group_size=1):
    return [ClusterSampler(graph, fanouts, clusters, locality=locality,
                           group_size=group_size, engine=engine)
            for engine in ("compiled", "torch")]


@pytest.mark.parametrize("fanouts", ENGINE_FANOUTS.values(),
                         ids=ENGINE_FANOUTS.keys())
@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("locality", ENGINE_LOCALITIES)
def test_compiled_engine_samples_as_the_reference(tiny, clusters, locality,
                                                  group_size, fanouts):
    """Bit for bit, batch after batch of an epoch's order, per DGL seed."""
    compiled, reference = engines(tiny.graph, fanouts, clusters, locality,
                                  group_size)
    order = compiled.order_seeds(tiny.split["train"], 3)
    for seed, batch in enumerate(order.split(100)[:4]):
        dgl.seed(seed)
        ours = compiled.sample(tiny.graph, batch)
        dgl.seed(seed)
        assert_same_blocks(ours, reference.sample(tiny.graph, batch))
        if locality == 1.0:  # every sampled edge stays inside a cluster
            for block in ours[2]:
                src, dst = block.edges()
                assert torch.equal(
                    clusters[block.srcdata[dgl.NID][src]],
                    clusters[block.dstdata[dgl.NID][dst]])
    dgl.seed(0)
    first = compiled.sample(tiny.graph, order[:100])
    dgl.seed(1)
    assert not torch.equal(first[2][-1].edata[dgl.EID], compiled.sample(
        tiny.graph, order[:100])[2][-1].edata[dgl.EID])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), nodes=st.integers(1, 40),
       parts=st.integers(1, 4), locality=st.one_of(
           st.just(1.0), st.floats(0.001, 0.999)),
       fanouts=st.lists(st.integers(-1, 8), min_size=1, max_size=3),
       seed=st.integers(0, 2**31 - 1))
def test_compiled_engine_equals_the_reference_on_any_graph(
        data, nodes, parts, locality, fanouts, seed):
    """Any small graph: self-loops, repeated edges, nodes without
    in-edges, clusters of any size, fanouts -1 to 8."""
    edges = data.draw(st.lists(st.tuples(st.integers(0, nodes - 1),
                                         st.integers(0, nodes - 1)),
                               max_size=150))
    src, dst = (torch.tensor([e[k] for e in edges], dtype=torch.int64)
                for k in (0, 1))
    graph = dgl.graph((src, dst), num_nodes=nodes)
    clusters = torch.tensor(data.draw(st.lists(
        st.integers(0, parts - 1), min_size=nodes, max_size=nodes)))
    seeds = torch.tensor(data.draw(st.lists(
        st.integers(0, nodes - 1), min_size=1, max_size=nodes,
        unique=True)))
    compiled, reference = engines(graph, fanouts, clusters, locality)
    dgl.seed(seed)
    ours = compiled.sample(graph, seeds)
    dgl.seed(seed)
    assert_same_blocks(ours, reference.sample(graph, seeds))


@pytest.mark.parametrize("locality", [0.3, 1.0])
def test_compiled_engine_equals_the_reference_on_wide_rows(locality):
    """Rows of more than 64 neighbours in a class (Floyd's other path)."""
    generator = torch.Generator().manual_seed(5)
    hubs = torch.arange(10).repeat_interleave(300)
    src = torch.randint(0, 2000, (hubs.numel(),), generator=generator)
    graph = dgl.graph((torch.cat([src, hubs]), torch.cat([hubs, src])),
                      num_nodes=2000)
    clusters = torch.randint(0, 2, (2000,), generator=generator)
    compiled, reference = engines(graph, [70, 25], clusters, locality)
    for seed in range(3):
        dgl.seed(seed)
        ours = compiled.sample(graph, torch.arange(10))
        dgl.seed(seed)
        assert_same_blocks(ours, reference.sample(graph, torch.arange(10)))
    assert int(ours[2][-1].in_degrees().min()) == 25


def test_layout_puts_inside_neighbours_first(tiny, clusters):
    indptr, indices, eids = (a.numpy() for a in
                             tiny.graph.adj_tensors("csc"))
    rows = np.empty((indices.shape[0], 2), dtype=np.int32)
    inside = partition_rows(indptr, indices, eids, clusters.numpy(), rows)
    src, dst = tiny.graph.find_edges(torch.from_numpy(rows[:, 1]).long())
    assert torch.equal(src, torch.from_numpy(rows[:, 0]).long())
    node = torch.repeat_interleave(torch.arange(tiny.num_nodes),
                                   torch.from_numpy(np.diff(indptr)))
    assert torch.equal(dst, node)  # each pair stays in its row
    first = torch.arange(rows.shape[0]) - torch.from_numpy(indptr)[node] \
        < torch.from_numpy(inside)[node]
    assert torch.equal(first, clusters[src] == clusters[dst])
    assert sorted(rows[:, 1].tolist()) == list(range(rows.shape[0]))


def test_engines_carry_across_processes_and_threads(tiny, clusters):
    """A pickled sampler samples the same blocks; threads sampling at once
    (each its own stamped table) get valid blocks."""
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters, locality=0.5)
    seeds = sampler.order_seeds(tiny.split["train"], 0)[:128]
    dgl.seed(4)
    before = sampler.sample(tiny.graph, seeds)
    again = pickle.loads(pickle.dumps(sampler))
    dgl.seed(4)
    assert_same_blocks(before, again.sample(tiny.graph, seeds))
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(sampler.sample(tiny.graph, seeds))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 60
    for input_nodes, _, blocks in results:
        for block in blocks:
            src_ids, dst_ids = block.srcdata[dgl.NID], block.dstdata[dgl.NID]
            assert torch.equal(src_ids[: dst_ids.numel()], dst_ids)
            assert src_ids.unique().numel() == src_ids.numel()
            gsrc, gdst = tiny.graph.find_edges(block.edata[dgl.EID])
            bsrc, bdst = block.edges()
            assert torch.equal(gsrc, src_ids[bsrc])
            assert torch.equal(gdst, dst_ids[bdst])
        assert torch.equal(blocks[0].srcdata[dgl.NID], input_nodes)


def inside_share_z(sampler, graph, clusters, seeds, draws=100):
    """In-cluster share of sampled edges against uniform sampling: z-score.

    Every block of every draw: given its destination nodes, uniform
    sampling without replacement of ``m = min(fanout, d)`` of a node's
    ``d`` in-edges, ``i`` of them inside its cluster, takes a
    hypergeometric count of inside edges (mean ``m i / d``, variance
    ``m (i / d) (1 - i / d) (d - m) / (d - 1)``). Returns the observed
    share, the share uniform sampling expects, and the z-score of the
    total count.
    """
    src, dst = graph.edges()
    inside = clusters[src] == clusters[dst]
    degree = graph.in_degrees().double()
    inside_degree = torch.bincount(dst[inside],
                                   minlength=graph.num_nodes()).double()
    count = mean = variance = sampled = 0.0
    for draw in range(draws):
        dgl.seed(draw)
        _, _, blocks = sampler.sample(graph, seeds)
        for block, fanout in zip(blocks, sampler.fanouts, strict=True):
            eids = block.edata[dgl.EID]
            count += float(inside[eids].sum())
            sampled += eids.numel()
            nodes = block.dstdata[dgl.NID]
            d, i = degree[nodes], inside_degree[nodes]
            m = d.clamp(max=fanout)
            q = i / d.clamp(min=1)
            mean += float((m * q).sum())
            variance += float((m * q * (1 - q) * (d - m)
                               / (d - 1).clamp(min=1)).sum())
    return (count / sampled, mean / sampled,
            (count - mean) / max(variance, 1e-12) ** 0.5)


def test_locality_zero_samples_uniformly(tiny, clusters):
    """locality 0: neighbours in the seed's cluster are not preferred.

    The in-cluster share of sampled edges is what uniform sampling
    expects, within 4 standard deviations; a slight preference (locality
    0.1: weight 0.9 outside) is far outside that, and locality 0.5 and 1
    raise the share step by step to 1 (every edge inside).
    """
    seeds = tiny.split["train"][:256]

    def share(locality):
        sampler = ClusterSampler(tiny.graph, FANOUTS, clusters,
                                 locality=locality)
        return inside_share_z(sampler, tiny.graph, clusters, seeds)

    observed, uniform, z = share(0.0)
    assert abs(z) < 4, (observed, uniform, z)
    assert 0.5 < uniform < 0.95  # the graph leaves room to tell them apart
    slight, _, z_slight = share(0.1)
    assert z_slight > 10, (slight, uniform, z_slight)
    half, _, _ = share(0.5)
    assert observed < slight < half < 1.0
    assert share(1.0)[0] == 1.0


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
    with pytest.raises(ValueError, match="no prob or mask"):
        ClusterSampler(tiny.graph, FANOUTS, clusters, prob="w")
    with pytest.raises(ValueError, match="unknown engine 'numba'"):
        ClusterSampler(tiny.graph, FANOUTS, clusters, engine="numba")
    sampler = ClusterSampler(tiny.graph, FANOUTS, clusters)
    with pytest.raises(ValueError, match="seed ids must be in"):
        sampler.sample(tiny.graph, torch.tensor([0, tiny.num_nodes]))
    with pytest.raises(ValueError, match="built for a graph of"):
        sampler.sample(dgl.rand_graph(10, 20), torch.tensor([0]))


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


def test_presample_follows_the_loaders_order(tiny, monkeypatch):
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
    made = []  # the loader's own profile, as presample made it

    def spy(*args, **kwargs):
        made.append(presample(*args, **kwargs))
        return made[-1]

    # The module, not `hmgraph.samplers.presample` (its function).
    monkeypatch.setattr(importlib.import_module(
        "hmgraph.samplers.presample"), "presample", spy)
    loader = hmgraph.DataLoader(
        tiny.graph, seeds, sampler, batch_size=100, shuffle=False,
        cache="presample", host_budget_bytes=400 * 1000, profile_batches=1)
    (profile,) = made
    assert set(torch.nonzero(profile.hop_counts[0]).flatten()
               .tolist()) == first
    assert not hasattr(loader, "profile")  # let go once planned
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

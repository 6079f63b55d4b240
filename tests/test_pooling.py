"""HAP and the pooling baselines: levels, masks, invariance, gradients."""

from __future__ import annotations

import functools
import math

import dgl
import pytest
import torch
import torch.nn.functional as F

from hmgraph.models import hap, pooling
from hmgraph.models.pooling import (
    HAP,
    POOLING_MODELS,
    GraphLevel,
    build_pooling_model,
    to_dense_batch,
)

MODEL_NAMES = sorted(POOLING_MODELS)
# Nodes per graph of the test batch: a single node, an edge, small and
# larger graphs (larger than HAP's first cap of super-nodes / ratio).
SIZES = [1, 2, 5, 9, 17, 140]
IN_FEATS, HIDDEN, CLASSES = 6, 16, 3


def random_graph(num_nodes, seed, edge_factor=2):
    """A seeded undirected random graph (both directions, no self-loops)."""
    gen = torch.Generator().manual_seed(seed)
    count = edge_factor * num_nodes
    src = torch.randint(0, num_nodes, (count,), generator=gen)
    dst = torch.randint(0, num_nodes, (count,), generator=gen)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    graph = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])),
                      num_nodes=num_nodes)
    return dgl.to_simple(graph)


def make_batch(sizes=SIZES, seed=0):
    """``dgl.batch`` of random graphs and seeded features."""
    graphs = [random_graph(n, seed + i) for i, n in enumerate(sizes)]
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(sum(sizes), IN_FEATS, generator=gen)
    return dgl.batch(graphs), features


def make_model(name, seed=0):
    torch.manual_seed(seed)
    return build_pooling_model(name, IN_FEATS, HIDDEN, CLASSES,
                               max_nodes=max(SIZES))


def record_levels(monkeypatch):
    """Record every level the models build (coarsening and top-k)."""
    levels = []
    coarsen, select = pooling.coarsen, pooling._select_top

    def coarsen_and_record(*args, **kwargs):
        levels.append(coarsen(*args, **kwargs))
        return levels[-1]

    def select_and_record(*args):
        kept, level = select(*args)
        levels.append(level)
        return kept, level

    monkeypatch.setattr(pooling, "coarsen", coarsen_and_record)
    monkeypatch.setattr(hap, "coarsen", coarsen_and_record)
    monkeypatch.setattr(pooling, "_select_top", select_and_record)
    return levels


def expected_sizes(name, model, sizes):
    """Nodes per graph at each pooled level, by the model's rule."""
    out, sizes = [], torch.tensor(sizes)
    for level in range(model.num_levels
                       - (name in ("diffpool", "hap", "hap-sum"))):
        if name in ("topk", "sagpool"):
            sizes = torch.ceil(model.ratio * sizes.double()).long()
        elif name.startswith("hap"):
            sizes = model.moas[level].cluster_counts(sizes)
        else:  # diffpool: every graph has every cluster
            sizes = torch.full_like(sizes, model.cluster_counts[level])
        out.append(sizes)
    return out


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES
                                  if not n.startswith("gin")])
def test_shapes_and_masks_through_every_level(name, monkeypatch):
    levels = record_levels(monkeypatch)
    model = make_model(name).eval()
    graph, features = make_batch()
    logits = model(graph, features)
    assert logits.shape == (len(SIZES), CLASSES)
    assert torch.isfinite(logits).all()
    want = expected_sizes(name, model, SIZES)
    assert len(levels) == len(want) >= 2
    for level, sizes in zip(levels, want, strict=True):
        assert torch.equal(level.sizes, sizes)
        assert level.mask.shape == (len(SIZES), int(sizes.max()))
        assert torch.equal(level.mask.sum(1), sizes)
        if name != "diffpool":  # DiffPool: same cluster count for all
            assert sizes[0] == 1  # the single-node graph keeps one node
        # HAP's coarse levels are packed, DiffPool's dense, the others'
        # sparse.
        assert level.dense == (name == "diffpool")
        if level.adj is not None:
            k = level.mask.shape[1]
            assert level.adj.shape == (len(SIZES), k, k)
            outside = ~(level.mask.unsqueeze(1) & level.mask.unsqueeze(2))
            assert (level.adj[outside] == 0).all()
            torch.testing.assert_close(level.adj, level.adj.transpose(1, 2))
        if not level.dense:
            assert level.batch.numel() == int(sizes.sum())
            assert torch.equal(level.batch, torch.repeat_interleave(
                torch.arange(len(SIZES)), sizes))
        if level.src is not None:
            assert torch.equal(level.batch[level.src], level.batch[level.dst])


def test_hap_super_node_counts_follow_graph_size():
    model = HAP(IN_FEATS, HIDDEN, CLASSES, max_clusters=8)
    counts = model.moas[0].cluster_counts(torch.tensor(SIZES))
    assert counts.tolist() == [1, 1, 2, 3, 5, 8]  # ceil(n / 4), at most 8
    counts = model.moas[1].cluster_counts(counts)
    assert counts.tolist() == [1, 1, 1, 1, 2, 2]  # cap ceil(8 / 4) = 2


def test_hap_coarse_rows_are_masked_weighted_means(monkeypatch):
    """MOA's first coarsening, recomputed graph by graph from its inputs.

    From the node rows ``h`` and memberships ``S`` it saw: each super-node
    row is the membership-weighted mean of its graph's rows, the coarse
    adjacency is ``S^T A S``, and the stability loss is the mean over
    graphs of ``1 - cos`` of the GCont contents before and after, the
    contents and cosines worked out by hand from GCont's parameters. In
    float64: the loss is small (~1e-5 here), so it is checked to 1e-9.
    """
    seen, members, contents = [], [], []
    coarsen = hap.coarsen

    def coarsen_and_record(level, assign, cluster_mask, **kwargs):
        members.append(assign)
        return coarsen(level, assign, cluster_mask, **kwargs)

    monkeypatch.setattr(hap, "coarsen", coarsen_and_record)
    model = make_model("hap").eval().double()
    moa = model.moas[0]
    moa.register_forward_hook(
        lambda module, args, out: seen.append((args, out)))
    moa.gcont.register_forward_hook(
        lambda module, args, out: contents.append(out))
    graph, features = make_batch()
    with torch.no_grad():
        model(graph, features.double())
    (_, h), (coarse, rows, stability) = seen[0]
    # The input level is sparse: memberships come per node, (nodes, K).
    assert members[0].shape == (sum(SIZES), 32)
    member = to_dense_batch(members[0], torch.tensor(SIZES))[0]
    # ceil(n / 4) super-nodes, at most 32 (140 nodes: 35 -> 32).
    assert coarse.sizes.tolist() == [1, 1, 2, 3, 5, 32]
    # Packed: each graph's super-nodes only, graph after graph.
    assert rows.shape == (44, HIDDEN) and not coarse.dense
    rows = coarse.to_dense(rows)

    def content(x):
        gcont = moa.gcont
        scores = torch.tanh(x @ gcont.proj.weight.T + gcont.proj.bias)
        weights = torch.softmax(scores @ gcont.content, 0)
        return (weights.unsqueeze(-1) * x).sum(0)

    src, dst = graph.edges()
    losses, start = [], 0
    for b, n in enumerate(SIZES):
        k = int(coarse.sizes[b])
        x, s = h[start:start + n], member[b, :n, :k]
        # Each node's memberships: a distribution over its graph's k
        # super-nodes; padded nodes and super-nodes get none.
        torch.testing.assert_close(s.sum(1), torch.ones(n).double())
        assert (member[b, n:] == 0).all() and (member[b, :, k:] == 0).all()
        weights = s + 1e-8
        torch.testing.assert_close(rows[b, :k],
                                   (weights / weights.sum(0)).T @ x)
        inside = (src >= start) & (src < start + n)
        adj = torch.zeros(n, n, dtype=torch.float64)
        adj[dst[inside] - start, src[inside] - start] = 1.0
        torch.testing.assert_close(coarse.adj[b, :k, :k], s.T @ adj @ s)
        assert (coarse.adj[b, k:] == 0).all()
        assert (coarse.adj[b, :, k:] == 0).all()
        before, after = content(x), content(rows[b, :k])
        # GCont's contents of the fine and the coarse level (its first
        # two calls), padding left out of their softmax.
        torch.testing.assert_close(contents[0][b], before)
        torch.testing.assert_close(contents[1][b], after)
        cos = (before @ after) / (before.norm() * after.norm())
        losses.append(1 - cos)
        start += n
    expected = torch.stack(losses).mean()
    assert float(expected) > 1e-6  # the check below is not 0 == 0
    torch.testing.assert_close(stability, expected, rtol=1e-9, atol=1e-12)
    # Memberships of each node sum to 1: the coarse edge weight equals the
    # fine one (each undirected edge counted in both directions).
    edges_per_graph = graph.batch_num_edges().double()
    torch.testing.assert_close(coarse.adj.sum((1, 2)), edges_per_graph)


def relabel(graph, seed=7):
    """The batch with the nodes of every graph relabelled, and the perm.

    Node ``i`` of the result is node ``perm[i]`` of ``graph``; the edge
    order is shuffled too.
    """
    gen = torch.Generator().manual_seed(seed)
    sizes = graph.batch_num_nodes()
    starts = sizes.cumsum(0) - sizes
    perm = torch.cat([start + torch.randperm(int(n), generator=gen)
                      for start, n in zip(starts, sizes, strict=True)])
    new_id = torch.empty_like(perm)
    new_id[perm] = torch.arange(perm.numel())
    src, dst = graph.edges()
    shuffle = torch.randperm(src.numel(), generator=gen)
    relabelled = dgl.graph((new_id[src][shuffle], new_id[dst][shuffle]),
                           num_nodes=graph.num_nodes())
    relabelled.set_batch_num_nodes(sizes)
    relabelled.set_batch_num_edges(graph.batch_num_edges())
    return relabelled, perm


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_embedding_is_permutation_invariant(name):
    """Exact in float64; in float32 up to rounding (sums of ~100s)."""
    model = make_model(name).eval()
    graph, features = make_batch()
    relabelled, perm = relabel(graph)
    with torch.no_grad():
        logits = model(graph, features)
        torch.testing.assert_close(model(relabelled, features[perm]),
                                   logits, atol=1e-5, rtol=1e-5)
        model.double()
        features = features.double()
        before = model.embed(graph, features)
        after = model.embed(relabelled, features[perm])
    assert (after - before).abs().max() <= 1e-5


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_embedding_does_not_depend_on_the_batch(name):
    model = make_model(name).eval()
    graph, features = make_batch()
    with torch.no_grad():
        together = model.embed(graph, features)
        rows = torch.split(features, SIZES)
        alone = [model.embed(g, x) for g, x in
                 zip(dgl.unbatch(graph), rows, strict=True)]
    torch.testing.assert_close(together, torch.cat(alone), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_gradients_reach_every_parameter(name):
    model = make_model(name).train()
    graph, features = make_batch()
    labels = torch.arange(len(SIZES)) % CLASSES
    loss = F.cross_entropy(model(graph, features), labels) \
        + model.auxiliary_loss
    loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_auxiliary_loss(name):
    model = make_model(name)
    model(*make_batch())
    aux = model.auxiliary_loss
    assert aux.dim() == 0 and torch.isfinite(aux)
    if name in ("diffpool", "hap", "hap-sum"):
        assert aux.requires_grad and float(aux) > 0
    else:
        assert float(aux) == 0.0


def test_sparse_and_dense_levels_agree():
    graph, features = make_batch([1, 4, 7])
    sparse = GraphLevel.from_graph(graph, "cpu")
    adj = torch.zeros(3, 7, 7)
    src, dst = graph.edges()
    starts = sparse.sizes.cumsum(0) - sparse.sizes
    pos = torch.arange(graph.num_nodes()) - starts[sparse.batch]
    adj[sparse.batch[dst], pos[dst], pos[src]] = 1.0
    dense = GraphLevel(sparse.sizes, sparse.mask, adj=adj)
    x = features
    for op in ("aggregate", "propagate"):
        torch.testing.assert_close(
            sparse.to_dense(getattr(sparse, op)(x)),
            getattr(dense, op)(sparse.to_dense(x)))
    torch.testing.assert_close(sparse.to_dense(sparse.aggregate(x, True)),
                               dense.aggregate(sparse.to_dense(x), True))
    torch.testing.assert_close(sparse.readout(x),
                               dense.readout(sparse.to_dense(x)))


def test_packed_and_dense_levels_agree():
    """A packed level (flat rows, padded adjacency: HAP's coarse levels)
    computes what its dense form does on the padded rows, in float64."""
    gen = torch.Generator().manual_seed(0)
    sizes = torch.tensor([1, 4, 2, 5])
    mask = torch.arange(5) < sizes.unsqueeze(1)
    adj = torch.rand(4, 5, 5, generator=gen, dtype=torch.float64)
    adj = (adj + adj.transpose(1, 2)) * (mask.unsqueeze(1) & mask.unsqueeze(2))
    batch = torch.repeat_interleave(torch.arange(4), sizes)
    packed = GraphLevel(sizes, mask, batch=batch, adj=adj)
    dense = GraphLevel(sizes, mask, adj=adj)
    assert not packed.dense and dense.dense
    x = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    y = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    padded_x, padded_y = packed.to_dense(x), packed.to_dense(y)
    assert padded_x.shape == (4, 5, 6) and (padded_x[~mask] == 0).all()
    torch.testing.assert_close(packed.from_dense(padded_x), x)
    for op in ("aggregate", "propagate"):
        torch.testing.assert_close(
            packed.to_dense(getattr(packed, op)(x)),
            getattr(dense, op)(padded_x) * mask.unsqueeze(-1))
    torch.testing.assert_close(
        packed.to_dense(packed.aggregate(x, True)),
        dense.aggregate(padded_x, True) * mask.unsqueeze(-1))
    torch.testing.assert_close(packed.readout(x), dense.readout(padded_x))
    torch.testing.assert_close(packed.sum_nodes(x), dense.sum_nodes(padded_x))
    torch.testing.assert_close(packed.graph_matmul(x, y),
                               dense.graph_matmul(padded_x, padded_y))
    scores = torch.randn(12, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        packed.to_dense(packed.softmax_nodes(scores)),
        dense.softmax_nodes(packed.to_dense(scores)))
    torch.testing.assert_close(
        packed.per_node(x[:4]), x[:4][batch])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_sparse_max_readout_matches_dense_with_ties_and_empty_graphs(sign):
    """The sparse level's max: values, zeros for an empty graph, and the
    gradient split evenly between tied rows, as the dense amax, whatever
    its sign (`torch.segment_reduce` split only positive gradients, so a
    negative one reached each of a molecule's nine identical atoms whole,
    and HAP's activations grew until training failed on Mutagenicity)."""
    sizes = torch.tensor([3, 0, 2, 1, 9])
    none = torch.zeros(0, dtype=torch.int64)
    sparse = GraphLevel.sparse(sizes, none, none)
    dense = GraphLevel(sizes, sparse.mask, adj=torch.zeros(5, 9, 9))
    x = torch.tensor([[1.0, 0.0], [4.0, 0.0], [4.0, -2.0],  # ties
                      [-1.0, -3.0], [-1.0, 5.0], [7.0, 7.0],
                      *[[0.25, 0.5]] * 9])  # nine tied rows
    grads = []
    for level, rows in ((sparse, x), (dense, sparse.to_dense(x))):
        rows = rows.clone().requires_grad_()
        peak = level.readout(rows)[:, 2:]
        peak.backward(sign * torch.arange(1.0, 11.0).view(5, 2))
        grads.append(sparse.from_dense(rows.grad) if level.dense
                     else rows.grad)
        assert peak.tolist() == [[4, 0], [0, 0], [-1, 5], [7, 7],
                                 [0.25, 0.5]]
    torch.testing.assert_close(grads[0], grads[1])
    assert (grads[0][:6, 0] / sign).tolist() == [0, 0.5, 0.5, 2.5, 2.5, 7]
    # Graph 4's gradient (9, 10) shared by its nine rows.
    torch.testing.assert_close(grads[0][6:] / sign,
                               torch.tensor([[1.0, 10 / 9]]).expand(9, 2))


def test_graph_matmul_pads_graphs_by_size_group():
    """Per graph ``a^T b`` on a sparse level equals the product of the
    batch padded to its largest graph, values and gradients, with and
    without per-graph column bounds; the groups pad far less."""
    from hmgraph.models.hierarchy import MERGE_ROWS

    sizes = torch.tensor([1, 3, 0, 17, 40, 5, 2, 600, 4, 33])
    none = torch.zeros(0, dtype=torch.int64)
    level = GraphLevel.sparse(sizes, none, none)
    gen = torch.Generator().manual_seed(0)
    cols = torch.tensor([1, 2, 1, 5, 6, 2, 1, 6, 1, 4])
    a = torch.rand(int(sizes.sum()), 6, generator=gen, dtype=torch.float64)
    a = a * (torch.arange(6) < cols[level.batch].unsqueeze(1))
    b = torch.rand(int(sizes.sum()), 5, generator=gen, dtype=torch.float64)
    for a_cols, right in ((None, b), (cols, b), (cols, a)):
        b_cols = cols if right is a else None
        x, y = a.clone().requires_grad_(), right.clone().requires_grad_()
        got = level.graph_matmul(x, y, a_cols, b_cols)
        weights = torch.rand(got.shape, generator=gen, dtype=torch.float64)
        (got * weights).sum().backward()
        want_x, want_y = a.clone().requires_grad_(), \
            right.clone().requires_grad_()
        want = (to_dense_batch(want_x, sizes)[0].transpose(1, 2)
                @ to_dense_batch(want_y, sizes)[0])
        (want * weights).sum().backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x.grad, want_x.grad)
        torch.testing.assert_close(y.grad, want_y.grad)
    groups, _, _ = level.size_groups()
    assert sorted(g for graphs, _ in groups for g in graphs) == list(
        range(len(sizes)))
    for graphs, width in groups:
        assert width == max(int(sizes[g]) for g in graphs)
    assert ([7], 600) in groups  # the large graph pads no small one
    padded = sum(len(graphs) * width for graphs, width in groups)
    assert padded <= int(sizes.sum()) + MERGE_ROWS < len(sizes) * 600


def test_coarsening_a_sparse_level_matches_its_dense_form():
    """``S^T A S`` from the sparse input level (size groups, HAP's
    per-graph super-node counts) equals the padded dense computation."""
    graph, _ = make_batch()
    sparse = GraphLevel.from_graph(graph, "cpu")
    src, dst = graph.edges()
    starts = sparse.sizes.cumsum(0) - sparse.sizes
    pos = torch.arange(graph.num_nodes()) - starts[sparse.batch]
    width = int(sparse.sizes.max())
    adj = torch.zeros(len(SIZES), width, width, dtype=torch.float64)
    adj[sparse.batch[dst], pos[dst], pos[src]] = 1.0
    dense = GraphLevel(sparse.sizes, sparse.mask, adj=adj)
    counts = torch.tensor([1, 1, 2, 3, 5, 8])
    clusters = torch.arange(8) < counts.unsqueeze(1)
    logits = torch.randn(graph.num_nodes(), 8, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(1))
    assign = torch.softmax(logits.masked_fill(
        ~clusters[sparse.batch], -math.inf), -1)
    got = pooling.coarsen(sparse, assign, clusters)
    want = pooling.coarsen(dense, sparse.to_dense(assign), clusters)
    assert float(want.adj.abs().sum()) > 0
    torch.testing.assert_close(got.adj, want.adj)
    assert torch.equal(got.sizes, counts) and torch.equal(got.mask, clusters)


def test_to_dense_batch():
    x = torch.arange(6.0).unsqueeze(-1)
    dense, mask = to_dense_batch(x, torch.tensor([1, 3, 2]))
    assert dense.shape == (3, 3, 1)
    assert mask.tolist() == [[True, False, False], [True, True, True],
                             [True, True, False]]
    assert dense[..., 0].tolist() == [[0, 0, 0], [1, 2, 3], [4, 5, 0]]


def test_build_errors_name_the_problem():
    with pytest.raises(ValueError, match="available: diffpool, gin"):
        build_pooling_model("gpool", 4, 8, 2)
    with pytest.raises(ValueError, match="max_nodes"):
        build_pooling_model("diffpool", 4, 8, 2)
    with pytest.raises(ValueError, match="ratio"):
        build_pooling_model("topk", 4, 8, 2, ratio=1.5)
    model = make_model("hap")
    with pytest.raises(ValueError, match="in_feats=6"):
        model(*make_batch()[:1], torch.zeros(sum(SIZES), 5))


def test_single_node_graph_alone():
    graph, features = make_batch([1])
    for name in MODEL_NAMES:
        logits = make_model(name).eval()(graph, features)
        assert logits.shape == (1, CLASSES) and torch.isfinite(logits).all()


def test_diffpool_cluster_counts():
    model = build_pooling_model("diffpool", 4, 8, 2, max_nodes=620)
    assert model.cluster_counts == [64, 16]  # ceil(620 / 4) capped, / 4
    model = build_pooling_model("diffpool", 4, 8, 2, max_nodes=28)
    assert model.cluster_counts == [7, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_matches_cpu(name):
    model = make_model(name).eval()
    graph, features = make_batch()
    with torch.no_grad():
        cpu = model(graph, features)
        gpu = model.to("cuda")(graph, features.to("cuda"))
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)


def test_ratio_defaults():
    assert make_model("hap").ratio == 0.25
    assert make_model("diffpool").ratio == 0.25
    assert make_model("sagpool").ratio == make_model("topk").ratio == 0.5
    assert math.isclose(build_pooling_model("hap", 4, 8, 2,
                                            ratio=0.5).ratio, 0.5)


def reference_moa(moa, level, h):
    """MOA as first written: keys and memberships padded to ``(B, N, K)``.

    Keys ``key(sum_t mix_t P^t h)`` and queries ``query(seed * (1 +
    guide))`` per node and graph, masked softmax, explicit ``(S +
    1e-8)``-weighted means and ``S^T A S`` from the packed ``A S``; GCont
    and ``P`` by hand. A packed level is taken in its dense form; the rows
    come back padded, ``(B, K, F)``.
    """
    if level.adj is not None and not level.dense:
        level, h = GraphLevel(level.sizes, level.mask,
                              adj=level.adj), level.to_dense(h)

    def dense(x):
        return x if level.dense else to_dense_batch(x, level.sizes)[0]

    def propagate(lvl, x):
        if lvl.dense:
            degree = lvl.adj.sum(-1) + 1.0
        else:
            degree = torch.bincount(lvl.dst, minlength=x.shape[0]) + 1.0
        norm = degree.to(x.dtype).pow(-0.5).unsqueeze(-1)
        return norm * (lvl.aggregate(norm * x) + norm * x)

    def content(mask, x):  # x padded (B, N, F)
        scores = torch.tanh(moa.gcont.proj(x)) @ moa.gcont.content
        weights = torch.softmax(scores.masked_fill(~mask, -math.inf), 1)
        return (torch.nan_to_num(weights).unsqueeze(-1) * x).sum(1)

    counts = moa.cluster_counts(level.sizes)
    width = int(counts.max())
    clusters = torch.arange(width) < counts.unsqueeze(1)
    mix, hop = torch.softmax(moa.hop_logits, 0), h
    context = mix[0] * h
    for i in range(1, moa.hops + 1):
        hop = propagate(level, hop)
        context = context + mix[i] * hop
    keys = dense(moa.key(context))
    mask = level.mask.unsqueeze(-1)
    h_dense = dense(h) * mask
    before = content(level.mask, h_dense)
    mean = h_dense.sum(1) / level.sizes.clamp(min=1).unsqueeze(-1)
    guide = moa.guide(torch.cat([before, mean], -1))
    queries = moa.query(moa.seeds[:width] * (1 + guide.unsqueeze(1)))
    logits = keys @ queries.transpose(1, 2) / math.sqrt(h.shape[-1])
    logits = logits.masked_fill(~clusters.unsqueeze(1), -math.inf)
    member = torch.softmax(logits, dim=-1) * mask
    weights = (member + 1e-8) * mask
    weights = weights / weights.sum(1, keepdim=True).clamp(min=1e-12)
    rows = (weights.transpose(1, 2) @ h_dense) * clusters.unsqueeze(-1)
    packed = member if level.dense else member[level.mask]
    adj_member = dense(level.aggregate(packed))
    adj = member.transpose(1, 2) @ adj_member
    adj = adj * (clusters.unsqueeze(1) & clusters.unsqueeze(2))
    after = content(clusters, rows)
    stability = 1 - F.cosine_similarity(before, after, dim=-1, eps=1e-8)
    return adj, rows, stability.mean()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moa_matches_the_padded_reference(seed, dtype):
    """The optimised MOA (packed logits, K propagated columns, fused
    weighted means) computes the padded formulation's function.

    Coarse adjacency, rows and stability loss to 1e-5 (float32) or 1e-10
    (float64), and every gradient to that times its largest entry, on the
    sparse input level and on a packed coarse level. The guide steers the
    memberships: its gradient is of the order of the seeds' (an additive
    guide got only rounding noise, since a per-node shift of the logits
    does not change the softmax over super-nodes).
    """
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    model = make_model("hap", seed).train().to(dtype)
    graph, features = make_batch(seed=seed)
    level = GraphLevel.from_graph(graph, "cpu")
    h = torch.randn(graph.num_nodes(), HIDDEN, dtype=dtype,
                    generator=torch.Generator().manual_seed(seed))
    for moa, conv in zip(model.moas, model.convs, strict=True):
        results = []
        for forward in (moa, functools.partial(reference_moa, moa)):
            model.zero_grad()
            x = h.clone().requires_grad_()
            out = forward(level, x)
            adj = out[0].adj if isinstance(out[0], GraphLevel) else out[0]
            (adj.square().sum() + out[1].square().sum()
             + 100 * out[2]).backward()
            grads = {name: p.grad.clone() for name, p in
                     moa.named_parameters()}
            grads["h"] = x.grad
            rows = out[0].to_dense(out[1]) \
                if isinstance(out[0], GraphLevel) else out[1]
            results.append((adj, rows, out[2], grads))
        (adj, rows, loss, grads), ref = results
        torch.testing.assert_close(adj, ref[0], atol=tol, rtol=tol)
        torch.testing.assert_close(rows, ref[1], atol=tol, rtol=tol)
        torch.testing.assert_close(loss, ref[2], atol=tol, rtol=tol)
        scale = max(float(g.abs().max()) for g in ref[3].values())
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref[3][name], rtol=0,
                                       atol=tol * scale, msg=name)
        guide, seeds = (float(grads[n].abs().max())
                        for n in ("guide.weight", "seeds"))
        assert guide > 1e-3 * seeds, (guide, seeds)
        # The next MOA sees this one's packed level, with its rows.
        with torch.no_grad():
            level, rows, _ = moa(level, h)
            h = F.relu(conv(level, rows))
        assert not level.dense and h.shape == (int(level.sizes.sum()),
                                               HIDDEN)

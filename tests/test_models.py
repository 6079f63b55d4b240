"""Tests for hmgraph.models: layers, models and layer-wise inference."""

import copy
import re

import dgl
import dgl.nn.pytorch as dglnn
import numpy as np
import pytest
import torch

from hmgraph.cache.format import FeatureFileWriter
from hmgraph.models import (
    MODELS,
    GATConv,
    GCNConv,
    SAGEConv,
    blockops,
    build_model,
    layers,
    layerwise_inference,
)
from hmgraph.models.layers import (
    GCN_IN_DEGREE,
    GCN_OUT_DEGREE,
    add_gcn_degrees,
)

NUM_NODES = 300
NUM_EDGES = 1500
# Nodes 0 .. NUM_NO_IN_EDGES - 1 get no in-edges.
NUM_NO_IN_EDGES = 30
# Seeds mixing nodes with and without in-edges.
SEEDS = torch.cat([torch.arange(0, 6), torch.arange(100, 140)])

# name -> (layer kind, in_feats, out_feats, num_heads). GCNConv normalises
# by the graph's degrees with self-loops, so it is checked against DGL on
# the whole graph in test_gcn_layer_matches_graphconv_with_self_loops.
LAYER_CASES = {
    "sage-in>out": ("sage", 16, 8, 1),
    "sage-in<out": ("sage", 8, 16, 1),
    "gat-1head": ("gat", 12, 5, 1),
    "gat-3heads": ("gat", 12, 5, 3),
}
BLOCK_KINDS = ["sampled-outer", "sampled-inner", "full", "no-edges"]
MODEL_NAMES = sorted(MODELS)
FEATURE_KINDS = ["tensor", "numpy", "memmap"]

IN_FEATS, HIDDEN_FEATS, NUM_CLASSES, NUM_LAYERS = 12, 16, 5, 3


def make_graph(seed=0):
    """Seeded random graph; nodes below NUM_NO_IN_EDGES have no in-edges."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=gen)
    dst = torch.randint(NUM_NO_IN_EDGES, NUM_NODES, (NUM_EDGES,), generator=gen)
    return dgl.graph((src, dst), num_nodes=NUM_NODES)


def make_features(num_rows, num_feats, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, num_feats, generator=gen)


def make_block(graph, kind):
    """One block of the given kind, see BLOCK_KINDS."""
    if kind.startswith("sampled-"):
        _, blocks = sampled_blocks(graph, [5, 3])
        return blocks[0] if kind == "sampled-outer" else blocks[1]
    full = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    if kind == "full":
        return full.sample(graph, SEEDS)[2][0]
    assert kind == "no-edges"
    block = full.sample(graph, torch.arange(0, 10))[2][0]
    assert block.num_edges() == 0
    return block


def make_layer_pair(kind, in_feats, out_feats, num_heads):
    """A dgl.nn layer with random parameters and ours loaded from it."""
    torch.manual_seed(0)
    if kind == "sage":
        ref = dglnn.SAGEConv(in_feats, out_feats, "mean")
        ours = SAGEConv(in_feats, out_feats)
    elif kind == "gcn":
        ref = dglnn.GraphConv(
            in_feats, out_feats, norm="both", allow_zero_in_degree=True
        )
        ours = GCNConv(in_feats, out_feats)
    else:
        ref = dglnn.GATConv(
            in_feats, out_feats, num_heads, allow_zero_in_degree=True
        )
        ours = GATConv(in_feats, out_feats, num_heads)
    # Randomise everything, biases included, so no zero init hides a bug.
    with torch.no_grad():
        for param in ref.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def full_blocks(graph, num_layers):
    """Full-neighbour blocks over all nodes, and their input node ids."""
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(num_layers)
    input_nodes, output_nodes, blocks = sampler.sample(
        graph, torch.arange(graph.num_nodes())
    )
    assert torch.equal(output_nodes, torch.arange(graph.num_nodes()))
    return input_nodes, blocks


def sampled_blocks(graph, fanouts, fused=True):
    dgl.seed(0)
    sampler = dgl.dataloading.NeighborSampler(fanouts, fused=fused)
    input_nodes, _, blocks = sampler.sample(graph, SEEDS)
    return input_nodes, blocks


# ---------------------------------------------------------------- layers


@pytest.mark.parametrize("block_kind", BLOCK_KINDS)
@pytest.mark.parametrize(
    "case", list(LAYER_CASES.values()), ids=list(LAYER_CASES)
)
def test_layer_matches_dgl(case, block_kind):
    kind, in_feats, out_feats, num_heads = case
    graph = make_graph()
    block = make_block(graph, block_kind)
    ref, ours = make_layer_pair(kind, in_feats, out_feats, num_heads)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in ref.state_dict().items()
    }

    x = make_features(block.num_src_nodes(), in_feats)
    x_ref = x.clone().requires_grad_()
    x_ours = x.clone().requires_grad_()
    out_ref = ref(block, x_ref)
    out_ours = ours(block, x_ours)
    assert out_ours.shape == out_ref.shape
    assert (out_ours - out_ref).abs().max().item() < 1e-5
    _assert_same_gradients(ref, ours, out_ref, out_ours, x_ref, x_ours)


def _csr(num_dst, num_src, edges):
    """A ``(num_dst, num_src)`` CSR adjacency with ``edges`` entries."""
    dst = torch.arange(edges) % num_dst
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64),
                        torch.bincount(dst, minlength=num_dst).cumsum(0)])
    return torch.sparse_csr_tensor(indptr, torch.arange(edges) % num_src,
                                   torch.ones(edges), (num_dst, num_src))


@pytest.mark.parametrize("num_dst,num_src,edges,in_feats,out_feats,first", [
    # A whole graph: DGL's rule, project first where in > out.
    (100, 100, 500, 16, 8, True),
    (100, 100, 500, 8, 16, False),
    (100, 100, 500, 8, 8, False),
    # A sampled block of synth-igb-large's shape: 9x more src than dst
    # nodes; summing the 1024 features first is ~9x cheaper than DGL's
    # projection of every src row.
    (47_000, 430_000, 548_000, 1024, 256, False),
    # Nearly as many src as dst rows: projecting first still pays.
    (40_000, 41_000, 500_000, 1024, 256, True),
])
def test_a_layer_projects_on_the_cheaper_side(num_dst, num_src, edges,
                                              in_feats, out_feats, first):
    adjacency = _csr(num_dst, num_src, edges)
    assert blockops.projects_first(adjacency, in_feats, out_feats) is first


@pytest.mark.parametrize("first", [True, False], ids=["project", "sum"])
def test_sage_on_either_side_of_the_sum_matches_dgl(first, monkeypatch):
    """A wide input on a sampled block (more src than dst nodes): SAGEConv
    equals DGL's, gradients included, whether it projects or sums
    first."""
    block = make_block(make_graph(), "sampled-outer")
    assert block.num_src_nodes() > block.num_dst_nodes()
    monkeypatch.setattr(layers, "projects_first", lambda *_: first)
    ref, ours = make_layer_pair("sage", 32, 4, 1)
    x = make_features(block.num_src_nodes(), 32)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = ref(block, x_ref), ours(block, x_ours)
    assert (got - expected).abs().max().item() < 1e-5
    _assert_same_gradients(ref, ours, expected, got, x_ref, x_ours)


def test_gcn_on_either_side_of_the_sum_is_the_same(monkeypatch):
    """GCNConv projecting first and summing first: the same output."""
    graph = add_gcn_degrees(make_graph())
    block = make_block(graph, "sampled-outer")
    layer = GCNConv(32, 4)
    x = make_features(block.num_src_nodes(), 32)
    outputs = []
    for first in (True, False):
        monkeypatch.setattr(layers, "projects_first",
                            lambda *_, first=first: first)
        outputs.append(layer(block, x))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5,
                               rtol=1e-5)


def _assert_same_gradients(ref, ours, out_ref, out_ours, x_ref, x_ours):
    """Backpropagate one seeded output gradient through both layers; the
    input's and every parameter's gradients agree. They sum over many
    edges in a different order (DGL's CPU kernels use OpenMP), hence the
    looser tolerance than the outputs'."""
    grad_out = make_features(out_ref.numel(), 1, seed=1).view_as(out_ref)
    out_ref.backward(grad_out)
    out_ours.backward(grad_out)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-4, rtol=1e-4)
    ref_params = dict(ref.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(
            param.grad, ref_params[name].grad, atol=1e-4, rtol=1e-4
        )


def _randomise(ref, ours):
    with torch.no_grad():
        for param in ref.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
    ours.load_state_dict(ref.state_dict())


def _full_graph_case(chunks, fanout=-1):
    """Blocks over ``chunks`` (seed tensors) of make_graph(), with the
    graph's GCN degrees; fanout -1 takes all neighbours."""
    graph = add_gcn_degrees(make_graph())
    sampler = dgl.dataloading.NeighborSampler([fanout])
    return graph, [sampler.sample(graph, seeds) for seeds in chunks]


@pytest.mark.parametrize("fanout", [-1, 1000])
@pytest.mark.parametrize("in_feats,out_feats", [(16, 8), (8, 16)])
@pytest.mark.parametrize("rescale", [False, True])
def test_gcn_layer_matches_graphconv_with_self_loops(
    in_feats, out_feats, fanout, rescale
):
    """On blocks holding every in-edge of their dst nodes (full
    neighbours, or a fanout above every degree), GCNConv is Kipf &
    Welling's layer on the whole graph: DGL's GraphConv(norm="both") on
    dgl.add_self_loop(graph), chunk by chunk, gradients included."""
    chunks = torch.arange(NUM_NODES).split(70)
    graph, samples = _full_graph_case(chunks, fanout)
    torch.manual_seed(0)
    ref = dglnn.GraphConv(in_feats, out_feats, norm="both")
    ours = GCNConv(in_feats, out_feats, rescale=rescale)
    _randomise(ref, ours)
    x = make_features(NUM_NODES, in_feats)
    x_ref = x.clone().requires_grad_()
    x_ours = x.clone().requires_grad_()
    expected = ref(dgl.add_self_loop(graph), x_ref)
    got = torch.cat([ours(blocks[0], x_ours[input_nodes])
                     for input_nodes, _, blocks in samples])
    assert (got - expected).abs().max().item() < 1e-5
    _assert_same_gradients(ref, ours, expected, got, x_ref, x_ours)


def test_gcn_degrees_are_the_graphs_in_sampled_blocks():
    """Sampled blocks carry the graph's degrees, not their own."""
    graph = add_gcn_degrees(make_graph())
    _, blocks = sampled_blocks(graph, [2, 2])
    for block in blocks:
        ids = block.dstdata[dgl.NID].long()
        assert torch.equal(block.dstdata[GCN_IN_DEGREE],
                           graph.in_degrees(ids).float())
        src_ids = block.srcdata[dgl.NID].long()
        assert torch.equal(block.srcdata[GCN_OUT_DEGREE],
                           graph.out_degrees(src_ids).float())
        assert not torch.equal(block.dstdata[GCN_IN_DEGREE],
                               block.in_degrees().float())


def test_gcn_layer_rescales_sampled_sums():
    """rescale multiplies a dst node's sampled neighbour sum by its graph
    degree over its sampled in-edges (the self-loop term stays)."""
    graph = add_gcn_degrees(make_graph())
    _, blocks = sampled_blocks(graph, [2])
    block = blocks[0]
    torch.manual_seed(0)
    plain = GCNConv(4, 4, bias=False, rescale=False)
    scaled = GCNConv(4, 4, bias=False, rescale=True)
    scaled.load_state_dict(plain.state_dict())
    x = make_features(block.num_src_nodes(), 4)
    num_dst = block.num_dst_nodes()
    norm_src = (block.srcdata[GCN_OUT_DEGREE] + 1).pow(-0.5)
    norm_dst = (block.dstdata[GCN_IN_DEGREE] + 1).pow(-0.5)
    self_term = (x[:num_dst] * (norm_src[:num_dst] * norm_dst)[:, None]) \
        @ plain.weight
    degree, sampled = block.dstdata[GCN_IN_DEGREE], block.in_degrees().float()
    with torch.no_grad():
        neigh = plain(block, x) - self_term
        want = self_term + neigh * (degree / sampled.clamp(min=1))[:, None]
        torch.testing.assert_close(scaled(block, x), want)
    assert (degree > sampled).any()  # the case is not trivial


def test_gat_self_loop_matches_dgl_with_self_loops():
    """GATConv(self_loop=True) on full-neighbour blocks equals DGL's
    GATConv on the graph with exactly one self-loop per node."""
    chunks = torch.arange(NUM_NODES).split(100)
    graph = make_graph()
    graph.add_edges(torch.arange(5), torch.arange(5))  # existing loops
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    torch.manual_seed(0)
    ref = dglnn.GATConv(12, 5, 3)
    ours = GATConv(12, 5, 3, self_loop=True)
    _randomise(ref, ours)
    x = make_features(NUM_NODES, 12)
    with torch.no_grad():
        expected = ref(dgl.add_self_loop(dgl.remove_self_loop(graph)), x)
        got = torch.cat([ours(blocks[0], x[input_nodes]) for input_nodes,
                         _, blocks in (sampler.sample(graph, seeds)
                                       for seeds in chunks)])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_input_dropout_applies_before_the_first_layer():
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    blocks, x = _blocks_and_x(graph, feats, [4, 3, 2])
    torch.manual_seed(0)
    model = build_model("gcn", IN_FEATS, HIDDEN_FEATS, NUM_CLASSES,
                        num_layers=NUM_LAYERS, dropout=0.0,
                        input_dropout=0.5).train()
    torch.manual_seed(1)
    got = model(blocks, x)
    torch.manual_seed(1)
    h = torch.nn.functional.dropout(x, 0.5)
    for i, block in enumerate(blocks):
        h = model.layers[i](block, h)
        if i != NUM_LAYERS - 1:
            h = h.relu()
    torch.testing.assert_close(got, h)
    model.eval()  # no dropout at inference
    assert not torch.equal(model(blocks, x), got)
    with pytest.raises(ValueError, match="input_dropout must be in"):
        build_model("gcn", IN_FEATS, HIDDEN_FEATS, NUM_CLASSES,
                    input_dropout=1.0)


def test_layer_rejects_wrong_feature_rows():
    graph = make_graph()
    block = make_block(graph, "full")
    layer = SAGEConv(4, 3)
    with pytest.raises(ValueError, match="num_src_nodes"):
        layer(block, torch.zeros(block.num_src_nodes() + 1, 4))


# ---------------------------------------------------------------- models


def make_model(name, num_layers=NUM_LAYERS, dropout=0.5):
    torch.manual_seed(0)
    return build_model(
        name,
        IN_FEATS,
        HIDDEN_FEATS,
        NUM_CLASSES,
        num_layers=num_layers,
        dropout=dropout,
        num_heads=4,
    )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_logits_shape(name):
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    input_nodes, blocks = sampled_blocks(graph, [4, 3, 2])
    model = make_model(name)
    assert len(model.layers) == NUM_LAYERS
    model.train()
    logits = model(blocks, feats[input_nodes])
    assert logits.shape == (len(SEEDS), NUM_CLASSES)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_is_loop_of_forward_layer(name):
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    input_nodes, blocks = sampled_blocks(graph, [4, 3, 2])
    model = make_model(name).eval()
    with torch.no_grad():
        expected = model(blocks, feats[input_nodes])
        h = feats[input_nodes]
        for i, block in enumerate(blocks):
            h = model.forward_layer(i, block, h)
    assert torch.equal(h, expected)


def test_mlp_ignores_edges():
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    model = make_model("mlp").eval()
    # DGL 2.1's fused sampler drops all src nodes when the fanout is 0.
    no_edges_blocks = _blocks_and_x(graph, feats, [0] * NUM_LAYERS, fused=False)
    with torch.no_grad():
        no_edges = model(*no_edges_blocks)
        sampled = model(*_blocks_and_x(graph, feats, [4, 3, 2]))
        h = feats[SEEDS]
        for layer in model.layers[:-1]:
            h = layer(h).relu()
        plain = model.layers[-1](h)
    torch.testing.assert_close(no_edges, plain)
    torch.testing.assert_close(sampled, plain)


def _blocks_and_x(graph, feats, fanouts, fused=True):
    input_nodes, blocks = sampled_blocks(graph, fanouts, fused=fused)
    return blocks, feats[input_nodes]


@pytest.mark.parametrize("feature_kind", FEATURE_KINDS)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_layerwise_inference_matches_full_blocks(name, feature_kind, tmp_path):
    graph = add_gcn_degrees(make_graph())
    feats = make_features(NUM_NODES, IN_FEATS)
    model = make_model(name)
    model.eval()
    input_nodes, blocks = full_blocks(graph, NUM_LAYERS)
    with torch.no_grad():
        expected = model(blocks, feats[input_nodes])

    if feature_kind == "tensor":
        features = feats
    elif feature_kind == "numpy":
        features = feats.numpy()
    else:
        path = tmp_path / "feats.npy"
        np.save(path, feats.numpy())
        features = np.load(path, mmap_mode="r")
    # GCN normalises by the graph's degrees, which every chunk's block
    # carries, so several chunks give the full graph's result.
    model.train()
    logits = layerwise_inference(model, graph, features, batch_size=128)
    assert model.training, "train mode must be restored"
    assert logits.device.type == "cpu"
    assert logits.shape == (NUM_NODES, NUM_CLASSES)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_layerwise_inference_writes_hidden_layers_to_scratch(name, tmp_path):
    """Hidden layers through feature files in ``scratch`` (read back with
    O_DIRECT): the same logits, nothing left behind, also on an error."""
    graph = add_gcn_degrees(make_graph())
    feats = make_features(NUM_NODES, IN_FEATS)
    model = make_model(name).eval()
    expected = layerwise_inference(model, graph, feats, batch_size=128)
    written = []
    real = FeatureFileWriter.write

    def spy(writer, rows):
        written.append(writer.shape)
        return real(writer, rows)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FeatureFileWriter, "write", spy)
        logits = layerwise_inference(model, graph, feats, batch_size=128,
                                     scratch=tmp_path)
    # (equal up to the BLAS kernels' rounding, which follows alignment)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-6)
    # One file per hidden layer, written in chunks of 128 nodes.
    assert len(written) == (NUM_LAYERS - 1) * -(-NUM_NODES // 128)
    assert list(tmp_path.iterdir()) == []
    # A layer failing halfway: its file and the finished ones removed.
    forward, calls = model.forward_layer, []

    def fail_in_layer_one(i, block, h):
        calls.append(i)
        if calls.count(1) == 2:
            raise RuntimeError("layer 1 failed")
        return forward(i, block, h)

    model.forward_layer = fail_in_layer_one
    model.train()
    with pytest.raises(RuntimeError, match="layer 1 failed"):
        layerwise_inference(model, graph, feats, batch_size=128,
                            scratch=tmp_path)
    assert model.training
    assert list(tmp_path.iterdir()) == []


def test_layerwise_inference_keeps_eval_mode_and_shows_progress():
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    model = make_model("mlp").eval()
    logits = layerwise_inference(
        model, graph, feats, batch_size=128, progress=True
    )
    assert not model.training
    assert logits.shape == (NUM_NODES, NUM_CLASSES)


def test_layerwise_inference_rejects_bad_features():
    graph = make_graph()
    model = make_model("mlp")
    with pytest.raises(ValueError, match="num_nodes=300"):
        layerwise_inference(model, graph, torch.zeros(NUM_NODES - 1, IN_FEATS))
    with pytest.raises(TypeError, match="list"):
        layerwise_inference(model, graph, [[0.0] * IN_FEATS] * NUM_NODES)
    with pytest.raises(ValueError, match="batch_size"):
        layerwise_inference(
            model, graph, torch.zeros(NUM_NODES, IN_FEATS), batch_size=0
        )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_rejects_wrong_feature_rows(name):
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    blocks, x = _blocks_and_x(graph, feats, [4, 3, 2])
    with pytest.raises(ValueError, match="num_src_nodes"):
        make_model(name)(blocks, x[:-1])


def test_build_model_unknown_name_lists_available():
    with pytest.raises(
        ValueError, match=re.escape("available: gat, gcn, mlp, sage")
    ):
        build_model("gin", IN_FEATS, HIDDEN_FEATS, NUM_CLASSES)


def test_gat_rejects_hidden_not_multiple_of_heads():
    with pytest.raises(ValueError, match="hidden_feats=10"):
        build_model("gat", IN_FEATS, 10, NUM_CLASSES, num_heads=4)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_rejects_wrong_number_of_blocks(name):
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    blocks, x = _blocks_and_x(graph, feats, [4, 3])
    with pytest.raises(ValueError, match="expected 3 blocks"):
        make_model(name)(blocks, x)


# ---------------------------------------------------------------- GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_on_cuda_matches_cpu(name):
    graph = make_graph()
    feats = make_features(NUM_NODES, IN_FEATS)
    blocks, x = _blocks_and_x(graph, feats, [4, 3, 2])
    model_cpu = make_model(name, dropout=0.0)
    model_gpu = copy.deepcopy(model_cpu).to("cuda")

    # Forward and backward in train mode (no dropout, so deterministic).
    out_cpu = model_cpu(blocks, x)
    out_gpu = model_gpu(blocks, x.to("cuda"))
    assert out_gpu.device.type == "cuda"
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=1e-4)
    out_cpu.square().sum().backward()
    out_gpu.square().sum().backward()
    gpu_params = dict(model_gpu.named_parameters())
    for param_name, param in model_cpu.named_parameters():
        torch.testing.assert_close(
            gpu_params[param_name].grad.cpu(), param.grad, atol=1e-4, rtol=1e-4
        )

    # Layer-wise inference on the device.
    expected = layerwise_inference(model_cpu, graph, feats, batch_size=128)
    logits = layerwise_inference(
        model_gpu, graph, feats, device="cuda", batch_size=128
    )
    assert logits.device.type == "cpu"
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)

"""Tests for hmgraph.models: layers, models and layer-wise inference."""

import copy
import re

import dgl
import dgl.nn.pytorch as dglnn
import numpy as np
import pytest
import torch

from hmgraph.models import (
    MODELS,
    GATConv,
    GCNConv,
    SAGEConv,
    build_model,
    layerwise_inference,
)

NUM_NODES = 300
NUM_EDGES = 1500
# Nodes 0 .. NUM_NO_IN_EDGES - 1 get no in-edges.
NUM_NO_IN_EDGES = 30
# Seeds mixing nodes with and without in-edges.
SEEDS = torch.cat([torch.arange(0, 6), torch.arange(100, 140)])

# name -> (layer kind, in_feats, out_feats, num_heads)
LAYER_CASES = {
    "sage-in>out": ("sage", 16, 8, 1),
    "sage-in<out": ("sage", 8, 16, 1),
    "gcn-in>out": ("gcn", 16, 8, 1),
    "gcn-in<out": ("gcn", 8, 16, 1),
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

    # Gradients agree too, for the input and every parameter. They sum over
    # many edges in a different order (DGL's CPU kernels use OpenMP), hence
    # the looser tolerance.
    grad_out = make_features(out_ref.numel(), 1, seed=1).view_as(out_ref)
    out_ref.backward(grad_out)
    out_ours.backward(grad_out)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-4, rtol=1e-4)
    ref_params = dict(ref.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(
            param.grad, ref_params[name].grad, atol=1e-4, rtol=1e-4
        )


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
    graph = make_graph()
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
    # GCN normalises by the degrees of each block's own edges (as DGL
    # does), so its layer-wise result equals the full graph's only when one
    # chunk holds every node; the others are checked with several chunks.
    batch_size = NUM_NODES if name == "gcn" else 128
    model.train()
    logits = layerwise_inference(model, graph, features, batch_size=batch_size)
    assert model.training, "train mode must be restored"
    assert logits.device.type == "cpu"
    assert logits.shape == (NUM_NODES, NUM_CLASSES)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


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

"""GNN layers and models over DGL blocks, and layer-wise inference."""

from .gnn import GAT, GCN, MLP, MODELS, GraphSAGE, build_model
from .inference import layerwise_inference
from .layers import GATConv, GCNConv, SAGEConv
from .pooling import (
    GIN,
    HAP,
    POOLING_MODELS,
    DiffPool,
    GraphLevel,
    SAGPool,
    TopKPool,
    build_pooling_model,
    to_dense_batch,
)

__all__ = [
    "SAGEConv",
    "GCNConv",
    "GATConv",
    "GraphSAGE",
    "GCN",
    "GAT",
    "MLP",
    "MODELS",
    "build_model",
    "layerwise_inference",
    "HAP",
    "GIN",
    "TopKPool",
    "SAGPool",
    "DiffPool",
    "GraphLevel",
    "to_dense_batch",
    "POOLING_MODELS",
    "build_pooling_model",
]

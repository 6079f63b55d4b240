"""GNN layers and models over DGL blocks, and layer-wise inference."""

from .gnn import GAT, GCN, MLP, MODELS, GraphSAGE, build_model
from .hap import HAP
from .hierarchy import GraphLevel, to_dense_batch
from .inference import layerwise_inference
from .layers import GATConv, GCNConv, SAGEConv
from .pooling import (
    GIN,
    POOLING_MODELS,
    DiffPool,
    SAGPool,
    TopKPool,
    build_pooling_model,
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

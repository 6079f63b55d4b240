"""GNN layers and models over DGL blocks, and layer-wise inference."""

from .gnn import GAT, GCN, MLP, MODELS, GraphSAGE, build_model
from .inference import layerwise_inference
from .layers import GATConv, GCNConv, SAGEConv

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
]

"""Node classification models over DGL blocks, and a registry to build them.

Every model has the same constructor, ``(in_feats, hidden_feats,
num_classes, num_layers=3, dropout=0.5, num_heads=4, input_dropout=0.0,
attn_dropout=0.0)``, a ``layers``
``nn.ModuleList`` with one entry per hop, ``forward(blocks, x)`` for
mini-batch training and ``forward_layer(i, block, h)`` for layer-wise
inference; ``forward`` is a loop over ``forward_layer``.
"""

import numbers

import torch.nn.functional as F
from torch import nn

from .layers import GATConv, GCNConv, SAGEConv

__all__ = ["GraphSAGE", "GCN", "GAT", "MLP", "MODELS", "build_model"]


class _BlockModel(nn.Module):
    """Shared constructor checks and the forward loop.

    Subclasses fill ``self.layers`` and implement ``_apply_layer``.

    Parameters
    ----------
    in_feats : int
        Input feature size.
    hidden_feats : int
        Hidden feature size (the width of every hidden layer's output).
    num_classes : int
        Number of output classes.
    num_layers : int, optional
        Number of layers, i.e. hops; ``forward`` takes this many blocks.
        Default: ``3``.
    dropout : float, optional
        Dropout rate after each hidden layer's activation. Default: ``0.5``.
    num_heads : int, optional
        Attention heads, used by ``GAT`` only. Default: ``4``.
    input_dropout : float, optional
        Dropout rate on the input features, before the first layer, as
        Kipf & Welling's GCN and the GAT paper use on Planetoid. Default:
        ``0.0``.
    attn_dropout : float, optional
        Dropout rate on the attention weights, used by ``GAT`` only.
        Default: ``0.0``.
    """

    #: Activation after each hidden layer.
    activation = staticmethod(F.relu)

    def __init__(
        self,
        in_feats,
        hidden_feats,
        num_classes,
        num_layers=3,
        dropout=0.5,
        num_heads=4,
        input_dropout=0.0,
        attn_dropout=0.0,
    ):
        super().__init__()
        for name, value in [
            ("in_feats", in_feats),
            ("hidden_feats", hidden_feats),
            ("num_classes", num_classes),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
        ]:
            if not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(
                    f"{name} must be a positive int; got {value!r}"
                )
        for name, value in [
            ("dropout", dropout),
            ("input_dropout", input_dropout),
            ("attn_dropout", attn_dropout),
        ]:
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1); got {value!r}")
        self.in_feats = int(in_feats)
        self.hidden_feats = int(hidden_feats)
        self.num_classes = int(num_classes)
        self.num_layers = int(num_layers)
        self.dropout = nn.Dropout(dropout)
        self.input_dropout = nn.Dropout(input_dropout)
        self.attn_dropout = float(attn_dropout)
        self.layers = nn.ModuleList()

    def _layer_dims(self):
        """Return ``(in, out)`` sizes of each layer, input to output."""
        dims = [self.in_feats]
        dims += [self.hidden_feats] * (self.num_layers - 1)
        dims += [self.num_classes]
        return list(zip(dims[:-1], dims[1:], strict=True))

    def _apply_layer(self, i, block, h):
        """Run layer ``i`` alone, without activation or dropout."""
        raise NotImplementedError

    def forward_layer(self, i, block, h):
        """Run layer ``i`` including its activation and dropout.

        Layer 0 first applies the input dropout to ``h`` (in training mode).

        Parameters
        ----------
        i : int
            Layer index in ``[0, num_layers)``.
        block : dgl.DGLGraph
            The DGL block for this hop, on the CPU.
        h : torch.Tensor
            Features of the block's source nodes, shape
            ``(block.num_src_nodes(), width of layer i's input)``, on any
            device.

        Returns
        -------
        torch.Tensor
            Shape ``(block.num_dst_nodes(), hidden_feats)`` for hidden
            layers (after the activation and dropout) or
            ``(block.num_dst_nodes(), num_classes)`` logits for the last
            layer, on ``h.device``.
        """
        if not 0 <= i < self.num_layers:
            raise ValueError(
                f"layer index must be in [0, {self.num_layers}); got {i!r}"
            )
        if i == 0:
            h = self.input_dropout(h)
        h = self._apply_layer(i, block, h)
        if i != self.num_layers - 1:
            h = self.dropout(self.activation(h))
        return h

    def forward(self, blocks, x):
        """Compute logits for the dst nodes of the last block.

        Parameters
        ----------
        blocks : list of dgl.DGLGraph
            ``num_layers`` DGL blocks on the CPU, input hop first; layer
            ``i`` consumes ``blocks[i]``.
        x : torch.Tensor
            Features of ``blocks[0]``'s source nodes, shape
            ``(blocks[0].num_src_nodes(), in_feats)``, on any device.

        Returns
        -------
        torch.Tensor
            Logits of shape ``(blocks[-1].num_dst_nodes(), num_classes)``,
            on ``x.device``.
        """
        if len(blocks) != self.num_layers:
            raise ValueError(
                f"expected {self.num_layers} blocks, one per layer; "
                f"got {len(blocks)}"
            )
        h = x
        for i, block in enumerate(blocks):
            h = self.forward_layer(i, block, h)
        return h


class _ConvStack(_BlockModel):
    """A stack of one convolution class, applied as is to each block."""

    conv: type

    def __init__(
        self,
        in_feats,
        hidden_feats,
        num_classes,
        num_layers=3,
        dropout=0.5,
        num_heads=4,
        input_dropout=0.0,
        attn_dropout=0.0,
    ):
        super().__init__(
            in_feats, hidden_feats, num_classes, num_layers, dropout,
            num_heads, input_dropout, attn_dropout,
        )
        for d_in, d_out in self._layer_dims():
            self.layers.append(self.conv(d_in, d_out))

    def _apply_layer(self, i, block, h):
        return self.layers[i](block, h)


class GraphSAGE(_ConvStack):
    """GraphSAGE with mean aggregation. See `_BlockModel` for parameters."""

    conv = SAGEConv


class GCN(_ConvStack):
    """GCN of Kipf & Welling (2017). See `_BlockModel` for parameters.

    Each layer is a `GCNConv`: ``A + I`` normalised symmetrically by the
    graph's degrees, which the blocks carry once `add_gcn_degrees` has run
    on the graph they are sampled from (``hmgraph train`` does this).
    With full-neighbour blocks the model equals a full-graph GCN.
    """

    conv = GCNConv


class GAT(_BlockModel):
    """Graph attention network. See `_BlockModel` for parameters.

    As in the GAT paper (Velickovic et al., 2018): each node attends to its
    sampled neighbours and itself (`GATConv` with ``self_loop=True``),
    hidden layers use ELU, and ``attn_dropout`` drops attention weights.
    Hidden layers have ``num_heads`` heads of ``hidden_feats // num_heads``
    features each, concatenated to ``hidden_feats``; the last layer has
    ``num_heads`` heads of ``num_classes`` features, averaged.

    Raises
    ------
    ValueError
        If ``hidden_feats`` is not a multiple of ``num_heads``.
    """

    def __init__(
        self,
        in_feats,
        hidden_feats,
        num_classes,
        num_layers=3,
        dropout=0.5,
        num_heads=4,
        input_dropout=0.0,
        attn_dropout=0.0,
    ):
        super().__init__(
            in_feats, hidden_feats, num_classes, num_layers, dropout,
            num_heads, input_dropout, attn_dropout,
        )
        if hidden_feats % num_heads != 0:
            raise ValueError(
                f"hidden_feats={hidden_feats} must be a multiple of "
                f"num_heads={num_heads}"
            )
        self.num_heads = int(num_heads)
        for i, (d_in, d_out) in enumerate(self._layer_dims()):
            if i != self.num_layers - 1:
                d_out //= self.num_heads
            self.layers.append(GATConv(d_in, d_out, self.num_heads,
                                       attn_drop=self.attn_dropout,
                                       self_loop=True))

    activation = staticmethod(F.elu)

    def _apply_layer(self, i, block, h):
        h = self.layers[i](block, h)
        if i == self.num_layers - 1:
            return h.mean(dim=1)
        return h.flatten(1)


class MLP(_ConvStack):
    """Multi-layer perceptron that ignores the graph's edges.

    It takes blocks like the GNNs, so any sampler works (for example
    ``dgl.dataloading.NeighborSampler([0] * num_layers, fused=False)``):
    layer ``i`` maps the rows of the dst nodes, ``h[:block.num_dst_nodes()]``,
    through a ``nn.Linear``. See `_BlockModel` for parameters.

    Notes
    -----
    In DGL 2.1.0 the default fused ``NeighborSampler`` returns blocks
    without any source nodes when the fanout is 0; pass ``fused=False``.
    """

    conv = nn.Linear

    def _apply_layer(self, i, block, h):
        if h.shape[0] != block.num_src_nodes():
            raise ValueError(
                f"h must have num_src_nodes={block.num_src_nodes()} rows; "
                f"got {h.shape[0]}"
            )
        return self.layers[i](h[: block.num_dst_nodes()])


MODELS = {"sage": GraphSAGE, "gcn": GCN, "gat": GAT, "mlp": MLP}


def build_model(
    name,
    in_feats,
    hidden_feats,
    num_classes,
    num_layers=3,
    dropout=0.5,
    num_heads=4,
    input_dropout=0.0,
    attn_dropout=0.0,
):
    """Build a model from the `MODELS` registry by name.

    Parameters
    ----------
    name : str
        One of ``"gat"``, ``"gcn"``, ``"mlp"``, ``"sage"``.
    in_feats, hidden_feats, num_classes, num_layers, dropout, num_heads
        Passed to the model's constructor; see `GraphSAGE`.
    input_dropout, attn_dropout : float, optional
        Passed to the model's constructor; see `GraphSAGE`.

    Returns
    -------
    torch.nn.Module
        The new model, with parameters on the CPU.

    Raises
    ------
    ValueError
        If ``name`` is not in `MODELS`; the message lists the available
        names.

    Examples
    --------
    >>> model = build_model("sage", 100, 256, 47, num_layers=3)
    >>> len(model.layers)
    3
    """
    if name not in MODELS:
        available = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; available: {available}")
    return MODELS[name](
        in_feats,
        hidden_feats,
        num_classes,
        num_layers=num_layers,
        dropout=dropout,
        num_heads=num_heads,
        input_dropout=input_dropout,
        attn_dropout=attn_dropout,
    )

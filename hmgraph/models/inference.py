"""Layer-wise full-neighbour inference over all nodes of a graph.

Sampled mini-batch inference recomputes shared neighbours at every hop and
is noisy. As in DGL's ogbn-products examples, layer-wise inference instead
computes layer ``i`` for every node, one chunk of nodes at a time, with the
full one-hop neighbourhood, before moving to layer ``i + 1``. Each node's
representation is computed once per layer, and only two layers' outputs are
held in CPU memory at any time; or, given a ``scratch`` folder, none: each
hidden layer's outputs are written there, chunk by chunk, as a feature
file (in a temporary folder removed on return) and the next layer reads
its rows back through the storage tier (`hmgraph.cache.StorageFeature`),
as the input features are; host memory holds the chunks in flight and the
logits (on synth-igb, 1 million nodes of hidden width 256: 2 GB less).

`GCNConv` normalises by the graph's degrees, which the blocks carry once
`hmgraph.models.layers.add_gcn_degrees` has run on the graph; a GCN then
equals one full-graph pass at any chunk size. Without them it falls back
to each block's own degrees, which depend on the chunk.
"""

import os
import tempfile
from pathlib import Path

import dgl
import numpy as np
import torch
from tqdm.auto import tqdm

from hmgraph.cache.feature import Feature
from hmgraph.cache.format import FeatureFileWriter
from hmgraph.cache.storage import StorageFeature

__all__ = ["layerwise_inference"]


def _gather_rows(features, ids):
    """Return ``features[ids]`` as a CPU torch tensor.

    Parameters
    ----------
    features : torch.Tensor or numpy.ndarray
        A 2-D CPU tensor or a NumPy array / ``np.memmap``.
    ids : torch.Tensor
        Row ids on the CPU, shape ``(n,)``, without duplicates.

    Returns
    -------
    torch.Tensor
        Shape ``(n, features.shape[1])``, on the CPU, in the order of
        ``ids``.
    """
    if isinstance(features, torch.Tensor):
        return features.index_select(0, ids.to(torch.int64))
    if isinstance(features, Feature):  # e.g. the storage tier, a cache
        return features.read(ids)
    # Read a NumPy array (possibly a memmap) in ascending row order, which
    # keeps disk reads sequential, then put the rows back in ``ids`` order.
    ids = ids.numpy()
    order = np.argsort(ids, kind="stable")
    sorted_rows = torch.from_numpy(np.asarray(features[ids[order]]))
    rows = torch.empty_like(sorted_rows)
    rows[torch.from_numpy(order)] = sorted_rows
    return rows


def _check_arguments(graph, features, batch_size: int) -> None:
    """Raise if ``features`` cannot be the node features of ``graph``, the
    graph has no nodes or ``batch_size`` is not positive."""
    if not isinstance(features, (torch.Tensor, np.ndarray, Feature)):
        raise TypeError(
            "features must be a torch.Tensor, a numpy array or an "
            f"hmgraph.cache.Feature; got {type(features).__name__}"
        )
    if isinstance(features, torch.Tensor) and features.device.type != "cpu":
        raise ValueError(
            f"features must be on the CPU; got device {features.device}"
        )
    if len(features.shape) != 2 or features.shape[0] != graph.num_nodes():
        raise ValueError(
            f"features must have shape (num_nodes={graph.num_nodes()}, "
            f"in_feats); got {tuple(features.shape)}"
        )
    if graph.num_nodes() == 0:
        raise ValueError("graph has no nodes")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive; got {batch_size!r}")


def layerwise_inference(
    model, graph, features, device="cpu", batch_size=4096, progress=False,
    scratch=None,
):
    """Compute the logits of every node with full neighbourhoods.

    For each layer ``i`` of ``model`` and each chunk of ``batch_size`` node
    ids, this builds the one-hop full-neighbour block with
    ``dgl.dataloading.MultiLayerFullNeighborSampler(1)``, gathers the
    previous layer's rows of the block's input nodes, moves them to
    ``device`` and runs ``model.forward_layer(i, block, h)``. Outputs are
    written into a preallocated CPU tensor (or, given ``scratch``, a
    feature file); only the previous and the current layer's outputs are
    kept.

    The model runs in eval mode under ``torch.no_grad()``; its mode is
    restored on return, also on an error.

    Parameters
    ----------
    model : torch.nn.Module
        A model with ``layers`` (one entry per hop) and
        ``forward_layer(i, block, h)``, such as those in `MODELS`, with its
        parameters on ``device``.
    graph : dgl.DGLGraph
        A homogeneous graph on the CPU.
    features : torch.Tensor, numpy.ndarray or hmgraph.cache.Feature
        Rows ``(graph.num_nodes(), in_feats)``, cast to the model's dtype:
        a CPU tensor, a NumPy array or ``np.memmap``, or a `Feature` (the
        storage tier, a loader's cache's `FrozenView`: only each chunk's
        input rows are ever in memory).
    device : str or torch.device, optional
        Where each layer is computed. Default: ``"cpu"``.
    batch_size : int, optional
        Number of output nodes per block. Default: ``4096``.
    progress : bool, optional
        Whether to show a tqdm progress bar per layer. Default: ``False``.
    scratch : str or os.PathLike, optional
        A folder on disk for the hidden layers' outputs, read back with
        ``O_DIRECT`` (see the module); None (default) keeps them in memory.

    Returns
    -------
    torch.Tensor
        Logits of shape ``(graph.num_nodes(), num_classes)``, on the CPU,
        row ``v`` for node ``v``.

    Raises
    ------
    TypeError
        If ``features`` is neither a torch tensor nor a NumPy array.
    ValueError
        If ``features`` has the wrong shape or is not on the CPU, if the
        graph has no nodes, or if ``batch_size`` is not positive.

    Notes
    -----
    A GCN equals one full-graph pass at any ``batch_size`` once
    `hmgraph.models.layers.add_gcn_degrees` has run on ``graph`` (module).

    Examples
    --------
    >>> model = build_model("sage", feats.shape[1], 256, 47).to("cuda")
    >>> logits = layerwise_inference(model, graph, feats, device="cuda")
    >>> pred = logits.argmax(dim=1)
    """
    _check_arguments(graph, features, batch_size)
    device = torch.device(device)
    was_training = model.training
    try:
        model.eval()
        with _Outputs(scratch, graph.num_nodes()) as outputs, \
                torch.no_grad():
            return _layers(model, graph, features, outputs, device,
                           batch_size, progress)
    finally:
        model.train(was_training)


def _layers(model, graph, features, outputs, device, batch_size, progress):
    """Every layer in turn over every chunk; the last layer's outputs."""
    num_nodes = graph.num_nodes()
    dtype = next(model.parameters()).dtype
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    h_prev = features
    for i in range(len(model.layers)):
        h_next = outputs.layer(i == len(model.layers) - 1)
        starts = tqdm(range(0, num_nodes, batch_size), desc=f"layer {i}",
                      disable=not progress)
        for start in starts:
            seeds = torch.arange(start, min(start + batch_size, num_nodes),
                                 dtype=graph.idtype)
            # (1) One-hop full-neighbour block of this chunk.
            input_nodes, _, blocks = sampler.sample(graph, seeds)
            # (2) Previous layer's rows of the input nodes.
            h = _gather_rows(h_prev, input_nodes).to(device=device,
                                                     dtype=dtype)
            # (3) This layer, written back to the CPU output.
            h_next.write(start, model.forward_layer(i, blocks[0], h).cpu())
        h_prev = h_next.finish()
    return h_prev


class _Outputs:
    """Where each layer's outputs go: a tensor in memory, or for hidden
    layers given a scratch folder, a feature file there (one folder per
    call, removed on exit with every file in it)."""

    def __init__(self, scratch, num_nodes: int):
        self.scratch = scratch
        self.num_nodes = num_nodes
        self.folder = None
        self.on_disk = []

    def __enter__(self):
        if self.scratch is not None:
            self.folder = tempfile.TemporaryDirectory(
                prefix="hmgraph-layers-", dir=os.fspath(self.scratch))
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.on_disk:
            layer.close()
        if self.folder is not None:
            self.folder.cleanup()

    def layer(self, last: bool):
        """The next layer's output: in memory for the last layer (the
        logits) or without a scratch folder, else on disk."""
        if last or self.folder is None:
            return _InMemory(self.num_nodes)
        path = Path(self.folder.name) / f"layer-{len(self.on_disk)}.bin"
        self.on_disk.append(_OnDisk(path, self.num_nodes))
        return self.on_disk[-1]


class _InMemory:
    """A layer's outputs in one CPU tensor, allocated at the first
    chunk (its width is the layer's)."""

    def __init__(self, num_nodes: int):
        self.num_nodes = num_nodes
        self.rows = None

    def write(self, start: int, out: torch.Tensor) -> None:
        if self.rows is None:
            self.rows = torch.empty((self.num_nodes, *out.shape[1:]),
                                    dtype=out.dtype)
        self.rows[start:start + len(out)] = out

    def finish(self) -> torch.Tensor:
        return self.rows


class _OnDisk:
    """A layer's outputs written in node order to a feature file, then
    read through the storage tier."""

    def __init__(self, path: Path, num_nodes: int):
        self.path = path
        self.num_nodes = num_nodes
        self.writer = None
        self.feature = None

    def write(self, start: int, out: torch.Tensor) -> None:
        if self.writer is None:
            self.writer = FeatureFileWriter(
                self.path, (self.num_nodes, *out.shape[1:]),
                str(out.dtype).removeprefix("torch."))
        self.writer.write(out.numpy())

    def finish(self) -> StorageFeature:
        self.writer.close()
        self.feature = StorageFeature(self.path)
        return self.feature

    def close(self) -> None:
        """Drop an unfinished file; close the finished one's reader."""
        if self.feature is not None:
            self.feature.close()
        elif self.writer is not None:
            self.writer.abort()

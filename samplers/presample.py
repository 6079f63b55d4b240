"""Presampling: run the real sampler for some batches, count row accesses.

The profile is what the cache plan is made from (`hmgraph.cache.plan`): how
often each feature row was an input of a batch, the trace of unique input
ids per batch, and how often each row was needed at each hop (a row needed
by the first layer only is ``hop = num_layers``; the seeds are hop 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import dgl
import torch

__all__ = ["Profile", "epoch_counts", "expected_reads", "presample"]


@dataclass
class Profile:
    """Access counts from a presampling pass.

    Attributes
    ----------
    counts : torch.Tensor
        int64 (num_rows,): batches in which each row was an input.
    hop_counts : torch.Tensor
        int64 (num_hops + 1, num_rows): batches in which each row was first
        needed at hop h (0 = seed, h = h-th neighbourhood).
    trace : list of torch.Tensor
        Unique input ids of each profiled batch, in order.
    """

    counts: torch.Tensor
    hop_counts: torch.Tensor
    trace: list

    @property
    def num_batches(self) -> int:
        """Batches profiled."""
        return len(self.trace)

    @property
    def accesses(self) -> int:
        """Row accesses in the profile."""
        return int(self.counts.sum())

    def renamed(self, perm: torch.Tensor) -> Profile:
        """The same profile with node ``perm[new]`` renamed ``new``."""
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel())
        return Profile(self.counts[perm], self.hop_counts[:, perm],
                       [inverse[ids].sort().values for ids in self.trace])


def presample(graph, graph_sampler, seeds: torch.Tensor, batch_size: int,
              num_batches: int, seed: int = 0, progress=None,
              shuffle: bool = True) -> Profile:
    """Sample ``num_batches`` batches and count which rows they read.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph (CPU).
    graph_sampler : dgl.dataloading.BlockSampler
        The sampler training will use.
    seeds : torch.Tensor
        Seed ids (the train split); shuffled with ``seed``, or ordered by
        the sampler's ``order_seeds`` where it has one.
    batch_size : int
        Seeds per batch.
    num_batches : int
        Batches to profile (at most one epoch's worth).
    seed : int
        Seed of the shuffle and of DGL's generator.
    progress : callable, optional
        Wraps the batch iterator (e.g. ``tqdm``).
    shuffle : bool
        Shuffle the seeds (as a loader with ``shuffle=True`` does); if
        False they are taken in the given order, as a loader without
        shuffling takes them. A sampler's ``order_seeds`` applies either
        way.

    Returns
    -------
    Profile
    """
    if seeds.numel() == 0:
        raise ValueError("cannot presample: there are no seed nodes")
    if hasattr(graph_sampler, "order_seeds"):  # e.g. ClusterSampler
        order = graph_sampler.order_seeds(seeds, seed)
    elif not shuffle:
        order = seeds
    else:
        generator = torch.Generator().manual_seed(seed)
        order = seeds[torch.randperm(seeds.numel(), generator=generator)]
    total = (order.numel() + batch_size - 1) // batch_size
    num_batches = max(1, min(num_batches, total))
    dgl.seed(seed)
    num_rows = graph.num_nodes()
    counts = torch.zeros(num_rows, dtype=torch.int64)
    hop_counts = None
    trace = []
    batches = range(num_batches)
    if progress is not None:
        batches = progress(batches)
    for index in batches:
        batch = order[index * batch_size:(index + 1) * batch_size]
        result = graph_sampler.sample(graph, batch)
        input_nodes, blocks = result[0].long(), result[-1]
        if hop_counts is None:
            hop_counts = torch.zeros((len(blocks) + 1, num_rows),
                                     dtype=torch.int64)
        counts[input_nodes] += 1
        trace.append(input_nodes.sort().values)
        # Hop of each input: the block whose destinations first hold it.
        hop = torch.full((input_nodes.numel(),), len(blocks),
                         dtype=torch.int64)
        for depth, block in enumerate(reversed(blocks)):
            inner = block.num_dst_nodes()
            hop[:inner] = torch.minimum(hop[:inner],
                                        torch.tensor(depth))
        hop_counts[hop, input_nodes] += 1
    return Profile(counts=counts, hop_counts=hop_counts, trace=trace)


def epoch_counts(graph, graph_sampler, seeds: torch.Tensor, batch_size: int,
                 seed: int = 0) -> torch.Tensor:
    """Reads per row in one whole epoch over ``seeds`` (`presample`).

    Returns
    -------
    torch.Tensor
        int64 (num_nodes,): `Profile.counts` of all the epoch's batches.
    """
    batches = -(-seeds.numel() // batch_size)
    return presample(graph, graph_sampler, seeds, batch_size, batches,
                     seed=seed).counts


def expected_reads(graph, seeds: torch.Tensor, fanouts) -> torch.Tensor:
    """Expected reads of every row in one epoch of neighbour sampling.

    The closed form of what `presample` counts, for DGL's uniform
    `NeighborSampler` (without replacement): the seeds are read once; a
    vertex at one hop with in-degree ``d`` draws ``min(d, fanout)`` of its
    in-neighbours, so each one with probability ``min(1, fanout / d)``, and
    those are read at the next hop. Expected reads add up over hops and
    batches (a row shared by several vertices of one batch counts for
    each, so hubs rank a little high). No sampling noise: a ranking from it
    does not depend on one epoch's draws.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph (CPU).
    seeds : torch.Tensor
        Seed ids of the epoch.
    fanouts : list of int
        As DGL's, first layer first; -1 takes all neighbours.

    Returns
    -------
    torch.Tensor
        float32 (num_nodes,).
    """
    src, dst = graph.edges()
    degree = graph.in_degrees().float()
    visits = torch.zeros(graph.num_nodes(), dtype=torch.float32)
    visits[seeds] = 1.0
    total = visits.clone()
    for fanout in reversed(list(fanouts)):
        if fanout < 0:
            share = (degree > 0).float()
        else:
            share = torch.clamp(fanout / degree.clamp(min=1.0), max=1.0)
        drawn = visits * share
        visits = torch.zeros_like(visits).index_add_(0, src, drawn[dst])
        total += visits
    return total

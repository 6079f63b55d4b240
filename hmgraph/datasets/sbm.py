"""Seeded degree-corrected stochastic block model: the graphs of
hmgraph's synthetic datasets.

`generate_graph` draws the graph, labels and split of a `SynthSpec`:

* every node gets a Pareto weight ``theta`` (power-law degrees) and belongs
  to one community (log-normal community sizes);
* each undirected edge picks its first end in proportion to ``theta`` and
  its second end, again in proportion to ``theta``, inside the same
  community (probability ``p_intra``), in a nearby community (``p_near``:
  communities form a ring, so groups of communities are clusters too) or
  anywhere;
* every community carries one class; a node's label is its community's
  class except for a ``label_noise`` share drawn uniformly;
* every class has a feature centre (``centroid``); the features themselves
  are drawn by `hmgraph.datasets.synthetic.feature_rows`.

Node ids are shuffled at the end, as in real datasets, so communities are
not contiguous id ranges. Everything is vectorised NumPy, edges drawn in
chunks. `hmgraph.datasets.synthetic` writes the result in OGB's format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SynthSpec", "generate_graph"]

_EDGE_CHUNK = 4_000_000
_OVERSAMPLE = 1.5


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of one synthetic dataset.

    Attributes
    ----------
    num_nodes : int
        Number of nodes.
    avg_degree : float
        Mean in-degree once both directions of every undirected edge are
        in the graph.
    num_classes : int
        Number of label classes.
    feat_dim : int
        Feature width (float32).
    community_size : int
        Mean community size.
    train_frac, valid_frac : float
        Shares of nodes in the train and validation splits.
    test_frac : float or None
        Share of nodes in the test split; None: every other node.
    """

    num_nodes: int
    avg_degree: float
    num_classes: int
    feat_dim: int
    community_size: int
    train_frac: float
    valid_frac: float
    test_frac: float | None = None
    p_intra: float = 0.8
    p_near: float = 0.1
    label_noise: float = 0.15
    signal: float = 0.2
    degree_exponent: float = 2.5
    max_theta: float = 300.0
    seed: int = 0


def generate_graph(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Generate the graph, labels and split of ``spec`` (no features).

    Returns
    -------
    dict
        ``edge_index`` (2, E) int64, every undirected edge once (the
        loader adds the reverse edges), ``label`` (N,) int64,
        ``community`` (N,) int64, ``centroid`` (num_classes, feat_dim)
        float32 (the class centres of the features, see `feature_rows`),
        and ``train`` / ``valid`` / ``test`` id arrays (int64, sorted).
    """
    rng = np.random.default_rng(spec.seed)
    n = spec.num_nodes
    # (1)-(5) Communities, edges, labels and the classes' centres.
    community, bounds = _communities(spec, rng)
    key = _edge_keys(spec, rng, community, bounds)
    label, centroid = _labels(spec, rng, community, len(bounds) - 1)

    # (6) Shuffle ids so communities are not id ranges; split.
    perm = rng.permutation(n)  # internal id -> public id
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    edge_index = np.empty((2, key.size), dtype=np.int64)
    for start in range(0, key.size, _EDGE_CHUNK):
        part = key[start:start + _EDGE_CHUNK]
        edge_index[0, start:start + part.size] = perm[part // n]
        edge_index[1, start:start + part.size] = perm[part % n]
    del key
    order = rng.permutation(n)
    num_train = int(n * spec.train_frac)
    num_valid = int(n * spec.valid_frac)
    end = n if spec.test_frac is None else min(
        n, num_train + num_valid + int(n * spec.test_frac))
    return {
        "edge_index": edge_index,
        "label": label[inverse].astype(np.int64),
        "community": community[inverse].astype(np.int64),
        "centroid": centroid,
        "train": np.sort(order[:num_train]),
        "valid": np.sort(order[num_train:num_train + num_valid]),
        "test": np.sort(order[num_train + num_valid:end]),
    }


def _communities(spec: SynthSpec,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(1) Communities as contiguous ranges of the internal order.

    Returns
    -------
    tuple of numpy.ndarray
        ``(community, bounds)``: the community of every internal id and
        the ``num_communities + 1`` range bounds.
    """
    n = spec.num_nodes
    sizes = rng.lognormal(0.0, 0.5, size=2 * n // spec.community_size + 2)
    sizes = np.maximum(1, sizes / sizes.mean() * spec.community_size)
    bounds = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))])
    bounds = bounds[bounds < n]
    bounds = np.append(bounds, n)
    community = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return community, bounds


def _edge_keys(spec: SynthSpec, rng: np.random.Generator,
               community: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """(2)-(4) The undirected edges, keys ``lo * n + hi`` (internal ids).

    Ends are drawn with power-law weights; the second end inside the
    first's community (``p_intra``), a nearby one (``p_near``) or
    anywhere. Sorted, without duplicates or self-loops, at most
    ``num_nodes * avg_degree / 2`` of them.
    """
    n = spec.num_nodes
    num_comms = len(bounds) - 1

    # (2) Power-law node weights and their running sums.
    u = rng.random(n)
    theta = np.minimum((1.0 - u) ** (-1.0 / (spec.degree_exponent - 1.0)),
                       spec.max_theta)
    cum = np.cumsum(theta)
    cum_before = cum - theta
    del u, theta

    # (3) Edges, chunk by chunk, kept as undirected keys lo * n + hi.
    # Draw more pairs than needed: duplicates fall away in (4).
    num_pairs = int(n * spec.avg_degree / 2)
    num_draws = int(num_pairs * _OVERSAMPLE)
    key_parts = []
    for start in range(0, num_draws, _EDGE_CHUNK):
        k = min(_EDGE_CHUNK, num_draws - start)
        src = np.searchsorted(cum, rng.random(k) * cum[-1], side="right")
        src = np.minimum(src, n - 1)
        kind = rng.random(k)
        comm = community[src].copy()
        near = (kind >= spec.p_intra) & (kind < spec.p_intra + spec.p_near)
        shift = rng.integers(1, 4, size=int(near.sum()))
        sign = rng.choice([-1, 1], size=shift.size)
        comm[near] = (comm[near] + sign * shift) % num_comms
        lo = cum_before[bounds[comm]]
        hi = cum[bounds[comm + 1] - 1]
        far = kind >= spec.p_intra + spec.p_near
        lo[far], hi[far] = 0.0, cum[-1]
        dst = np.searchsorted(cum, lo + rng.random(k) * (hi - lo),
                              side="right")
        dst = np.minimum(dst, n - 1)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        key_parts.append(np.minimum(src, dst) * n + np.maximum(src, dst))
    del cum, cum_before

    # (4) Without duplicates, down to the wanted count.
    key = np.unique(np.concatenate(key_parts))
    del key_parts
    if key.size > num_pairs:
        key = np.sort(rng.choice(key, size=num_pairs, replace=False))
    return key


def _labels(spec: SynthSpec, rng: np.random.Generator,
            community: np.ndarray,
            num_comms: int) -> tuple[np.ndarray, np.ndarray]:
    """(5) Labels from communities; the feature centres of the classes.

    Every community draws a class (the first ``num_classes`` communities
    one class each), ``label_noise`` of the nodes a random one.

    Returns
    -------
    tuple of numpy.ndarray
        ``(label, centroid)``: the label of every internal id and the
        (num_classes, feat_dim) float32 class centres.
    """
    comm_class = rng.integers(0, spec.num_classes, size=num_comms)
    comm_class[: spec.num_classes] = rng.permutation(spec.num_classes)[
        : min(spec.num_classes, num_comms)
    ]
    label = comm_class[community]
    noisy = rng.random(spec.num_nodes) < spec.label_noise
    label[noisy] = rng.integers(0, spec.num_classes, size=int(noisy.sum()))
    centroid = rng.standard_normal(
        (spec.num_classes, spec.feat_dim), dtype=np.float32
    )
    return label, centroid

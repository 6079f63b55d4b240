"""Static cache policies: a fixed set of rows, chosen before training.

``degree`` (PaGraph) holds the rows of highest in-degree, ``presample``
(GNNLab) the rows most accessed in a profiling pass, ``layer-aware``
(2PGraph) rows by per-hop need, hops near the seeds first. All rank rows
by a score once and never evict; see `hmgraph.cache.policies`.
"""

from __future__ import annotations

import torch

from hmgraph.cache.policy_base import Policy, Step, hot_first

__all__ = [
    "DegreePolicy",
    "LayerAwarePolicy",
    "PresamplePolicy",
    "StaticPolicy",
    "layer_aware_score",
]


class StaticPolicy(Policy):
    """Holds the ``capacity`` rows of highest score, never changes.

    One layer over the device and host stores: the top rows, the very
    top on the device.
    """

    slot_bytes = 8  # the held ids
    spans_stores = True

    def __init__(self, num_rows: int, capacity: int, score: torch.Tensor):
        super().__init__(num_rows, capacity)
        if score.numel() != num_rows:
            raise ValueError(
                f"{self.name} needs one score per row: got {score.numel()} "
                f"for {num_rows} rows"
            )
        # A copy: a view would keep the whole order (8 B per node) alive.
        self._contents = hot_first(score)[:capacity].clone()

    def warm(self) -> torch.Tensor:
        """The held rows, highest score first."""
        self._hold(self._contents)
        return self._contents

    def pinned(self) -> torch.Tensor:
        """Every held row: the contents never change."""
        return self._contents

    def _step(self, ids, hit, future) -> Step:
        return Step(hit, ids[:0], ids[:0])


class DegreePolicy(StaticPolicy):
    """Static: the rows of highest in-degree (PaGraph)."""

    name = "degree"
    needs = frozenset({"degrees"})

    def __init__(self, num_rows, capacity, *, degrees=None, **_):
        if degrees is None:
            raise ValueError("policy 'degree' needs the in-degrees")
        super().__init__(num_rows, capacity, degrees)


class PresamplePolicy(StaticPolicy):
    """Static: the rows most accessed in the profiling pass (GNNLab)."""

    name = "presample"
    needs = frozenset({"hotness"})

    def __init__(self, num_rows, capacity, *, hotness=None, **_):
        if hotness is None:
            raise ValueError("policy 'presample' needs profiled hotness")
        super().__init__(num_rows, capacity, hotness)

    @classmethod
    def pinned_hot_rows(cls, device_rows: int, static_rows: int) -> int:
        """Every device row: the device holds the hottest rows.

        See `Policy.pinned_hot_rows`.
        """
        return device_rows


class LayerAwarePolicy(StaticPolicy):
    """Static: rows by per-hop profiled need, hops near the seeds first.

    2PGraph's layer-aware placement: a row needed close to the seeds (as a
    seed or one-hop neighbour) is needed by more of the computation than a
    row needed only at the outermost hop. See `layer_aware_score`.
    """

    name = "layer-aware"
    needs = frozenset({"hop_counts"})

    def __init__(self, num_rows, capacity, *, hop_counts=None, **_):
        if hop_counts is None:
            raise ValueError("policy 'layer-aware' needs per-hop counts")
        super().__init__(num_rows, capacity, layer_aware_score(hop_counts))


def layer_aware_score(hop_counts: torch.Tensor) -> torch.Tensor:
    """Per-row score from per-hop access counts.

    Parameters
    ----------
    hop_counts : torch.Tensor
        (num_hops + 1, num_rows): batches in which a row was first needed
        at hop h (0 = seed).

    Returns
    -------
    torch.Tensor
        float64 (num_rows,): ``sum_h counts[h] * (H + 1 - h) / (H + 1)``,
        so a need at hop 0 weighs most and one at the last hop least;
        rows with equal totals are ordered by how close to the seeds they
        were needed.
    """
    hops = hop_counts.shape[0]
    weight = torch.arange(hops, 0, -1, dtype=torch.float64) / hops
    return (hop_counts.double() * weight[:, None]).sum(0)

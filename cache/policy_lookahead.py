"""Lookahead cache policies: evictions by the next use of each row.

``hmgraph`` holds the hottest rows for good and manages a dynamic region
by the next uses known in the loader's lookahead window (profiled hotness
beyond it), admitting a miss only when it would be used before the row it
replaces; ``belady`` applies the same rule with the whole future known
(offline OPT, from `next_use_trace`). See `hmgraph.cache.policies`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hmgraph.cache import engine
from hmgraph.cache.policy_base import EMPTY_IDS, Policy, Step, hot_first

__all__ = ["BeladyPolicy", "HMGraphPolicy", "next_use_trace"]

_NEVER = torch.iinfo(torch.int64).max
_NEVER_NEAR = torch.iinfo(torch.int32).max  # HMGraphPolicy's next_use


class HMGraphPolicy(Policy):
    """Static hot rows plus a lookahead-managed dynamic region.

    Parameters
    ----------
    num_rows, capacity : int
        See `Policy`.
    hotness : torch.Tensor
        Profiled accesses per row (float or int, one per row).
    static_rows : int
        Rows of the hottest part held for good; the other
        ``capacity - static_rows`` form the dynamic region.
    window : int
        How many batches ahead `step` looks (the loader's prefetch window).

    Notes
    -----
    After each batch the dynamic region keeps, among its rows and the
    batch's misses, those used soonest: a row's key is the distance to its
    next use inside the window, and rows not used inside the window rank
    after all those, by profiled hotness. Misses that do not make the cut
    are not admitted (bypass). With a window covering the whole future
    this is Belady's rule.
    """

    name = "hmgraph"
    looks_ahead = True
    # resident, static, cold_rank and next_use (int32 each)
    node_bytes = 1 + 1 + 4 + 4
    slot_bytes = 8  # the dynamic region's ids, the static ids
    spans_stores = True
    splits_static = True
    needs = frozenset({"hotness"})

    def __init__(self, num_rows, capacity, *, hotness=None, static_rows=0,
                 window=4, **_):
        super().__init__(num_rows, capacity)
        if hotness is None:
            raise ValueError("policy 'hmgraph' needs profiled hotness")
        if not 0 <= static_rows <= capacity:
            raise ValueError(
                f"static_rows {static_rows} is outside [0, {capacity}]"
            )
        self.static_rows = static_rows
        self.window = window
        order = hot_first(hotness)
        self.static = torch.zeros(num_rows, dtype=torch.bool)
        self.static[order[:static_rows]] = True
        self._static_order = order[:static_rows].clone()
        # Rank by hotness beyond the window: 0 for the hottest row.
        rank_dtype = torch.int32 if num_rows < 2**31 else torch.int64
        self.cold_rank = torch.empty(num_rows, dtype=rank_dtype)
        self.cold_rank[order] = torch.arange(num_rows, dtype=rank_dtype)
        # Distance to the next use inside the window (1..window), or
        # `_NEVER_NEAR`: int32 is plenty and halves the per-node bytes.
        self.next_use = torch.full((num_rows,), _NEVER_NEAR,
                                   dtype=torch.int32)
        self._held = EMPTY_IDS  # ids in the dynamic region

    @classmethod
    def pinned_hot_rows(cls, device_rows: int, static_rows: int) -> int:
        """The static rows the device holds (the hottest come first).

        See `Policy.pinned_hot_rows`.
        """
        return min(static_rows, device_rows)

    def warm(self) -> torch.Tensor:
        """The static rows, hottest first."""
        self._hold(self._static_order)
        return self._static_order

    def pinned(self) -> torch.Tensor:
        """The static rows: only the dynamic region evicts."""
        return self._static_order

    def step_compiled(self, ids: torch.Tensor,
                      future: Sequence[torch.Tensor] = ()) -> Step:
        """`step`, the choice made by the compiled engine's kernel
        (`hmgraph.cache.engine.choose_dynamic`, the loader's own CPU
        path), for replays; the state is kept as `step` keeps it."""
        hit = self.resident[ids]
        ahead, bounds = engine.back_to_back(list(future)[:self.window])
        evict, admit, held = engine.choose_dynamic(
            ids.numpy(), hit.numpy(), self._held.numpy(), ahead, bounds,
            self.window, self.next_use.numpy(), self.cold_rank.numpy(),
            _NEVER_NEAR, self.capacity - self.static_rows, self.num_rows)
        self._held = torch.from_numpy(held)
        return self._apply(Step(hit, torch.from_numpy(evict),
                                ids[torch.from_numpy(admit)]))

    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        """Smaller is sooner: next use in the window, then hotness.

        ``(distance to the next use, or window + 1 beyond the window) *
        num_rows + cold_rank``: a total order (``cold_rank`` is a
        permutation), so which rows make the cut never depends on how a
        selection breaks ties, and the compiled engine
        (`hmgraph.cache.engine.choose_dynamic`) decides exactly alike.
        """
        near = self.next_use[ids].long()
        near = torch.where(near == _NEVER_NEAR, self.window + 1, near)
        return near * self.num_rows + self.cold_rank[ids].long()

    def _step(self, ids, hit, future) -> Step:
        future = list(future)[: self.window]
        for distance in range(len(future), 0, -1):
            self.next_use[future[distance - 1]] = distance
        try:
            return self._choose(ids, hit)
        finally:
            for batch in future:
                self.next_use[batch] = _NEVER_NEAR

    def _choose(self, ids, hit) -> Step:
        dynamic_capacity = self.capacity - self.static_rows
        miss = ids[~hit]
        held = self._held  # the dynamic region: no scan of the graph
        candidates = torch.cat([held, miss])
        keys = self._keys(candidates)
        keep = torch.ones(candidates.numel(), dtype=torch.bool,
                          device=candidates.device)
        if candidates.numel() > dynamic_capacity:
            keep[:] = False
            keep[torch.topk(keys, dynamic_capacity, largest=False).indices] \
                = True
        evict = held[~keep[: held.numel()]]
        # Admissions most valuable first: the first store (the device's)
        # takes the rows needed soonest.
        admitted = keep[held.numel():]
        order = torch.argsort(keys[held.numel():][admitted], stable=True)
        admit = miss[admitted][order]
        self._held = torch.cat([held[keep[: held.numel()]], admit])
        return Step(hit, evict, admit)


class BeladyPolicy(HMGraphPolicy):
    """Belady's optimal offline policy at mini-batch granularity.

    Evicts the row whose next use is farthest and bypasses misses used
    later than everything it holds. Needs the next use of every access:
    call `set_trace` with the whole trace first (see `next_use_trace`);
    `step` then ignores ``future``.
    """

    name = "belady"
    offline = True
    splits_static = False
    needs = frozenset()  # the whole trace instead (`set_trace`)

    def __init__(self, num_rows, capacity, **_):
        super().__init__(num_rows, capacity,
                         hotness=torch.zeros(num_rows), static_rows=0,
                         window=0)
        # Batch indices of the whole trace, not distances in a window.
        self.next_use = torch.full((num_rows,), _NEVER, dtype=torch.int64)
        self._next = None
        self._position = 0

    def set_trace(self, trace: Sequence[torch.Tensor]) -> None:
        """Give the whole trace of unique-id batches, in order."""
        self._next = next_use_trace(trace)
        self._position = 0
        first = torch.full((self.num_rows,), _NEVER, dtype=torch.int64)
        for index in range(len(trace) - 1, -1, -1):
            first[trace[index]] = index
        self._first_use = first

    def warm(self) -> torch.Tensor:
        """The rows used first: what an optimal prefill would hold.

        Static policies fill their cache before the first batch; so may
        OPT, or it would not be a ceiling for them.
        """
        if self._next is None:
            raise ValueError("belady needs the whole trace: call set_trace")
        used = (self._first_use < _NEVER).nonzero().squeeze(1)
        order = torch.argsort(self._first_use[used], stable=True)
        ids = used[order[: self.capacity]]
        self.next_use[ids] = self._first_use[ids]
        self._hold(ids)
        self._held = ids  # no static rows: all of it is dynamic
        return ids

    def _step(self, ids, hit, future) -> Step:
        if self._next is None:
            raise ValueError("belady needs the whole trace: call set_trace")
        self.next_use[ids] = self._next[self._position]
        self._position += 1
        return self._choose(ids, hit)

    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        return self.next_use[ids]


def next_use_trace(trace: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """For every access, the batch index of the row's next use.

    One backward pass over the trace; ``_NEVER`` where a row is not used
    again.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Unique int64 ids per batch, in order.

    Returns
    -------
    list of torch.Tensor
        int64, aligned with ``trace``.
    """
    if not trace:
        return []
    num_rows = int(max(int(t.max()) for t in trace if t.numel()) + 1) if any(
        t.numel() for t in trace) else 1
    seen = torch.full((num_rows,), _NEVER, dtype=torch.int64)
    result = [None] * len(trace)
    for index in range(len(trace) - 1, -1, -1):
        ids = trace[index]
        result[index] = seen[ids].clone()
        seen[ids] = index
    return result


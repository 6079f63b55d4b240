"""Batch reuse on a profiled trace: the rows it holds, the rows it serves.

`reuse_profile` replays what `hmgraph.cache.reuse.BatchReuse` does with a
lookahead on a profiled trace: the most rows its levels hold at once
(what `hmgraph.cache.plan.make_plan` sizes the buffers by) and the share
of requested rows it reuses. `member` is the sorted lookup both use.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["member", "reuse_profile", "reused_in"]


def member(ids: torch.Tensor, sorted_ids: torch.Tensor):
    """Which ``ids`` are in ``sorted_ids``, and where.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        bool mask over ``ids``, and the positions in ``sorted_ids`` of the
        ids found (same device as the inputs).
    """
    if sorted_ids.numel() == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=ids.device)
        return torch.zeros_like(ids, dtype=torch.bool), empty
    position = torch.searchsorted(sorted_ids, ids)
    position = position.clamp_(max=sorted_ids.numel() - 1)
    found = sorted_ids[position] == ids
    return found, position[found]


def reused_in(trace: Sequence[torch.Tensor], t: int,
              levels: int) -> torch.Tensor:
    """Bool per id of batch ``t`` of ``trace``: the rows one of the
    ``levels`` batches before it asked for, which batch reuse serves."""
    recent = trace[max(0, t - levels):t]
    if not recent:
        return torch.zeros(len(trace[t]), dtype=torch.bool)
    return member(trace[t], torch.unique(torch.cat(list(recent))))[0]


def reuse_profile(trace: Sequence[torch.Tensor], levels: int,
                  resident: torch.Tensor | None = None) -> dict:
    """Rows batch reuse holds and serves on a profiled trace.

    What `BatchReuse` does with a lookahead: batch t keeps the rows that
    batch t+1 asks for and, with two levels, those that only batch t+2
    asks for; the latter stay one batch longer. Every row one of the last
    ``levels`` batches had is served. Rows the cache below serves on the
    device for good (``resident``) are neither kept nor reused, as in
    `BatchReuse`, but count as requested.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Sorted unique input ids per batch, in order.
    levels : int
        1 or 2.
    resident : torch.Tensor, optional
        Bool per row: rows the device tier holds for good.

    Returns
    -------
    dict
        ``rows_per_level`` (the most rows held at once, split evenly over
        the levels, which share them), ``reuse_rate`` (share of requested
        rows reused), ``rows_per_batch`` (mean rows requested) and
        ``kept_per_batch`` (mean rows a batch keeps).
    """
    def kept(t, distance):
        if t + distance >= len(trace):
            return torch.zeros(len(trace[t]), dtype=torch.bool)
        return member(trace[t], trace[t + distance])[0]

    requested = sum(ids.numel() for ids in trace)
    if resident is not None:
        trace = [ids[~resident[ids]] for ids in trace]
    most = reused = stored = 0
    later = 0  # rows the last batch kept for the batch after next only
    for t in range(len(trace)):
        reused += int(reused_in(trace, t, levels).sum())
        upcoming = kept(t, 1)
        held = int(upcoming.sum())
        stored += held
        if levels == 2:
            after = int((kept(t, 2) & ~upcoming).sum())
            held, later = held + after + later, after
            stored += after
        most = max(most, held)
    batches = max(1, len(trace))
    return {"rows_per_level": [-(-most // levels)] * levels,
            "reuse_rate": reused / requested if requested else 0.0,
            "rows_per_batch": requested / batches,
            "kept_per_batch": stored / batches}

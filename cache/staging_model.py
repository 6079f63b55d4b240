"""Window read planning replayed on a profile: the reads it spares.

With the lookahead window on and features on disk, a batch's reads bring
along the rows the next batches need that lie inside their block runs
(on a block read anyway, or in a gap read through), for no request and
no byte more (`hmgraph.cache.storage.StorageFeature.read_along`); they
wait in a host staging area until their batch
(`hmgraph.cache.coordinated`). The area is a share of the host budget,
so the cache holds fewer rows. Whether that pays depends on the
workload: synth-products (a batch asks for 23% of the rows) read 0.76x
the bytes of no cache with staging, 1.00x without; synth-small (82%)
1.035x with it.

`miss_trace` replays a cache on held-out profiled batches and keeps its
misses; `staged_reads` replays staging over them as the cache does it
(staged rows served first, those the window no longer needs dropped,
then what the reads cover brought along, the soonest needed first, as
far as the area has room) and prices each batch's reads with the disk
model. The loader sets the reads of the cache without staging beside
those of the smaller cache with it (`hmgraph.cache.costs.
staging_verdict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hmgraph.cache.feature import Feature
from hmgraph.cache.placement import planned_read
from hmgraph.cache.reuse_sizing import member
from hmgraph.cache.trace_replay import replay_hits

__all__ = ["StagedReads", "miss_trace", "staged_reads"]


def miss_trace(policy, trace: Sequence[torch.Tensor],
               window: int | None = None) -> list[np.ndarray]:
    """Per batch of ``trace``, the sorted ids a fresh ``policy`` misses,
    replayed with the next ``window`` batches as its lookahead (default:
    the policy's own ``window``; a policy of no rows misses every id)."""
    misses = []
    replay_hits(policy, trace, window,
                on_miss=lambda ids: misses.append(ids.numpy()))
    return misses


@dataclass(frozen=True)
class StagedReads:
    """Means per batch of a replay of window read planning.

    Attributes
    ----------
    seconds : float
        Modelled seconds of the reads (staging on: of the misses it did
        not serve).
    staged : float
        Rows brought along into the staging area.
    served : float
        Misses the staging area served.
    """

    seconds: float
    staged: float
    served: float


def staged_reads(source: Feature, misses: Sequence[np.ndarray],
                 window: int, capacity: int) -> StagedReads:
    """Replay window read planning over a cache's ``misses``.

    Parameters
    ----------
    source : Feature
        The storage tier (its geometry, gap rule and disk model).
    misses : sequence of numpy.ndarray
        Sorted unique ids per batch that the cache misses (`miss_trace`):
        what is read, and what the batches ahead would read.
    window : int
        Lookahead batches.
    capacity : int
        Rows the staging area holds (0: staging off).

    Returns
    -------
    StagedReads
    """
    if not len(misses):
        return StagedReads(0.0, 0.0, 0.0)
    staged = np.zeros(source.num_rows, dtype=bool)  # per row
    held = np.zeros(0, dtype=np.int64)  # the staged ids: no pass over rows
    ahead = np.zeros(source.num_rows, dtype=bool)
    seconds = brought = served = 0.0
    for t, ids in enumerate(misses):
        coming = misses[t + 1:t + 1 + window] if capacity else []
        hit = staged[ids]
        served += int(hit.sum())
        read = ids[~hit]
        # Rows no batch of the window needs leave the area (the ones
        # just served among them).
        for batch in coming:
            ahead[batch] = True
        staged[held[~ahead[held]]] = False
        held = held[ahead[held]]
        cost, plan = planned_read(source, read)
        seconds += cost
        for batch in coming:  # the soonest needed first
            room = capacity - len(held)
            if room <= 0:
                break
            # Not this batch's rows, not rows staged already.
            wanted = batch[~staged[batch] & ~member(
                torch.from_numpy(batch), torch.from_numpy(ids))[0].numpy()]
            taken = wanted[plan.covers(wanted, *source.geometry)][:room]
            staged[taken] = True
            held = np.concatenate([held, taken])
            brought += len(taken)
        for batch in coming:
            ahead[batch] = False
    n = len(misses)
    return StagedReads(seconds / n, brought / n, served / n)

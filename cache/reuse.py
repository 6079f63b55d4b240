"""Batch reuse (BRGraph): rows of recent batches kept on the device.

Adjacent mini-batches share many input rows. `BatchReuse` keeps the last
batch's input rows on the training device (one level) and, with two
levels, also the rows of the batch before it that the last batch did not
share. For a new batch it copies the rows they hold on the device and asks
the feature cache below only for the rest.

Finding the shared ids is hash-free, sort-free and vectorised on the
device: two int32 tables per node say in which batch each row was last
stored (a batch counter) and where in that batch's row tensor. A
batch's ids are looked up with one gather; storing a batch is one
scatter. There is no Python loop, and a row stored by the last batch is,
by construction, not counted in the older one: the table holds each row's
latest batch only. The ids left for the cache
below go to it sorted, so that it neither sorts them nor reorders its
rows.

A batch keeps only the rows a coming batch needs. The loader passes the
next batches' ids (``future``, its lookahead window); a third int32 per
node stamps the ids of the next ``levels`` batches, and the rows of this
batch that carry a stamp are copied into the buffer, those of the next
batch first. Without a lookahead (the end of an epoch, ``window=0``) the
batch keeps its first rows. Rows that no batch within reach will ask for
are never copied, so the buffers cost little time and device memory, and
reuse serves exactly what keeping whole batches would.

The tables take 12 bytes per node of device memory, which the plan
charges to the device budget (`TABLE_BYTES_PER_ROW`). The buffers hold
at most ``capacity_rows`` rows per level, so the device memory they take
never exceeds what the plan reserved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hmgraph.cache.feature import Feature, check_ids

__all__ = ["REUSE_LEVELS", "TABLE_BYTES_PER_ROW", "BatchReuse",
           "ReuseStats", "member", "reuse_profile"]

REUSE_LEVELS = {"none": 0, "one-level": 1, "two-level": 2}
#: Device bytes of the id tables per node (batch counter, position in the
#: batch, lookahead stamp).
TABLE_BYTES_PER_ROW = 12
_NEVER = -(2**31)  # the batch counter of rows never stored
_WRAP = 2**29  # restart the counter (and clear the tables) here: stamps
# are 4 x the counter


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


def reuse_profile(trace: Sequence[torch.Tensor], levels: int) -> dict:
    """Rows batch reuse holds and serves on a profiled trace.

    What `BatchReuse` does with a lookahead: batch t keeps the rows that
    batch t+1 asks for and, with two levels, those that only batch t+2
    asks for; the latter stay one batch longer. Every row one of the last
    ``levels`` batches had is served.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Sorted unique input ids per batch, in order.
    levels : int
        1 or 2.

    Returns
    -------
    dict
        ``rows_per_level`` (the most rows held at once, split evenly over
        the levels, which share them), ``reuse_rate`` (share of requested
        rows reused).
    """
    def kept(t, distance):
        if t + distance >= len(trace):
            return torch.zeros(len(trace[t]), dtype=torch.bool)
        return member(trace[t], trace[t + distance])[0]

    most = reused = requested = 0
    later = 0  # rows the last batch kept for the batch after next only
    for t, ids in enumerate(trace):
        recent = trace[max(0, t - levels):t]
        if recent:
            reused += int(member(ids, torch.unique(torch.cat(
                list(recent))))[0].sum())
        requested += ids.numel()
        upcoming = kept(t, 1)
        held = int(upcoming.sum())
        if levels == 2:
            after = int((kept(t, 2) & ~upcoming).sum())
            held, later = held + after + later, after
        most = max(most, held)
    return {"rows_per_level": [-(-most // levels)] * levels,
            "reuse_rate": reused / requested if requested else 0.0}


@dataclass
class ReuseStats:
    """Counters of batch reuse; 0 before the first batch.

    Attributes
    ----------
    rows_requested : int
        Input rows asked (DGL's input nodes are unique).
    reused : dict of str to int
        Rows copied on the device from each level (``level1``, ``level2``).
    bytes_saved : int
        Bytes that did not cross to the device (or come from storage).
    seconds : float
        Time batch reuse spent, all but the reads of the cache below:
        looking ids up in the table, copying reused rows, keeping the
        batch (a copy of its rows, its ids in the table) and moving the
        ids of the rest to the host (a sync on CUDA).
    copy_seconds : float
        The part of ``seconds`` spent copying rows on the device: reused
        rows into the batch, the batch's rows into the buffer.
    peak_bytes : int
        Most device bytes the buffers and the id table held after a read.
    """

    rows_requested: int = 0
    reused: dict = field(default_factory=lambda: {"level1": 0,
                                                  "level2": 0})
    bytes_saved: int = 0
    seconds: float = 0.0
    copy_seconds: float = 0.0
    peak_bytes: int = 0

    def reuse_rate(self) -> float:
        """Share of requested rows reused (0.0 before any)."""
        if self.rows_requested == 0:
            return 0.0
        return sum(self.reused.values()) / self.rows_requested

    def reset(self) -> None:
        """Zero every counter."""
        self.__init__()

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        return {"rows_requested": self.rows_requested,
                "reused": dict(self.reused),
                "reuse_rate": self.reuse_rate(),
                "bytes_saved": self.bytes_saved,
                "seconds": self.seconds,
                "copy_seconds": self.copy_seconds,
                "peak_bytes": self.peak_bytes}


class BatchReuse(Feature):
    """A `Feature` that reuses rows of the previous batches.

    Parameters
    ----------
    inner : Feature
        Where rows not reused come from (a `FeatureCache`, rows on
        ``device``); its ``read`` may take ``future``.
    levels : int
        1 (previous batch) or 2 (and the one before it).
    capacity_rows : int
        Rows each level's buffer may hold (device memory reserved by the
        plan).

    Notes
    -----
    See `Feature.read`; ``future`` (sorted unique ids of the next batches)
    chooses which rows a batch keeps. Reads are treated as consecutive
    mini-batches: call `reset` at an epoch boundary only if rows may have
    changed (they do not: reuse is exact across epochs too).
    """

    def __init__(self, inner: Feature, levels: int, capacity_rows: int):
        if levels not in (1, 2):
            raise ValueError(f"reuse levels must be 1 or 2, got {levels}")
        if capacity_rows < 0:
            raise ValueError(
                f"capacity_rows must be >= 0, got {capacity_rows}")
        self.inner = inner
        self.levels = levels
        self.capacity_rows = capacity_rows
        self.num_rows = inner.num_rows
        self.row_shape = inner.row_shape
        self.dtype = inner.dtype
        self.device = inner.device
        self.stats = ReuseStats()
        # Per node: the batch it was last stored in, and its row there.
        self._batch_of = torch.empty(self.num_rows, dtype=torch.int32,
                                     device=self.device)
        self._row_of = torch.zeros(self.num_rows, dtype=torch.int32,
                                   device=self.device)
        # Per node: the last (batch, distance) stamp of the lookahead.
        self._stamp = torch.empty(self.num_rows, dtype=torch.int32,
                                  device=self.device)
        self.reset()

    def reset(self) -> None:
        """Forget the buffered batches."""
        self._batch_of.fill_(_NEVER)
        self._stamp.fill_(_NEVER)
        self._batch = 0
        empty = torch.zeros((0, *self.row_shape), dtype=self.dtype,
                            device=self.device)
        # Per level (last batch, the one before): its kept rows and the
        # first row still valid; and how many of the last batch's rows
        # were kept for the next batch only.
        self._held = [(empty, 0), (empty, 0)]
        self._next_only = 0

    @property
    def table_bytes(self) -> int:
        """Device bytes of the id tables."""
        return self.num_rows * TABLE_BYTES_PER_ROW

    @property
    def nbytes(self) -> int:
        """Device bytes held now: row buffers and the tables."""
        return self.table_bytes + sum(
            rows.numel() * rows.element_size() for rows, _ in self._held)

    def read(self, ids, future: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """See `Feature.read`; ``future`` is passed to the inner feature."""
        return self._read(check_ids(ids, self.num_rows), future)

    def _read(self, ids, future=()) -> torch.Tensor:
        # Everything but the inner read counts in `stats.seconds`: the
        # lookups, the row copies, keeping the batch, and moving the ids
        # of the rest to the host (a sync on CUDA).
        began = time.perf_counter()
        ids = ids.to(self.device)
        # (1) In which batch each id was last stored, and where.
        batch_of = self._batch_of.index_select(0, ids)
        row_of = self._row_of.index_select(0, ids)
        out = torch.empty((ids.numel(), *self.row_shape),
                          dtype=self.dtype, device=self.device)
        # (2) Copy the rows the buffers hold (`index_select` and
        # `index_copy_`: a third of the cost of `out[i] = rows[j]` on CPU).
        copy = time.perf_counter()
        served = torch.zeros_like(ids, dtype=torch.bool)
        for age in range(1, self.levels + 1):
            rows, first = self._held[age - 1]
            hit = batch_of == self._batch - age
            if first:
                hit &= row_of >= first
            served |= hit
            where = hit.nonzero().squeeze(1)
            out.index_copy_(0, where, rows.index_select(
                0, row_of.index_select(0, where) - first))
            self.stats.reused[f"level{age}"] += where.numel()
            self.stats.bytes_saved += where.numel() * self.row_bytes
        self.stats.copy_seconds += time.perf_counter() - copy
        # (3) The rest from the cache below, asked in sorted order: it then
        # neither sorts them nor puts its rows back in request order.
        rest = (~served).nonzero().squeeze(1)
        inner = 0.0
        if rest.numel():
            wanted, order = ids.index_select(0, rest).sort()
            wanted = wanted.cpu()
            start = time.perf_counter()
            rows = self.inner.read(wanted, future)
            inner = time.perf_counter() - start
            out.index_copy_(0, rest.index_select(0, order),
                            rows.to(self.device))
            del rows
        # (4) Keep copies (the caller may write into `out`).
        self._keep(ids, out, future)
        self.stats.rows_requested += ids.numel()
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.nbytes)
        self.stats.seconds += time.perf_counter() - began - inner
        return out

    def _keep(self, ids, out, future) -> None:
        """Keep the rows of ``out`` that the next ``levels`` batches ask
        for (the next batch's first); without ``future``, the first rows.

        The last batch becomes the older level with only its rows for the
        batch after next (a copy; all its rows, by reference, when it had
        no lookahead), and the levels share ``levels * capacity_rows``.
        """
        copy = time.perf_counter()
        older = (out[:0], 0)
        if self.levels == 2:
            last, _ = self._held[0]
            first = self._next_only
            older = (last[first:].clone() if first else last, first)
        self._held = [older, older]  # let the last batch's rows go
        room = self.levels * self.capacity_rows - older[0].shape[0]
        self.stats.copy_seconds += time.perf_counter() - copy
        if len(future):
            # Stamp the coming batches' ids, the nearest last so that it
            # wins; stamps grow with the batch counter: none needs
            # clearing.
            stamp = self._batch * 4
            coming = list(future)[:self.levels]
            for distance in reversed(range(len(coming))):
                self._stamp.index_fill_(
                    0, coming[distance].to(self.device), stamp - distance)
            seen = self._stamp.index_select(0, ids)
            keep = [(seen == stamp - d).nonzero().squeeze(1)
                    for d in range(len(coming))]
            next_only = min(keep[0].numel(), room)
            keep = torch.cat(keep)[:room]
        else:
            next_only = 0
            keep = torch.arange(min(ids.numel(), room), device=self.device)
        copy = time.perf_counter()
        kept = ids.index_select(0, keep)
        self._batch_of.index_fill_(0, kept, self._batch)
        self._row_of.index_copy_(0, kept, torch.arange(
            kept.numel(), dtype=torch.int32, device=self.device))
        self._held = [(out.index_select(0, keep), 0), older]
        self._next_only = next_only
        self.stats.copy_seconds += time.perf_counter() - copy
        self._batch += 1
        if self._batch >= _WRAP:
            self.reset()

    def close(self) -> None:
        """Close the inner feature."""
        self.inner.close()

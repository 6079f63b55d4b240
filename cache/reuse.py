"""Batch reuse (BRGraph): rows of recent batches kept on the device.

Adjacent mini-batches share many input rows. `BatchReuse` keeps the last
batch's unique input ids and rows on the training device (one level) and,
with two levels, also the rows of the batch before it that the last batch
did not share. For a new batch it finds the ids it shares with them using
sorted ids and ``torch.searchsorted`` on the device (no Python loop, no
round trip of the ids to the host), copies those rows on the device, and
asks the feature cache below only for the rest.

The buffers hold at most ``capacity_rows`` rows per level: a batch larger
than that keeps only its first ``capacity_rows`` unique rows for reuse, so
the device memory they take never exceeds what the plan reserved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hmgraph.cache.feature import Feature, check_ids, unique_sorted

__all__ = ["REUSE_LEVELS", "BatchReuse", "ReuseStats", "member",
           "reuse_profile"]

REUSE_LEVELS = {"none": 0, "one-level": 1, "two-level": 2}


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
    """Rows each reuse level needs and would serve on a profiled trace.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Sorted unique input ids per batch, in order.
    levels : int
        1 or 2.

    Returns
    -------
    dict
        ``rows_per_level`` (the largest buffer each level held),
        ``reuse_rate`` (share of requested rows reused).
    """
    sizes = [0, 0]
    reused = requested = 0
    last = older = torch.zeros(0, dtype=torch.int64)
    for ids in trace:
        found, _ = member(ids, last)
        hits = int(found.sum())
        if levels == 2:
            hits += int(member(ids[~found], older)[0].sum())
            older = last[~member(last, ids)[0]]
            sizes[1] = max(sizes[1], older.numel())
        reused += hits
        requested += ids.numel()
        last = ids
        sizes[0] = max(sizes[0], ids.numel())
    return {"rows_per_level": sizes[:levels],
            "reuse_rate": reused / requested if requested else 0.0}


@dataclass
class ReuseStats:
    """Counters of batch reuse; 0 before the first batch.

    Attributes
    ----------
    rows_requested : int
        Unique input rows asked.
    reused : dict of str to int
        Rows copied on the device from each level (``level1``, ``level2``).
    bytes_saved : int
        Bytes that did not cross to the device (or come from storage).
    seconds : float
        Time spent finding duplicates (unique, ``searchsorted``, keeping
        the buffers' ids).
    copy_seconds : float
        Time spent copying reused rows on the device.
    """

    rows_requested: int = 0
    reused: dict = field(default_factory=lambda: {"level1": 0,
                                                  "level2": 0})
    bytes_saved: int = 0
    seconds: float = 0.0
    copy_seconds: float = 0.0

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
                "copy_seconds": self.copy_seconds}


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
    See `Feature.read`. Reads are treated as consecutive mini-batches: call
    `reset` at an epoch boundary only if rows may have changed (they do
    not: reuse is exact across epochs too).
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
        self.reset()

    def reset(self) -> None:
        """Forget the buffered batches."""
        empty_ids = torch.zeros(0, dtype=torch.int64, device=self.device)
        empty_rows = torch.zeros((0, *self.row_shape), dtype=self.dtype,
                                 device=self.device)
        # Each level: sorted ids, a row tensor, and each id's row in it.
        self._last = (empty_ids, empty_rows, empty_ids)
        self._older = (empty_ids, empty_rows, empty_ids)

    @property
    def nbytes(self) -> int:
        """Device bytes held by the buffers now (shared tensors once)."""
        tensors = {id(rows): rows for _, rows, _ in (self._last, self._older)}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def read(self, ids, future: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """See `Feature.read`; ``future`` is passed to the inner feature."""
        return self._read(check_ids(ids, self.num_rows), future)

    def _read(self, ids, future=()) -> torch.Tensor:
        detect = time.perf_counter()
        # (1) Unique sorted ids, on the device.
        unique, inverse = unique_sorted(ids.to(self.device))
        pending = torch.ones(unique.numel(), dtype=torch.bool,
                             device=self.device)
        # (2) Which ids the last batch, then the one before, hold.
        hits = []
        for held_ids, rows, index in (self._last, self._older)[
                : self.levels]:
            where = pending.nonzero().squeeze(1)
            found, position = member(unique[where], held_ids)
            where = where[found]
            pending[where] = False
            hits.append((where, rows, index[position]))
        self.stats.seconds += time.perf_counter() - detect
        # (3) Copy those rows on the device.
        copy = time.perf_counter()
        out = torch.empty((unique.numel(), *self.row_shape),
                          dtype=self.dtype, device=self.device)
        for level, (where, rows, index) in enumerate(hits, start=1):
            out[where] = rows[index]
            self.stats.reused[f"level{level}"] += where.numel()
            self.stats.bytes_saved += where.numel() * self.row_bytes
        self.stats.copy_seconds += time.perf_counter() - copy
        # (4) The rest from the cache below.
        rest = pending.nonzero().squeeze(1)
        if rest.numel():
            out[rest] = self.inner.read(unique[rest].cpu(), future).to(
                self.device)
        # (5) Keep this batch, and (by reference, no copy) the rows of the
        # last batch that this one did not share.
        detect = time.perf_counter()
        if self.levels == 2:
            last_ids, last_rows, last_index = self._last
            shared, _ = member(last_ids, unique)
            keep = (~shared).nonzero().squeeze(1)[: self.capacity_rows]
            self._older = (last_ids[keep], last_rows, last_index[keep])
        kept = min(unique.numel(), self.capacity_rows)
        rows = out if kept == unique.numel() else out[:kept].clone()
        self._last = (unique[:kept], rows,
                      torch.arange(kept, device=self.device))
        self.stats.rows_requested += unique.numel()
        self.stats.seconds += time.perf_counter() - detect
        # A copy: the caller may write into its batch; the buffer must not
        # change with it.
        return out.clone() if inverse is None else out[inverse]

    def close(self) -> None:
        """Close the inner feature."""
        self.inner.close()

"""Read plans: the block runs a set of rows needs under a gap rule.

`read_plan` is the planner's first step, shared by the storage tier
(`hmgraph.cache.storage_plan`) and the analysis; `hmgraph.cache.disk`
prices the runs it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ReadPlan", "block_span", "read_plan"]


@dataclass
class ReadPlan:
    """Block runs that cover a set of rows.

    Attributes
    ----------
    first, last : numpy.ndarray
        int64 per row (sorted unique ids): first and last block holding it.
    opens : numpy.ndarray
        bool per row: the row starts a new run.
    run_first, run_last : numpy.ndarray
        int64 per run: its first and last block (inclusive).
    """

    first: np.ndarray
    last: np.ndarray
    opens: np.ndarray
    run_first: np.ndarray
    run_last: np.ndarray

    @property
    def blocks(self) -> int:
        """Blocks the runs read (gaps read through included)."""
        return int((self.run_last - self.run_first + 1).sum())

    @property
    def runs(self) -> int:
        """Runs, each one request (before cutting long runs)."""
        return len(self.run_first)

    def covers(self, ids: np.ndarray, row_bytes: int, data_offset: int,
               block_bytes: int) -> np.ndarray:
        """bool per id (sorted): the id's bytes lie inside one run."""
        if not len(ids) or not self.runs:
            return np.zeros(len(ids), dtype=bool)
        first, last = block_span(ids, row_bytes, data_offset, block_bytes)
        run = np.searchsorted(self.run_first, first, side="right") - 1
        inside = run >= 0
        run = np.maximum(run, 0)
        return inside & (last <= self.run_last[run])


def block_span(ids: np.ndarray, row_bytes: int, data_offset: int,
               block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last block (inclusive) holding each row of ``ids``."""
    start = data_offset + np.asarray(ids, dtype=np.int64) * row_bytes
    return start // block_bytes, (start + row_bytes - 1) // block_bytes


def read_plan(ids: np.ndarray, row_bytes: int, data_offset: int,
              block_bytes: int, max_gap_blocks: int) -> ReadPlan:
    """Runs of blocks that read the rows ``ids`` (sorted, unique, int64).

    A row opens a new run unless it begins on, or within
    ``max_gap_blocks`` blocks after, the previous row's last block:
    shorter gaps are read through.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        empty = np.zeros(0, dtype=np.int64)
        return ReadPlan(empty, empty, np.zeros(0, dtype=bool), empty, empty)
    first, last = block_span(ids, row_bytes, data_offset, block_bytes)
    opens = np.ones(len(ids), dtype=bool)
    opens[1:] = first[1:] > last[:-1] + 1 + max_gap_blocks
    heads = np.flatnonzero(opens)
    tails = np.append(heads[1:], len(ids)) - 1
    return ReadPlan(first, last, opens, first[heads], last[tails])

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

Rows the cache below holds on the device for good (its static device
tier, `FeatureCache.static_on_device`) cost no transfer: the buffers
never keep them, and leave their room to the rows that would cross. They
carry a mark in the batch table that no batch counter reaches, set at
`BatchReuse.reset`, so the mark takes no memory of its own.

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

On a CPU device a batch is read by compiled kernels
(`hmgraph.cache.reuse_engine`, ``engine="compiled"``): one loop per pass
over the batch (the table's three entries of an id read in one), with
the GIL released; scratch is kept from batch to batch, the batch's memory
is taken again once the caller let go of it (`BufferPool`), and the only
fresh buffer is the ids asked of the cache below. A cache below that
`reads_in_place` (`FeatureCache.read_into`, its compiled engine) writes
the rest straight into the batch's rows, so only the reused rows are
copied here. The tensor code
(``engine="torch"``) serves CUDA devices and is the reference the
compiled path is tested against: the same rows and counters after every
batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from hmgraph.cache import reuse_engine
from hmgraph.cache.buffers import BufferPool
from hmgraph.cache.counters import ReuseStats
from hmgraph.cache.engine import byte_rows
from hmgraph.cache.feature import Feature, check_ids
from hmgraph.cache.reuse_sizing import member, reuse_profile

__all__ = ["ENGINES", "REUSE_LEVELS", "TABLE_BYTES_PER_ROW", "BatchReuse",
           "ReuseStats", "member", "reuse_profile"]

REUSE_LEVELS = {"none": 0, "one-level": 1, "two-level": 2}
#: Device bytes of the id tables per node (batch counter, position in the
#: batch, lookahead stamp).
TABLE_BYTES_PER_ROW = 12
_NEVER = -(2**31)  # the batch counter of rows never stored
_RESIDENT = reuse_engine.RESIDENT  # ... of rows the cache below holds on
# the device (2**31 - 1)
_WRAP = 2**29  # restart the counter (and clear the tables) here: stamps
# are 4 x the counter
#: How batch reuse reads a batch: compiled kernels (CPU devices), or the
#: tensor code they are tested against (the reference; CUDA devices).
ENGINES = ("compiled", "torch")
_SCRATCH = 6  # int64 rows of scratch per batch row (compiled engine)


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
    engine : str
        ``"compiled"`` (default): kernels of `hmgraph.cache.reuse_engine`
        where the device is a CPU, else the tensor code; ``"torch"``: the
        tensor code (the reference). The attribute `engine` says which
        one reads.

    Notes
    -----
    See `Feature.read`; ``future`` (sorted unique ids of the next batches)
    chooses which rows a batch keeps. Reads are treated as consecutive
    mini-batches: call `reset` at an epoch boundary only if rows may have
    changed (they do not: reuse is exact across epochs too).

    The levels share one ring of ``levels * capacity_rows`` rows: a batch
    writes the rows it keeps after the last batch's, wrapping around, over
    rows no level holds any more. The rows asked of the cache below are
    copied after the ring (staging), so that one gather from ring and
    staging builds the batch: no scatter, and no fresh buffer but the
    batch itself (on the CPU a fresh buffer costs a page fault per 4 KiB).
    The compiled engine needs no staging: one kernel builds the batch,
    in order, from the ring and the rows the cache below returned, or
    only fills in the ring's rows where the cache below wrote the rest
    into the batch (`FeatureCache.reads_in_place`).
    """

    def __init__(self, inner: Feature, levels: int, capacity_rows: int,
                 engine: str = "compiled"):
        if levels not in (1, 2):
            raise ValueError(f"reuse levels must be 1 or 2, got {levels}")
        if capacity_rows < 0:
            raise ValueError(
                f"capacity_rows must be >= 0, got {capacity_rows}")
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; available: "
                             f"{', '.join(ENGINES)}")
        self.inner = inner
        self.levels = levels
        self.capacity_rows = capacity_rows
        self.num_rows = inner.num_rows
        self.row_shape = inner.row_shape
        self.dtype = inner.dtype
        self.device = inner.device
        self.stats = ReuseStats()
        # Per node: the batch it was last stored in, its row there, and
        # the last (batch, distance) stamp of the lookahead; one entry of
        # 12 bytes per node (one cache line for the three).
        self._table = torch.zeros((self.num_rows, 3), dtype=torch.int32,
                                  device=self.device)
        self._batch_of, self._row_of, self._stamp = self._table.unbind(1)
        self._pool = torch.empty((0, *self.row_shape), dtype=self.dtype,
                                 device=self.device)
        #: ``"compiled"`` on a CPU device (unless ``engine="torch"``), else
        #: ``"torch"``.
        self.engine = "compiled" if engine == "compiled" and \
            self.device.type == "cpu" else "torch"
        if self.engine == "compiled":
            self._table_np = self._table.numpy()
            self._batches = BufferPool(self.row_shape, self.dtype)
            self._scratch = np.empty((_SCRATCH, 0), dtype=np.int64)
            self._no_rows = np.zeros((0, self.row_bytes), dtype=np.uint8)
            self._passes = reuse_engine.radix_passes(self.num_rows)
            self._staged_rows = 0  # the staging the reference would hold
            self._warm()
        self.reset()

    def _warm(self) -> None:
        """Load (or compile, the first time on a machine) every kernel for
        these types now, at construction, not in the first batch: each
        runs once over no rows, and nothing is read, kept or counted."""
        none, rows, table = np.zeros(0, np.int64), self._no_rows, \
            self._table_np
        source, rest, where, keys, spare, keep = self._scratch_rows(0)
        reuse_engine.stamp_ids(table, none, 0)
        reuse_engine.scan_batch(none, table, 0, self.levels, 0, 0, 0, 0, 1,
                                0, 0, 0, source, rest, keep, keys)
        reuse_engine.sort_rest(none, rest, 0, self._passes, none, source,
                               where, keys, spare)
        reuse_engine.gather_batch(source, rows, rows, rows)
        reuse_engine.gather_reused(source, rows, rows)
        reuse_engine.write_ring(none, rows, keep, 0, rows, 0, table, 0)

    @property
    def ring_rows(self) -> int:
        """Rows of the ring the levels share."""
        return self.levels * self.capacity_rows

    def reset(self) -> None:
        """Forget the buffered batches."""
        self._batch_of.fill_(_NEVER)
        resident = getattr(self.inner, "static_on_device", None)
        resident = resident() if resident is not None else None
        if resident is not None:
            self._batch_of.masked_fill_(resident, _RESIDENT)
        self._stamp.fill_(_NEVER)
        self._batch = 0
        # Per level (last batch, the one before): where its rows start in
        # the ring, how many it kept, and the first one still valid.
        self._levels = [(0, 0, 0), (0, 0, 0)]
        self._next_only = 0  # the last batch's rows for the next batch only

    @property
    def table_bytes(self) -> int:
        """Device bytes of the id tables."""
        return self.num_rows * TABLE_BYTES_PER_ROW

    @property
    def held_rows(self) -> int:
        """Rows the levels hold now."""
        return sum(count - first for _, count, first in self._levels)

    @property
    def nbytes(self) -> int:
        """Device bytes of the rows the levels hold, and the tables."""
        return self.table_bytes + self.held_rows * self.row_bytes

    @property
    def staging_bytes(self) -> int:
        """Device bytes of the staging after the ring: the most rows one
        batch asked of the cache below (transient rows without reuse).
        The compiled engine counts what the reference would hold."""
        if self.engine == "compiled":
            return self._staged_rows * self.row_bytes
        rows = max(0, self._pool.shape[0] - self.ring_rows)
        return rows * self.row_bytes

    def level_rows(self, age: int) -> torch.Tensor:
        """The rows level ``age`` (1: the last batch) holds, in the order
        it kept them (a copy)."""
        start, count, first = self._levels[age - 1]
        where = self._ring_positions(start + first, count - first)
        return self._pool.index_select(0, where)

    def read(self, ids, future: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """See `Feature.read`; ``future`` is passed to the inner feature."""
        return self._read(check_ids(ids, self.num_rows), future)

    def _ring_positions(self, start: int, count: int) -> torch.Tensor:
        """Ring rows ``start, start + 1, ...`` (``count`` of them), wrapped."""
        positions = torch.arange(start, start + count, device=self.device)
        return positions.remainder_(max(1, self.ring_rows))

    def _read(self, ids, future=()) -> torch.Tensor:
        if self.engine == "compiled":
            return self._read_compiled(ids, future)
        # Everything but the inner read counts in `stats.seconds`: the
        # lookups, the row copies, keeping the batch, and moving the ids
        # of the rest to the host (a sync on CUDA).
        began = _clock()
        ids = ids.to(self.device)
        # (1) In which batch each id was last stored, and where.
        batch_of = self._batch_of.index_select(0, ids)
        source = self._row_of.index_select(0, ids).long()
        served = torch.zeros_like(ids, dtype=torch.bool)
        for age in range(1, self.levels + 1):
            start, _, first = self._levels[age - 1]
            hit = batch_of == self._batch - age
            if first:  # rows before `first` went; positions wrap
                hit &= (source - start).remainder_(self.ring_rows) >= first
            served |= hit
            count = int(hit.sum())
            self.stats.reused[f"level{age}"] += count
            self.stats.bytes_saved += count * self.row_bytes
        # (2) The rest from the cache below, asked in sorted order (it
        # then neither sorts them nor reorders its rows), into staging.
        rest = (~served).nonzero().squeeze(1)
        inner = (0.0, 0.0)
        if rest.numel():
            wanted, order = ids.index_select(0, rest).sort()
            wanted = wanted.cpu()
            start = _clock()
            rows = self.inner.read(wanted, future)
            inner = _since(start)
            copy = time.perf_counter()
            staged = self._staging(rest.numel())
            staged.copy_(rows)
            del rows
            source.index_copy_(0, rest.index_select(0, order), torch.arange(
                self.ring_rows, self.ring_rows + rest.numel(),
                device=self.device))
            self.stats.copy_seconds += time.perf_counter() - copy
        # (3) One gather builds the batch from ring and staging.
        copy = time.perf_counter()
        out = self._pool.index_select(0, source)
        self.stats.copy_seconds += time.perf_counter() - copy
        # (4) Keep copies (the caller may write into `out`), but not of
        # rows the cache below serves on the device anyway.
        self._keep(ids, out, future, batch_of != _RESIDENT)
        self.stats.rows_requested += ids.numel()
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.nbytes)
        self.stats.staging_bytes = self.staging_bytes
        self._count_seconds(began, inner)
        return out

    def _count_seconds(self, began, inner) -> None:
        """Wall and this thread's CPU seconds since ``began`` (`_clock`),
        less the reads below's (``inner``), into the counters."""
        wall, cpu = _since(began)
        self.stats.seconds += wall - inner[0]
        self.stats.cpu_seconds += cpu - inner[1]

    def _staging(self, rows: int) -> torch.Tensor:
        """``rows`` rows of staging after the ring (grown by a quarter
        more than asked when short, the ring's rows moved along)."""
        ring = self.ring_rows
        if self._pool.shape[0] < ring + rows:
            pool = torch.empty((ring + rows + rows // 4, *self.row_shape),
                               dtype=self.dtype, device=self.device)
            pool[:min(ring, self._pool.shape[0])].copy_(self._pool[:ring])
            self._pool = pool
        return self._pool[ring:ring + rows]

    def _keep(self, ids, out, future, movable) -> None:
        """Keep the rows of ``out`` that the next ``levels`` batches ask
        for (the next batch's first); without ``future``, the first rows.
        Only rows where ``movable`` (bool per id) are kept.

        The last batch becomes the older level with only its rows for the
        batch after next (where they are), and the levels share
        ``levels * capacity_rows``.
        """
        older, head = (0, 0, 0), 0
        if self.levels == 2:
            start, count, _ = self._levels[0]
            older = (start, count, min(count, self._next_only))
            head = (start + count) % max(1, self.ring_rows)
        room = self.ring_rows - (older[1] - older[2])
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
            keep = [((seen == stamp - d) & movable).nonzero().squeeze(1)
                    for d in range(len(coming))]
            next_only = min(keep[0].numel(), room)
            keep = torch.cat(keep)[:room]
        else:
            next_only = 0
            keep = movable.nonzero().squeeze(1)[:room]
        copy = time.perf_counter()
        count = keep.numel()
        if count:
            self._staging(0)  # the ring exists
            self._write_ring(head, out, keep)
            kept = ids.index_select(0, keep)
            self._batch_of.index_fill_(0, kept, self._batch)
            self._row_of.index_copy_(
                0, kept, self._ring_positions(head, count).int())
        self._levels = [(head, count, 0), older]
        self._next_only = next_only
        self.stats.copy_seconds += time.perf_counter() - copy
        self._batch += 1
        if self._batch >= _WRAP:
            self.reset()

    def _write_ring(self, head: int, out, keep) -> None:
        """Rows ``out[keep]`` into the ring from row ``head`` on, in at
        most two gathers straight into it (the second after wrapping)."""
        ring = self.ring_rows
        first = min(keep.numel(), ring - head)
        torch.index_select(out, 0, keep[:first],
                           out=self._pool[head:head + first])
        if first < keep.numel():
            rest = keep.numel() - first
            torch.index_select(out, 0, keep[first:],
                               out=self._pool[:rest])

    def _read_compiled(self, ids, future=()) -> torch.Tensor:
        """`_read` through the kernels of `hmgraph.cache.reuse_engine`:
        the same decisions, rows and counters in fewer passes."""
        began = _clock()
        ids_np = ids.numpy()
        count = len(ids_np)
        source, rest, where, keys, spare, keep = self._scratch_rows(count)
        table = self._table_np
        # (1) Stamp the coming batches' ids, the nearest last so that it
        # wins (as `_keep`); then one pass finds the rows the levels hold
        # and the rows the batch keeps.
        # The kernels do not check bounds: ids out of range raise here, as
        # the reference's indexing does.
        stamp = self._batch * 4
        coming = [check_ids(f, self.num_rows).numpy()
                  for f in list(future)[:self.levels]] if len(future) else []
        for distance in reversed(range(len(coming))):
            reuse_engine.stamp_ids(table, coming[distance], stamp - distance)
        older, head = (0, 0, 0), 0
        if self.levels == 2:
            start, kept, _ = self._levels[0]
            older = (start, kept, min(kept, self._next_only))
            head = (start + kept) % max(1, self.ring_rows)
        (start1, _, first1), (start2, _, first2) = self._levels
        level1, level2, missing, kept, next_only = reuse_engine.scan_batch(
            ids_np, table, self._batch, self.levels, start1, first1, start2,
            first2, max(1, self.ring_rows), stamp, len(coming),
            self.ring_rows - (older[1] - older[2]), source, rest, keep, keys)
        reused = self.stats.reused
        reused["level1"] += level1
        reused["level2"] += level2
        self.stats.bytes_saved += (level1 + level2) * self.row_bytes
        # (2) The rest from the cache below, asked in sorted order. Should
        # it fail, only the stamps moved: they choose what a batch keeps,
        # never which rows it reads.
        # Where the cache below writes rows in place, it writes them into
        # the batch (`FeatureCache.read_into`): no copy of them here.
        out = self._batches.empty(count)
        out_rows = byte_rows(out)
        in_place = getattr(self.inner, "reads_in_place", False)
        inner, rows = (0.0, 0.0), self._no_rows
        if missing:
            wanted = np.empty(missing, dtype=np.int64)
            reuse_engine.sort_rest(ids_np, rest, missing, self._passes,
                                   wanted, source, where, keys, spare)
            start = _clock()
            if in_place:
                self.inner.read_into(torch.from_numpy(wanted), out,
                                     where[:missing], future)
            else:
                rows = byte_rows(self.inner.read(torch.from_numpy(wanted),
                                                 future))
            inner = _since(start)
            if self._staged_rows < missing:
                self._staged_rows = missing + missing // 4
        # (3) One pass builds the batch from the ring and those rows (or
        # only the ring's, the rest in place); (4) the rows kept are
        # copied into the ring.
        copy = time.perf_counter()
        ring = self._ring()
        if in_place:
            reuse_engine.gather_reused(source[:count], ring, out_rows)
        else:
            reuse_engine.gather_batch(source[:count], ring, rows, out_rows)
        del rows
        reuse_engine.write_ring(ids_np, out_rows, keep, kept, ring, head,
                                table, self._batch)
        self.stats.copy_seconds += time.perf_counter() - copy
        self._levels = [(head, kept, 0), older]
        self._next_only = next_only
        self._batch += 1
        if self._batch >= _WRAP:
            self.reset()
        self.stats.rows_requested += count
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.nbytes)
        self.stats.staging_bytes = self.staging_bytes
        self._count_seconds(began, inner)
        return out

    def _scratch_rows(self, count: int) -> np.ndarray:
        """`_SCRATCH` int64 rows of at least ``count`` entries, reused from
        batch to batch (grown by a quarter more than asked when short)."""
        if self._scratch.shape[1] < count:
            self._scratch = np.empty((_SCRATCH, count + count // 4),
                                     dtype=np.int64)
        return self._scratch

    def _ring(self) -> np.ndarray:
        """The ring's rows as bytes (allocated on first use)."""
        if self._pool.shape[0] < self.ring_rows:
            self._pool = torch.empty((self.ring_rows, *self.row_shape),
                                     dtype=self.dtype)
        return byte_rows(self._pool[:self.ring_rows])

    def release_buffers(self) -> None:
        """See `Feature.release_buffers` (the inner feature's are its
        own); the ring stays."""
        if self.engine == "compiled":
            self._batches.clear()

    def keep_buffers(self, batches: int) -> None:
        """See `Feature.keep_buffers` (the inner feature's are its own)."""
        if self.engine == "compiled":
            self._batches.resize(batches)

    def close(self) -> None:
        """Close the inner feature; let go of the batch buffers."""
        self.release_buffers()
        self.inner.close()


def _clock() -> tuple[float, float]:
    """Wall seconds and this thread's CPU seconds, now."""
    return time.perf_counter(), time.thread_time()


def _since(began: tuple[float, float]) -> tuple[float, float]:
    """Wall and CPU seconds since ``began`` (`_clock`)."""
    wall, cpu = _clock()
    return wall - began[0], cpu - began[1]

"""The storage tier: rows read from a feature file on disk with O_DIRECT.

`StorageFeature` is the bottom of the tier stack (disk -> host -> device).
It reads rows straight from the file written by `hmgraph.cache.format`,
bypassing the OS page cache with ``O_DIRECT`` so that what a benchmark
measures is the SSD, not RAM.

One read request goes through five steps, all vectorised over the ids:

1. Deduplicate and sort the ids.
2. Map each row's byte range to its range of blocks: the disk's logical
   blocks, the smallest unit ``O_DIRECT`` can read.
3. Coalesce the blocks into runs of consecutive blocks, reading short
   gaps through (steps 2-3: `hmgraph.cache.storage_plan`).
4. Group the runs into tasks of about ``chunk_bytes`` and read them with
   no GIL held: through io_uring rings, or on ``num_threads`` threads
   each calling ``pread`` in a compiled loop (`~.storage_reads`).
5. Copy each row out of its task's buffer straight to its place in the
   output (compiled too): no second pass to reorder them.

The block size, the longest gap read through, the request size and how
many requests to keep in flight come from the disk's measured model
(`hmgraph.cache.disk`), not from guesses.

The counters (`StorageStats`, kept in `hmgraph.cache.counters`) are in the
disk's units: requests, blocks and bytes read, the bytes of the rows
served, their ratio (read amplification), and the model's seconds for the
reads issued next to the seconds they took. Where the filesystem refuses
``O_DIRECT`` the tier reads buffered and warns once.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.buffers import BufferPool
from hmgraph.cache.counters import StorageStats
from hmgraph.cache.disk import FALLBACK, DiskModel, disk_model, read_plan
from hmgraph.cache.engine import argsort, byte_rows
from hmgraph.cache.feature import Feature, check_ids, torch_dtype
from hmgraph.cache.format import PAGE_BYTES, read_manifest
from hmgraph.cache.storage_plan import (
    ReadTask,
    check_sizes,
    plan_tasks,
    read_sizes,
)
from hmgraph.cache.storage_reads import TaskReader, open_direct

__all__ = ["DRIFT", "StorageFeature", "StorageStats"]

log = logging.getLogger(__name__)

#: An epoch's measured / modelled read seconds past which (or 1 / it) drift.
DRIFT = 1.5


class StorageFeature(Feature):
    """Rows of a feature file, read from disk with ``O_DIRECT``.

    Parameters
    ----------
    path : str or os.PathLike
        A feature file written by `hmgraph.cache.format.write_feature_file`.
    num_threads : int, optional
        Threads issuing reads, the deepest queue; default the depth where
        the disk's random reads/s stop growing (`hmgraph.cache.disk.
        disk_model`), 4 without a model. A request keeps in flight the
        depth priced soonest (`DiskModel.depth_for`), at most this.
    direct : bool
        Open with ``O_DIRECT`` (bypass the page cache); default True. Where
        the filesystem refuses it, reads are buffered and a
        ``RuntimeWarning`` naming the file is emitted once.
    disk : DiskModel, "auto" or None
        What the disk charges: ``"auto"`` (default) measures the device
        once (at ``num_threads`` queue depth where given, else at the depth
        where its reads/s stop growing; cached beside the file, see
        `hmgraph.cache.disk.disk_model`); None uses
        `hmgraph.cache.disk.FALLBACK` (4 KiB pages, no measurement).
    block_bytes : int, optional
        Read unit; default the model's logical block size (the page size
        for buffered reads). Must divide 4096.
    max_run_bytes : int, optional
        Largest single read, in bytes; default the request size the disk
        model measured fastest (`DiskModel.run_bytes`), or ``chunk_bytes``
        if less. Rounded down to whole blocks; must be at least 4096.
    chunk_bytes : int, optional
        Target size of one piece (a read buffer's worth), in bytes;
        default twice ``max_run_bytes``, at least it (a piece holds whole
        runs and rows, so its buffer can reach about twice this). Small
        requests are split so that every thread gets work (see
        `hmgraph.cache.storage_plan`).
    max_gap_bytes : int, optional
        Blocks between two wanted blocks are read too when the gap is at
        most this many bytes; default the model's break-even gap
        (`DiskModel.gap_bytes`). 0 reads wanted blocks only.
    engine : str
        ``"auto"`` (default): ``O_DIRECT`` reads through io_uring rings
        where the kernel allows them (`hmgraph.cache.uring`: less CPU a
        read, deeper queues), else on the threads; ``"threads"``;
        ``"uring"`` (refused without io_uring).

    Attributes
    ----------
    path : pathlib.Path
        The feature file.
    num_rows : int
        Number of rows.
    row_shape : tuple of int
        Shape of one row.
    dtype : torch.dtype
        Element type of the rows.
    direct : bool
        Whether ``O_DIRECT`` is actually in use.
    disk : DiskModel
        The model reads are planned and priced with.
    stats : StorageStats
        Counters of all reads so far.
    remedy : str
        The way out that the message of a file found cut short names;
        `hmgraph.cache.format.REBUILD` unless the opener sets another (for
        a file that hmgraph does not make again).

    Examples
    --------
    >>> with StorageFeature("feat.bin") as feature:  # doctest: +SKIP
    ...     rows = feature.read(torch.tensor([5, 0, 5]))
    """

    #: An epoch's reads shorter than this (measured and modelled seconds)
    #: say nothing about drift: measuring again takes some 3 s, which an
    #: epoch of 20 batches would pay in full.
    drift_min_seconds: float = 30.0
    #: 1-minute load average per CPU over which the CPUs are busy: slow
    #: reads and a new measurement then say as much of them as of the disk.
    busy_load: float = 1.0

    def __init__(
        self,
        path: str | os.PathLike,
        num_threads: int | None = None,
        direct: bool = True,
        disk: DiskModel | str | None = "auto",
        block_bytes: int | None = None,
        max_run_bytes: int | None = None,
        chunk_bytes: int | None = None,
        max_gap_bytes: int | None = None,
        engine: str = "auto",
    ):
        if num_threads is not None and (
                not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(
                f"num_threads must be a positive int, got {num_threads!r}"
            )
        if disk not in ("auto", None) and not isinstance(disk, DiskModel):
            raise ValueError(
                f"disk must be a DiskModel, 'auto' or None, got {disk!r}"
            )
        check_sizes(max_run_bytes, chunk_bytes, max_gap_bytes)
        self._fd = -1
        self._closed = True
        self.path = Path(path)
        manifest = read_manifest(self.path)
        if manifest.data_offset % PAGE_BYTES:
            raise ValueError(
                f"{self.path}: data offset {manifest.data_offset} is not a "
                f"multiple of {PAGE_BYTES}; O_DIRECT cannot read it"
            )
        self.num_rows = manifest.num_rows
        self.row_shape = manifest.row_shape
        self.dtype = torch_dtype(manifest.dtype)
        self._np_dtype = np.dtype(manifest.dtype)
        self._row_nbytes = manifest.row_bytes
        self._row_numel = int(np.prod(self.row_shape, dtype=np.int64))
        self._data_offset = manifest.data_offset
        self._file_bytes = manifest.file_bytes
        self._fd, self.direct = open_direct(self.path, direct)
        self._asked_depth = num_threads
        self._auto_model = disk == "auto" and self.direct
        self._default_gap = max_gap_bytes is None
        try:
            if disk == "auto":
                disk = disk_model(self.path, num_threads) if self.direct \
                    else FALLBACK
            self.disk = disk or FALLBACK
            self._set_geometry(num_threads or self.disk.queue_depth,
                               block_bytes, max_run_bytes, chunk_bytes,
                               max_gap_bytes)
            self._reader = TaskReader(
                self._fd, self.direct, self.block_bytes, self._row_nbytes,
                self.num_threads, self.path, self._file_bytes,
                self._sink_bytes(), engine)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self.stats = StorageStats(block_bytes=self.block_bytes)
        self._epoch_mark = (0.0, 0.0)
        self._refreshed = False
        self._lock = threading.Lock()
        # Batches' rows in reused memory, once nobody holds them.
        self._rows = BufferPool(self.row_shape, self.dtype)
        self._closed = False

    def _set_geometry(self, num_threads: int, block_bytes: int | None,
                      max_run_bytes: int | None, chunk_bytes: int | None,
                      max_gap_bytes: int | None) -> None:
        """Fill in the read sizes' defaults (`storage_plan.read_sizes`)."""
        (self.block_bytes, self.max_gap_bytes, self._max_run_blocks,
         self._chunk_blocks) = read_sizes(
            self.disk, self.direct, self._np_dtype.itemsize, block_bytes,
            max_run_bytes, chunk_bytes, max_gap_bytes)
        self._max_gap_blocks = self.max_gap_bytes // self.block_bytes
        self.num_threads = num_threads

    def read(self, ids) -> torch.Tensor:
        """See `Feature.read`: rows from the file's blocks, on the CPU.

        Raises
        ------
        ValueError
            If the feature is closed, or the file was cut short since it
            was opened.
        """
        self._check_open()
        return super().read(ids)

    def read_along(self, ids, candidates: torch.Tensor,
                   limit: int | None = None, rank: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows of ``ids``, plus the candidates their reads bring along.

        A candidate whose bytes lie inside the block runs planned for
        ``ids`` (on a block read anyway, or in a gap read through) costs
        no request and no byte more; it is returned too.

        Parameters
        ----------
        ids : torch.Tensor
            Ids to read, as for `read`.
        candidates : torch.Tensor
            Sorted unique int64 ids worth having (e.g. rows the next
            batches need), disjoint from ``ids``.
        limit : int, optional
            Bring along at most this many candidates (room to keep them).
        rank : torch.Tensor, optional
            Per candidate, smaller is wanted sooner: which to bring along
            when more than ``limit`` are on blocks read.

        Returns
        -------
        (torch.Tensor, torch.Tensor, torch.Tensor)
            The rows of ``ids``; the candidates brought along (sorted) and
            their rows.
        """
        self._check_open()
        ids = check_ids(ids, self.num_rows)
        if ids.numel() < 2 or bool((ids[1:] > ids[:-1]).all()):
            unique, inverse = ids, None  # sorted unique already
        else:
            unique, inverse = torch.unique(ids, sorted=True,
                                           return_inverse=True)
        taken = candidates[:0]
        if unique.numel() and candidates.numel() and self._row_numel:
            plan = read_plan(unique.numpy(), self._row_nbytes,
                             self._data_offset, self.block_bytes,
                             self._max_gap_blocks)
            inside = plan.covers(candidates.numpy(), self._row_nbytes,
                                 self._data_offset, self.block_bytes)
            taken = candidates[torch.from_numpy(inside)]
            if limit is not None and taken.numel() > limit:
                first = torch.argsort(rank[torch.from_numpy(inside)],
                                      stable=True)[:limit]
                taken = taken[first.sort().values]
        if not taken.numel():
            return self._read(ids), taken, torch.empty(
                (0, *self.row_shape), dtype=self.dtype)
        union, order = torch.sort(torch.cat([unique, taken]))
        rows = self._read_sorted(union)
        where = torch.empty_like(order)
        where[order] = torch.arange(order.numel())
        mine = rows[where[:unique.numel()] if inverse is None
                    else where[:unique.numel()][inverse]]
        return mine, taken, rows[where[unique.numel():]]

    @property
    def geometry(self) -> tuple[int, int, int]:
        """``(row_bytes, data_offset, block_bytes)``: where rows lie."""
        return self._row_nbytes, self._data_offset, self.block_bytes

    @property
    def max_gap_blocks(self) -> int:
        """Gaps of at most this many blocks are read through."""
        return self._max_gap_blocks

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"StorageFeature of {self.path} is closed")

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        # A radix sort: torch's sorts int64 ids some 70x slower on the
        # CPU (160,000 ids: 1 against 68-97 ms).
        order = argsort(ids.numpy(), self.num_rows)
        unique = ids.numpy()[order]
        if len(unique) > 1 and bool((unique[1:] == unique[:-1]).any()):
            unique, inverse = np.unique(ids.numpy(), return_inverse=True)
            rows = self._read_sorted(torch.from_numpy(unique), len(ids))
            # index_select: on the CPU 2x faster than ``rows[inverse]``.
            return rows.index_select(0, torch.from_numpy(inverse))
        # Unique ids (DGL's input nodes): each row read straight into its
        # place in request order, with no second pass to reorder them.
        rows = self._rows.empty(len(ids))
        self.read_into(unique, (byte_rows(rows),),
                       np.zeros(len(unique), dtype=np.int64), order)
        return rows

    def read_into(self, unique: np.ndarray, targets: tuple,
                  which: np.ndarray, where: np.ndarray) -> None:
        """Read sorted unique rows straight into their places.

        Row ``unique[i]`` goes to row ``where[i]`` of ``targets[which[i]]``
        (``(rows, row_bytes)`` uint8 matrices, `hmgraph.cache.engine.
        byte_rows` of CPU tensors): the compiled engine reads misses into
        the batch's output and rows brought along into staging slots in
        one plan, with no intermediate copy. Ids are not validated here.
        """
        self.read_into_later(unique, targets, which, where)()

    def read_into_later(self, unique: np.ndarray, targets: tuple,
                        which: np.ndarray, where: np.ndarray):
        """`read_into`, started: the reads are planned and queued on the
        tier's threads, and a function is returned that waits for them
        (and raises what they raised). The caller works on meanwhile, on
        other memory than the rows being read (the compiled cache copies
        its hits and takes its policy's decisions beside the disk)."""
        self._check_open()
        return self._start(torch.from_numpy(unique), None,
                           (targets, which, where))

    def _read_sorted(self, unique: torch.Tensor,
                     requested: int | None = None) -> torch.Tensor:
        """Rows of sorted unique ids: plan, read in tasks, gather."""
        rows = torch.empty((len(unique), *self.row_shape), dtype=self.dtype)
        into = ((byte_rows(rows),), np.zeros(len(unique), np.int64),
                np.arange(len(unique)))
        self._start(unique, requested, into)()
        return rows

    def _start(self, unique: torch.Tensor, requested: int | None,
               into: tuple):
        """Plan the reads of sorted unique ids, queue them (rows to
        ``(targets, which, where)``); return the function that waits."""
        futures, planning = [], 0.0
        if len(unique) and self._row_numel:
            began = time.perf_counter()
            tasks = self._plan(unique.numpy())
            into = (*into, self._reader.direct_bases(into[0]))
            planning = time.perf_counter() - began
            try:
                futures = self._reader.submit(tasks, into)
            except RuntimeError:  # the pool was shut down meanwhile
                raise ValueError(
                    f"StorageFeature of {self.path} is closed"
                ) from None
        return functools.partial(self._finish, futures, unique, requested,
                                 planning)

    def _finish(self, futures, unique, requested, planning) -> None:
        """Wait for every task of a read, then count it (or raise the
        first task's error): no task may still write into rows its
        caller has given up on and handed out again. Its seconds are the
        planning's and the tasks' span, from the first start to the last
        end: not the caller's work beside them, nor a wait for threads
        still busy with another read."""
        blocks, nbytes, reads, span, cpu = self._reader.wait(futures)
        with self._lock:
            stats = self.stats
            stats.calls += 1
            stats.rows_requested += len(unique) if requested is None \
                else requested
            stats.rows_read += len(unique)
            stats.blocks_read += blocks
            stats.bytes_read += nbytes
            stats.useful_bytes += len(unique) * self._row_nbytes
            stats.io_requests += reads
            stats.seconds += planning + span
            stats.cpu_seconds += cpu
            stats.model_seconds += self.disk.seconds(reads, nbytes)

    def _plan(self, unique: np.ndarray) -> list[ReadTask]:
        """Block runs, pieces and tasks for sorted unique row ids
        (`hmgraph.cache.storage_plan.plan_tasks`)."""
        return plan_tasks(
            unique, self._row_nbytes, self._data_offset, self.block_bytes,
            max_gap_blocks=self._max_gap_blocks,
            max_run_blocks=self._max_run_blocks,
            chunk_blocks=self._chunk_blocks, num_threads=self.num_threads,
            disk=self.disk)

    def _sink_bytes(self) -> int:
        """Bytes of the sink direct reads drop gaps read through into."""
        return max(self._max_gap_blocks, 1) * self.block_bytes

    @property
    def engine(self) -> str:
        """``"uring"`` (reads through rings) or ``"threads"``."""
        return self._reader.engine

    @property
    def remedy(self) -> str:
        """The way out that the message of a file found cut short names
        (the class's Attributes); kept by the reader of its tasks."""
        return self._reader.remedy

    @remedy.setter
    def remedy(self, remedy: str) -> None:
        self._reader.remedy = remedy

    def close(self) -> None:
        """Stop the threads and close the file; idempotent.

        Reading afterwards raises ``ValueError``.
        """
        if self._closed:
            return
        self._closed = True
        self._reader.shutdown()  # no read touches the fd after this
        os.close(self._fd)
        self._fd = -1
        self._rows.clear()

    def keep_buffers(self, batches: int) -> None:
        """See `Feature.keep_buffers`."""
        self._rows.resize(batches)

    def release_buffers(self) -> None:
        """See `Feature.release_buffers`; at an epoch's end, also checks
        the measured disk model against the epoch's reads."""
        self._rows.clear()
        self._check_drift()

    def _check_drift(self) -> None:
        """Measure the disk again once its model drifts from the reads.

        Where the epoch's reads took more than `DRIFT` times what the
        model priced them at, or less than 1 / `DRIFT` of it (over at
        least `drift_min_seconds`), the device is measured again
        (`hmgraph.cache.disk.disk_model` with ``refresh``: the file beside
        the feature file is rewritten) and the tier plans its reads with
        the new model. Once per feature: a second drift is the workload's,
        not the disk's. With busy CPUs (`busy_load`) the new model is this
        process's only: the file keeps the one later runs are priced with.
        """
        stats = self.stats
        mark = self._epoch_mark
        if stats.seconds < mark[0] or stats.model_seconds < mark[1]:
            mark = (0.0, 0.0)  # the counters were reset meanwhile
        seconds = stats.seconds - mark[0]
        model = stats.model_seconds - mark[1]
        self._epoch_mark = (stats.seconds, stats.model_seconds)
        if self._refreshed or not self._auto_model \
                or max(seconds, model) < self.drift_min_seconds or not model:
            return
        ratio = seconds / model
        if 1 / DRIFT <= ratio <= DRIFT:
            return
        self._refreshed = True
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        log.warning("%s: the epoch's reads took %.1f s, %.2fx the disk "
                    "model's %.1f s; measuring the disk again%s", self.path,
                    seconds, ratio, model, f" for this run only (load "
                    f"{load:.2f} a CPU)" * (load > self.busy_load))
        self.disk = disk_model(self.path, self._asked_depth, refresh=True,
                               keep=load <= self.busy_load)
        if self._default_gap:
            self.max_gap_bytes = self.disk.gap_bytes
            self._max_gap_blocks = self.max_gap_bytes // self.block_bytes
            self._reader.sink_bytes = self._sink_bytes()
        log.info("%s: %s (a new queue depth and request size apply from "
                 "the next StorageFeature)", self.path, self.disk.describe())

    def __del__(self):
        try:
            self.close()
        except Exception:  # best effort at interpreter exit
            pass

    def __repr__(self) -> str:
        return (f"StorageFeature({str(self.path)!r}, "
                f"num_rows={self.num_rows}, row_shape={self.row_shape}, "
                f"dtype={self.dtype}, direct={self.direct}, "
                f"block_bytes={self.block_bytes})")

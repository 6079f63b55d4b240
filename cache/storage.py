"""The storage tier: rows read from a feature file on disk with O_DIRECT.

`StorageFeature` is the bottom of the tier stack (disk -> host -> device).
It reads rows straight from the file written by `hmgraph.cache.format`,
bypassing the OS page cache with ``O_DIRECT`` so that what a benchmark
measures is the SSD, not RAM.

One read request goes through five steps, all vectorised over the ids:

1. Deduplicate and sort the ids.
2. Map each row's byte range to its range of blocks: the disk's logical
   blocks (512 B on most disks), the smallest unit ``O_DIRECT`` can read.
   Rows may straddle blocks; the data start is page aligned.
3. Coalesce the blocks into runs of consecutive blocks: rows on the same
   block or on blocks at most ``max_gap_bytes`` apart share one run (the
   gap is read too), and no run exceeds ``max_run_bytes``. By default the
   block size and the gap come from the disk's measured model
   (`hmgraph.cache.disk`): a gap is read through when moving its bytes
   costs less than one more request.
4. Group the runs into tasks of about ``chunk_bytes`` and hand them to a
   pool of ``num_threads`` threads. Each task reads its runs into one
   page-aligned buffer (an anonymous ``mmap``) in a compiled loop of
   ``pread`` calls that holds no GIL (`hmgraph.cache.diskio`), so
   ``num_threads`` requests stay in flight while sampling and training
   go on.
5. Copy each row out of its task's buffer straight to its place in the
   output (compiled too): no second pass to reorder them.

How many requests to keep in flight is measured, not guessed: the disk
model (`hmgraph.cache.disk`) tries depths 1 to 128 and the tier uses the
depth where random reads/s stop growing (64 on the virtio disk this was
written on, with 3.6x the reads/s of depth 4). The same model prices a
request against a byte, so a gap is read through only when it is cheaper
than one more request at that depth (10 KiB there, against 49 KiB at
depth 4).

The counters (`StorageStats`) are in the disk's units: requests
(``pread`` calls), blocks and bytes read, the bytes of the rows served,
their ratio (read amplification), and the model's seconds for the reads
issued next to the seconds they took.

Where the filesystem refuses ``O_DIRECT`` the tier falls back to buffered
reads and warns once.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import logging
import mmap
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from .buffers import BufferPool
from .disk import FALLBACK, DiskModel, disk_model, read_plan
from .diskio import IOV_MAX, address, read_direct, read_pieces, read_runs
from .engine import argsort, byte_rows, scatter_rows
from .feature import Feature, check_ids, torch_dtype
from .format import PAGE_BYTES, REBUILD, read_manifest

__all__ = ["DRIFT", "StorageFeature", "StorageStats"]

log = logging.getLogger(__name__)

#: Measured read seconds over the model's, for an epoch, beyond which (or
#: under whose inverse) the disk is measured again.
DRIFT = 1.5


@dataclass
class StorageStats:
    """Counters of a `StorageFeature`, in the disk's units; exact sums.

    Attributes
    ----------
    calls : int
        Calls of ``read``.
    rows_requested : int
        Ids asked for, duplicates included.
    rows_read : int
        Unique rows read from the file.
    blocks_read : int
        Blocks of ``block_bytes`` read (gaps read through included).
    block_bytes : int
        The read unit: the disk's logical block size, or the page size.
    bytes_read : int
        Bytes transferred from the file (``blocks_read * block_bytes``
        unless a read stopped short).
    useful_bytes : int
        Bytes of the rows read (``rows_read * row_bytes``).
    io_requests : int
        ``pread`` calls: the requests the disk served.
    seconds : float
        Seconds the reads took: planning, then from the first task's
        start to the last one's end (not the caller's work beside them).
    model_seconds : float
        What the disk model prices the same requests and bytes at
        (``io_requests / iops + bytes_read / bandwidth``).
    cpu_seconds : float
        CPU time of the tier's threads (the reads' system calls and the
        copies of rows out of the read buffers), summed over threads.
    """

    calls: int = 0
    rows_requested: int = 0
    rows_read: int = 0
    blocks_read: int = 0
    block_bytes: int = PAGE_BYTES
    bytes_read: int = 0
    useful_bytes: int = 0
    io_requests: int = 0
    seconds: float = 0.0
    model_seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def amplification(self) -> float:
        """Bytes read per byte of row served (0.0 before any read)."""
        return self.bytes_read / self.useful_bytes if self.useful_bytes \
            else 0.0

    def reset(self) -> None:
        """Set every counter back to zero (the block size stays)."""
        for field in fields(self):
            if field.name != "block_bytes":
                setattr(self, field.name, field.default)

    def as_dict(self) -> dict:
        """The counters as a plain dict, amplification included."""
        record = asdict(self)
        record["amplification"] = self.amplification
        record["seconds_vs_model"] = (self.seconds / self.model_seconds
                                      if self.model_seconds else None)
        return record


@dataclass(frozen=True)
class _Reads:
    """A request's plan: block runs in pieces, each piece's rows.

    Runs are in bytes; a run's buffer offset and a row's offset count from
    the start of its piece's buffer (pieces are read one at a time).
    """

    run_file: np.ndarray  # int64 per run: file offset
    run_bytes: np.ndarray  # int64 per run: length
    run_buffer: np.ndarray  # int64 per run: offset in its piece's buffer
    piece_runs: np.ndarray  # int64, pieces + 1: each piece's first run
    piece_rows: np.ndarray  # int64, pieces + 1: each piece's first row
    row_offsets: np.ndarray  # int64 per row: offset in its piece's buffer
    row_file: np.ndarray  # int64 per row: offset in the file


@dataclass(frozen=True)
class _Task:
    """One thread's share of a request: pieces ``first`` to ``stop - 1``
    of ``reads``, through a buffer of ``buffer_bytes``."""

    reads: _Reads
    first: int
    stop: int
    buffer_bytes: int
    blocks: int


class StorageFeature(Feature):
    """Rows of a feature file, read from disk with ``O_DIRECT``.

    Parameters
    ----------
    path : str or os.PathLike
        A feature file written by `hmgraph.cache.format.write_feature_file`.
    num_threads : int, optional
        Threads issuing reads, the deepest queue; default the depth where
        the disk's random reads/s stop growing (`hmgraph.cache.disk.
        disk_model`), 4 without a measured model. Each request keeps the
        depth the model prices it soonest at in flight (`DiskModel.
        depth_for`: all of them for many small reads, fewer for long
        runs), at most this many.
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
        default twice ``max_run_bytes``. Must be at least
        ``max_run_bytes``, since a piece holds whole runs. A piece holds
        whole rows and keeps adjacent rows together up to this size, so
        its buffer can reach about twice this (plus one row). Small
        requests are split further so that every thread gets work. A
        thread reads such a piece, copies its rows
        into place, then reads the next, so the disk and the copies are
        busy together: while one thread copies, the others' reads are in
        flight (on synth-small's batches of 80 MB, 0.057 s a batch with
        pieces of two 256 KiB runs against 0.079 s with one 4 MiB buffer
        of 4 MiB runs per task).
    max_gap_bytes : int, optional
        Blocks between two wanted blocks are read too when the gap is at
        most this many bytes; default the model's break-even gap
        (`DiskModel.gap_bytes`). 0 reads wanted blocks only.

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

    remedy: str = REBUILD
    #: An epoch's reads shorter than this (measured and modelled seconds)
    #: say nothing about drift: measuring again takes some 3 s, which an
    #: epoch of 20 batches would pay in full (bench/loader.py measured
    #: again at the end of every pass at 1 s).
    drift_min_seconds: float = 30.0

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
        if max_run_bytes is not None and max_run_bytes < PAGE_BYTES:
            raise ValueError(
                f"max_run_bytes must be at least one page ({PAGE_BYTES}), "
                f"got {max_run_bytes}"
            )
        least = max_run_bytes or PAGE_BYTES
        if chunk_bytes is not None and chunk_bytes < least:
            raise ValueError(
                f"chunk_bytes ({chunk_bytes}) must be at least max_run_bytes "
                f"({least}): a task reads whole runs"
            )
        if max_gap_bytes is not None and max_gap_bytes < 0:
            raise ValueError(
                f"max_gap_bytes must be >= 0, got {max_gap_bytes}"
            )
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
        self._fd, self.direct = self._open(direct)
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
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self.stats = StorageStats(block_bytes=self.block_bytes)
        self._epoch_mark = (0.0, 0.0)
        self._refreshed = False
        self._lock = threading.Lock()
        self._buffers = threading.local()
        # Batches' rows in reused memory, once nobody holds them.
        self._rows = BufferPool(self.row_shape, self.dtype)
        self._pool = ThreadPoolExecutor(
            self.num_threads, thread_name_prefix="hmgraph-storage"
        )
        self._closed = False

    def _set_geometry(self, num_threads: int, block_bytes: int | None,
                      max_run_bytes: int | None, chunk_bytes: int | None,
                      max_gap_bytes: int | None) -> None:
        """Fill in the read sizes' defaults; check the block size."""
        if max_run_bytes is None:
            max_run_bytes = min(self.disk.run_bytes,
                                chunk_bytes or self.disk.run_bytes)
        if chunk_bytes is None:
            chunk_bytes = 2 * max_run_bytes
        if block_bytes is None:
            block_bytes = self.disk.block_bytes if self.direct else PAGE_BYTES
        if block_bytes < 1 or PAGE_BYTES % block_bytes \
                or block_bytes % self._np_dtype.itemsize:
            raise ValueError(
                f"block_bytes must divide {PAGE_BYTES} and be a multiple of "
                f"the {self._np_dtype.itemsize}-byte element, got "
                f"{block_bytes}"
            )
        self.block_bytes = block_bytes
        if max_gap_bytes is None:
            max_gap_bytes = self.disk.gap_bytes
        self.max_gap_bytes = max_gap_bytes
        self._max_gap_blocks = max_gap_bytes // block_bytes
        self._max_run_blocks = max_run_bytes // block_bytes
        self._chunk_blocks = chunk_bytes // block_bytes
        self.num_threads = num_threads

    def _open(self, direct: bool) -> tuple[int, bool]:
        """Open the file; fall back to buffered reads if O_DIRECT fails."""
        flag = getattr(os, "O_DIRECT", 0)
        if not direct:
            return os.open(self.path, os.O_RDONLY), False
        reason = "this platform has no O_DIRECT"
        if flag:
            fd = -1
            try:
                fd = os.open(self.path, os.O_RDONLY | flag)
                # Some filesystems accept the flag and refuse the first read.
                probe = mmap.mmap(-1, PAGE_BYTES)
                os.preadv(fd, [memoryview(probe)], 0)
                return fd, True
            except OSError as err:
                if fd >= 0:
                    os.close(fd)
                if err.errno != errno.EINVAL:
                    raise
                reason = f"the filesystem refuses O_DIRECT ({err.strerror})"
        warnings.warn(
            f"{self.path}: {reason}; reading it through the page cache "
            f"instead, so storage reads may be served from RAM",
            RuntimeWarning,
            stacklevel=3,
        )
        return os.open(self.path, os.O_RDONLY), False

    def read(self, ids) -> torch.Tensor:
        """See `Feature.read`.

        Reads the blocks holding the rows from the file; rows come back on
        the CPU.

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
            into = (*into, self._direct_bases(into[0]))
            planning = time.perf_counter() - began
            try:
                futures = [self._pool.submit(self._run_task, task, into)
                           for task in tasks]
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
        concurrent.futures.wait(futures)
        blocks = nbytes = reads = 0
        first, last, cpu = float("inf"), float("-inf"), 0.0
        for future in futures:
            task_blocks, task_bytes, task_reads, start, stop, task_cpu = \
                future.result()
            blocks += task_blocks
            nbytes += task_bytes
            reads += task_reads
            first, last = min(first, start), max(last, stop)
            cpu += task_cpu
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
            stats.seconds += planning + max(0.0, last - first)
            stats.cpu_seconds += cpu
            stats.model_seconds += self.disk.seconds(reads, nbytes)

    def _plan(self, unique: np.ndarray) -> list[_Task]:
        """Block runs, pieces and tasks for sorted unique row ids."""
        count = len(unique)
        block = self.block_bytes
        # (2)-(3) Each row's block range; segments of consecutive blocks
        # (short gaps read through).
        plan = read_plan(unique, self._row_nbytes, self._data_offset, block,
                         self._max_gap_blocks)
        first, last, opens = plan.first, plan.last, plan.opens
        start = self._data_offset + unique * self._row_nbytes
        before = np.empty(count, dtype=np.int64)
        before[0] = first[0] - 1
        before[1:] = last[:-1]
        total_blocks = int((last - np.maximum(first - 1, before)).sum())
        # Pieces of `target` blocks, read and copied out one at a time:
        # small enough that every thread gets some of a small request,
        # and that one thread's copying overlaps the others' reads. Long
        # segments are cut (between rows) every `cut` blocks, no finer
        # than a run, since a row straddling the cut costs a block twice.
        target = min(self._chunk_blocks,
                     max(1, -(-total_blocks // self.num_threads)))
        cut = max(target, self._max_run_blocks)
        segment = np.cumsum(opens) - 1
        offset = first - first[opens][segment]
        piece = offset // cut
        opens[1:] |= piece[1:] != piece[:-1]
        segment = np.cumsum(opens) - 1
        seg_rows = np.flatnonzero(opens)
        seg_first = first[seg_rows]
        seg_last = last[np.append(seg_rows[1:], count) - 1]
        seg_blocks = seg_last - seg_first + 1
        # (4) Pieces: consecutive segments, about `target` blocks each. A
        # segment's blocks sit back to back in its piece's buffer.
        seg_before = np.cumsum(seg_blocks) - seg_blocks
        bucket = seg_before // target
        piece_opens = np.ones(len(seg_rows), dtype=bool)
        piece_opens[1:] = bucket[1:] != bucket[:-1]
        seg_piece = np.cumsum(piece_opens) - 1
        piece_segs = np.flatnonzero(piece_opens)
        seg_buffer = seg_before - seg_before[piece_segs][seg_piece]
        # Byte offset of each row in its piece's buffer; the buffer and
        # the file's blocks are aligned.
        row_offsets = (seg_buffer - seg_first)[segment] * block + start
        # Runs: segments cut into pieces of at most `max_run_blocks`.
        run_count = -(-seg_blocks // self._max_run_blocks)
        run_seg = np.repeat(np.arange(len(seg_rows)), run_count)
        run_index = np.arange(len(run_seg)) - np.repeat(
            np.cumsum(run_count) - run_count, run_count)
        run_skip = run_index * self._max_run_blocks
        run_first = seg_first[run_seg] + run_skip
        run_blocks = np.minimum(self._max_run_blocks,
                                seg_last[run_seg] - run_first + 1)
        reads = _Reads(
            run_file=run_first * block, run_bytes=run_blocks * block,
            run_buffer=(seg_buffer[run_seg] + run_skip) * block,
            piece_runs=np.append(np.searchsorted(run_seg, piece_segs),
                                 len(run_seg)),
            piece_rows=np.append(seg_rows[piece_segs], count),
            row_offsets=row_offsets, row_file=start)
        # (5) Tasks: consecutive pieces, each one call of the compiled
        # loop (not one call per piece), one per thread at the depth the
        # model prices this request's reads and bytes soonest at: every
        # thread for many small reads, fewer where bytes dominate.
        piece_blocks = np.add.reduceat(seg_blocks, piece_segs)
        depth = self.disk.depth_for(len(run_seg),
                                    int(run_blocks.sum()) * block)
        tasks = min(len(piece_segs), self.num_threads, depth)
        share = -(-int(piece_blocks.sum()) // tasks)
        piece_before = np.cumsum(piece_blocks) - piece_blocks
        bounds = np.flatnonzero(np.diff(piece_before // share, prepend=-1))
        bounds = np.append(bounds, len(piece_blocks))
        return [_Task(reads, int(a), int(b),
                      int(piece_blocks[a:b].max()) * block,
                      int(piece_blocks[a:b].sum()))
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _direct_bases(self, targets: tuple) -> np.ndarray | None:
        """The targets' addresses where rows can be read straight into
        them: ``O_DIRECT``, rows of whole blocks, every target's start on
        a block (`hmgraph.cache.buffers.aligned_empty`); else None, read
        through a buffer and copied."""
        bases = np.array([t.ctypes.data for t in targets], dtype=np.int64)
        if not self.direct or self._row_nbytes % self.block_bytes \
                or (bases % self.block_bytes).any() \
                or any(t.strides[0] != self._row_nbytes for t in targets):
            return None
        return bases

    def _run_task(self, task: _Task, into: tuple
                  ) -> tuple[int, int, int, float, float, float]:
        """Read a task's runs into their rows' places: straight (rows of
        whole blocks into aligned targets: ``preadv``, no copy), else
        piece by piece through a buffer (``into``: ``(targets, which,
        where, bases)``, `read_into`'s and `_direct_bases`').

        Returns
        -------
        (int, int, int, float, float, float)
            Blocks read, bytes transferred, ``pread`` calls, when the task
            started and ended (`time.perf_counter`), and its thread's CPU
            seconds.
        """
        began, cpu = time.perf_counter(), time.thread_time()
        counts = np.zeros(2, dtype=np.int64)
        if into[3] is None or not self._read_direct(task, into, counts):
            counts[:] = 0  # a direct read that failed: read it again
            self._read_pieces(task, into[:3], counts)
        return (task.blocks, int(counts[0]), int(counts[1]), began,
                time.perf_counter(), time.thread_time() - cpu)

    def _read_direct(self, task: _Task, into: tuple,
                     counts: np.ndarray) -> bool:
        """The task's runs by `read_direct`; False where one failed."""
        reads = task.reads
        _, which, where, bases = into
        sink, sink_address = self._buffer(max(self._max_gap_blocks, 1)
                                          * self.block_bytes)
        iov = getattr(self._buffers, "iov", None)
        if iov is None:
            iov = self._buffers.iov = np.empty((IOV_MAX, 2), np.int64)
        return read_direct(
            self._fd, reads.run_file, reads.run_bytes,
            reads.piece_runs[task.first], reads.piece_runs[task.stop],
            reads.row_file, reads.piece_rows[task.first],
            reads.piece_rows[task.stop], self._row_nbytes, bases, which,
            where, sink_address, len(sink), iov, counts) < 0

    def _read_pieces(self, task: _Task, into: tuple,
                     counts: np.ndarray) -> None:
        """The task's pieces through this thread's buffer, each piece's
        rows copied out before the next (`read_pieces`)."""
        reads = task.reads
        view, base = self._buffer(task.buffer_bytes)
        targets, which, where = into
        first = task.first
        while first < task.stop:
            # The compiled loop reads and copies piece after piece, GIL
            # free.
            failed = read_pieces(
                self._fd, view, base, reads.run_file, reads.run_bytes,
                reads.run_buffer, self.block_bytes if self.direct else 1,
                reads.piece_runs, reads.piece_rows, reads.row_offsets,
                self._row_nbytes, targets, which, where, first, task.stop,
                counts)
            if failed < 0:
                break
            # Read the failed run's piece on in Python, for the error's
            # message (a transient error reads it and goes on).
            first = int(np.searchsorted(reads.piece_runs, failed,
                                        side="right")) - 1
            self._finish_piece(view, base, reads, first, failed, into,
                               counts)
            first += 1

    def _finish_piece(self, view, base, reads: _Reads, piece: int,
                      failed: int, into: tuple, counts: np.ndarray) -> None:
        """Read a piece's runs from ``failed`` on (each run that fails in
        the compiled loop again in Python, which raises its error), then
        copy the piece's rows out."""
        stop = int(reads.piece_runs[piece + 1])
        while failed < stop:
            low = int(reads.run_buffer[failed])
            counts += self._read_run(
                memoryview(view)[low:low + int(reads.run_bytes[failed])],
                int(reads.run_file[failed]))
            failed += 1
            runs = slice(failed, stop)
            done = read_runs(self._fd, base, reads.run_file[runs],
                             reads.run_bytes[runs], reads.run_buffer[runs],
                             self.block_bytes if self.direct else 1, counts)
            failed = stop if done < 0 else failed + done
        rows = slice(int(reads.piece_rows[piece]),
                     int(reads.piece_rows[piece + 1]))
        scatter_rows(view, reads.row_offsets[rows], self._row_nbytes,
                     *into, rows.start)

    def _buffer(self, nbytes: int) -> tuple[np.ndarray, int]:
        """This thread's page-aligned buffer of at least ``nbytes``, and
        its address.

        Kept between reads: a fresh anonymous mapping per task would cost
        a zero-filled page fault for every page read.
        """
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer[0]) < nbytes:
            # The old mapping is unmapped once its last view is gone.
            buffer = address(mmap.mmap(-1, nbytes))
            self._buffers.buffer = buffer
        return buffer

    def _read_run(self, view: memoryview, offset: int) -> tuple[int, int]:
        """Fill ``view`` from file ``offset`` with ``os.preadv``; return
        (bytes, calls). Raises what the compiled loop could only report:
        the error of a failed read, or the file found cut short."""
        length = len(view)
        done = nbytes = reads = 0
        while done < length:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            reads += 1
            nbytes += got
            reached = done + got
            if self.direct and reached < length:
                # O_DIRECT continues from a block boundary only.
                reached -= reached % self.block_bytes
            if reached <= done:
                raise ValueError(
                    f"feature file {self.path} is truncated: a read at byte "
                    f"{offset + done} found its end, its manifest needs "
                    f"{self._file_bytes} bytes; {self.remedy}"
                )
            done = reached
        return nbytes, reads

    def close(self) -> None:
        """Stop the threads and close the file; idempotent.

        Reading afterwards raises ``ValueError``.
        """
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)  # no read touches the fd after this
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
        not the disk's.
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
        log.warning("%s: the epoch's reads took %.1f s, %.2fx the disk "
                    "model's %.1f s; measuring the disk again", self.path,
                    seconds, ratio, model)
        self.disk = disk_model(self.path, self._asked_depth, refresh=True)
        if self._default_gap:
            self.max_gap_bytes = self.disk.gap_bytes
            self._max_gap_blocks = self.max_gap_bytes // self.block_bytes
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

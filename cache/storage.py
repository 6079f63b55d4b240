"""The storage tier: rows read from a feature file on disk with O_DIRECT.

`StorageFeature` is the bottom of the tier stack (disk -> host -> device).
It reads rows straight from the file written by `hmgraph.cache.format`,
bypassing the OS page cache with ``O_DIRECT`` so that what a benchmark
measures is the SSD, not RAM.

One read request goes through five steps, all vectorised over the ids:

1. Deduplicate and sort the ids.
2. Map each row's byte range to its range of 4096-byte pages. Rows may
   straddle pages; the data start is page aligned, so the file's pages are
   the units ``O_DIRECT`` can read.
3. Coalesce the pages into runs of consecutive pages: rows on the same page
   or on pages at most ``max_gap_bytes`` apart share one run (the gap is
   read too: a short gap costs less than another request), and no run
   exceeds ``max_run_bytes``.
4. Group the runs into tasks of about ``chunk_bytes`` and hand them to a
   thread pool. Each task reads its runs with ``os.preadv`` into one
   page-aligned buffer (an anonymous ``mmap``), then gathers its rows out of
   the buffer. ``preadv`` releases the GIL, so several reads are in flight.
5. Scatter the unique rows back to request order.

Coalescing matters more than parallelism on the disks this runs on: they
serve about 8-15 thousand random 4 KiB ``O_DIRECT`` reads per second, but
0.5-0.9 GB/s in 1 MiB reads, so a run of 256 pages costs little more than
one page. The threads keep a few requests queued on the device. Longer
runs still help when a request covers most of the file (as the input rows
of a large mini-batch do): one 0.96 GB gather of 531 thousand random rows
took 1.11 s in 1 MiB runs and 0.85 s in 4 MiB runs, with 4 threads.

Where the filesystem refuses ``O_DIRECT`` the tier falls back to buffered
reads and warns once.
"""

from __future__ import annotations

import errno
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
from numpy.lib.stride_tricks import sliding_window_view

from .feature import Feature, torch_dtype
from .format import PAGE_BYTES, read_manifest

__all__ = ["StorageFeature", "StorageStats"]


@dataclass
class StorageStats:
    """Counters of a `StorageFeature`; exact, summed over all reads.

    Attributes
    ----------
    requests : int
        Calls of ``read``.
    rows_requested : int
        Ids asked for, duplicates included.
    rows_read : int
        Unique rows read from the file.
    pages_read : int
        4096-byte pages read from the file.
    bytes_read : int
        Bytes transferred from the file (``pages_read * 4096`` unless a read
        stopped short).
    reads : int
        ``preadv`` calls.
    seconds : float
        Wall time spent in ``read``.
    """

    requests: int = 0
    rows_requested: int = 0
    rows_read: int = 0
    pages_read: int = 0
    bytes_read: int = 0
    reads: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        """Set every counter back to zero."""
        for field in fields(self):
            setattr(self, field.name, field.default)

    def as_dict(self) -> dict:
        """The counters as a plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class _Task:
    """One buffer's worth of work: page runs in, rows out."""

    buffer_pages: int
    run_file_pages: list[int]
    run_pages: list[int]
    run_buffer_pages: list[int]
    row_start: int  # slice of the unique rows this task fills
    row_stop: int
    row_elements: np.ndarray  # element offset of each row in the buffer


class StorageFeature(Feature):
    """Rows of a feature file, read from disk with ``O_DIRECT``.

    Parameters
    ----------
    path : str or os.PathLike
        A feature file written by `hmgraph.cache.format.write_feature_file`.
    num_threads : int
        Threads issuing reads; default 4.
    direct : bool
        Open with ``O_DIRECT`` (bypass the page cache); default True. Where
        the filesystem refuses it, reads are buffered and a
        ``RuntimeWarning`` naming the file is emitted once.
    max_run_bytes : int
        Largest single read, in bytes; default 4 MiB. Rounded down to whole
        4096-byte pages; must be at least one page.
    chunk_bytes : int
        Target size of one task's buffer, in bytes; default 16 MiB. Must be
        at least ``max_run_bytes``, since a task holds whole runs. A task
        holds whole rows and keeps adjacent rows together up to this size,
        so its buffer can reach about twice this (plus one row). Small
        requests are split further so that every thread gets work.
    max_gap_bytes : int
        Pages between two wanted pages are read too when the gap is at
        most this many bytes (default 32 KiB): on these disks a short gap
        costs less than a separate request. 0 reads wanted pages only.

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
    stats : StorageStats
        Counters of all reads so far.

    Examples
    --------
    >>> with StorageFeature("feat.bin") as feature:  # doctest: +SKIP
    ...     rows = feature.read(torch.tensor([5, 0, 5]))
    """

    def __init__(
        self,
        path: str | os.PathLike,
        num_threads: int = 4,
        direct: bool = True,
        max_run_bytes: int = 4 << 20,
        chunk_bytes: int = 16 << 20,
        max_gap_bytes: int = 32 << 10,
    ):
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(
                f"num_threads must be a positive int, got {num_threads!r}"
            )
        if max_run_bytes < PAGE_BYTES:
            raise ValueError(
                f"max_run_bytes must be at least one page ({PAGE_BYTES}), "
                f"got {max_run_bytes}"
            )
        if chunk_bytes < max_run_bytes:
            raise ValueError(
                f"chunk_bytes ({chunk_bytes}) must be at least max_run_bytes "
                f"({max_run_bytes}): a task reads whole runs"
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
        if max_gap_bytes < 0:
            raise ValueError(
                f"max_gap_bytes must be >= 0, got {max_gap_bytes}"
            )
        self._max_gap_pages = max_gap_bytes // PAGE_BYTES
        self._max_run_pages = max_run_bytes // PAGE_BYTES
        self._chunk_pages = chunk_bytes // PAGE_BYTES
        self.num_threads = num_threads
        self.stats = StorageStats()
        self._lock = threading.Lock()
        self._buffers = threading.local()
        self._fd, self.direct = self._open(direct)
        self._pool = ThreadPoolExecutor(
            num_threads, thread_name_prefix="hmgraph-storage"
        )
        self._closed = False

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

        Reads the pages holding the rows from the file; rows come back on
        the CPU.

        Raises
        ------
        ValueError
            If the feature is closed, or the file was cut short since it
            was opened.
        """
        if self._closed:
            raise ValueError(f"StorageFeature of {self.path} is closed")
        return super().read(ids)

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        began = time.perf_counter()
        # (1) Unique sorted ids, and where each request goes.
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        rows = torch.empty((len(unique), *self.row_shape), dtype=self.dtype)
        pages = nbytes = reads = 0
        if len(unique) and self._row_numel:
            # (2)-(4) Plan page runs, read them in tasks, gather rows.
            out = rows.numpy().reshape(len(unique), self._row_numel)
            tasks = self._plan(unique.numpy())
            try:
                futures = [self._pool.submit(self._run_task, task, out)
                           for task in tasks]
            except RuntimeError:  # the pool was shut down meanwhile
                raise ValueError(
                    f"StorageFeature of {self.path} is closed"
                ) from None
            for future in futures:
                task_pages, task_bytes, task_reads = future.result()
                pages += task_pages
                nbytes += task_bytes
                reads += task_reads
        # (5) Back to request order.
        if len(unique) != len(ids) or not bool((ids[1:] > ids[:-1]).all()):
            rows = rows[inverse]
        with self._lock:
            stats = self.stats
            stats.requests += 1
            stats.rows_requested += len(ids)
            stats.rows_read += len(unique)
            stats.pages_read += pages
            stats.bytes_read += nbytes
            stats.reads += reads
            stats.seconds += time.perf_counter() - began
        return rows

    def _plan(self, unique: np.ndarray) -> list[_Task]:
        """Page runs and buffer layout for sorted unique row ids."""
        count = len(unique)
        # (2) Each row's byte range and page range (last page inclusive).
        start = self._data_offset + unique * self._row_nbytes
        first = start // PAGE_BYTES
        last = (start + self._row_nbytes - 1) // PAGE_BYTES
        # (3) Segments of consecutive pages: a row opens one unless it
        # begins on, or within `max_gap_pages` after, the previous row's
        # last page (reading a short gap is cheaper than another request).
        opens = np.ones(count, dtype=bool)
        opens[1:] = first[1:] > last[:-1] + 1 + self._max_gap_pages
        before = np.empty(count, dtype=np.int64)
        before[0] = first[0] - 1
        before[1:] = last[:-1]
        total_pages = int((last - np.maximum(first - 1, before)).sum())
        # Tasks of `target` pages keep every thread busy on small requests;
        # long segments are cut (between rows) every `cut` pages, no finer
        # than a run, since a row straddling the cut costs one page twice.
        target = min(self._chunk_pages,
                     max(1, -(-total_pages // self.num_threads)))
        cut = max(target, self._max_run_pages)
        segment = np.cumsum(opens) - 1
        offset = first - first[opens][segment]
        piece = offset // cut
        opens[1:] |= piece[1:] != piece[:-1]
        segment = np.cumsum(opens) - 1
        seg_rows = np.flatnonzero(opens)
        seg_first = first[seg_rows]
        seg_last = last[np.append(seg_rows[1:], count) - 1]
        seg_pages = seg_last - seg_first + 1
        # (4) Tasks: consecutive segments, about `target` pages each. A
        # segment's pages sit back to back in its task's buffer.
        seg_before = np.cumsum(seg_pages) - seg_pages
        bucket = seg_before // target
        task_opens = np.ones(len(seg_rows), dtype=bool)
        task_opens[1:] = bucket[1:] != bucket[:-1]
        seg_task = np.cumsum(task_opens) - 1
        task_segs = np.flatnonzero(task_opens)
        seg_buffer = seg_before - seg_before[task_segs][seg_task]
        # Element offset of each row in its task's buffer; the buffer and
        # the file's pages are aligned, so it divides by the itemsize.
        row_bytes = (seg_buffer - seg_first)[segment] * PAGE_BYTES + start
        row_elements = row_bytes // self._np_dtype.itemsize
        # Runs: segments cut into pieces of at most `max_run_pages`.
        run_count = -(-seg_pages // self._max_run_pages)
        run_seg = np.repeat(np.arange(len(seg_rows)), run_count)
        run_index = np.arange(len(run_seg)) - np.repeat(
            np.cumsum(run_count) - run_count, run_count)
        run_skip = run_index * self._max_run_pages
        run_first = seg_first[run_seg] + run_skip
        run_pages = np.minimum(self._max_run_pages,
                               seg_last[run_seg] - run_first + 1)
        run_buffer = seg_buffer[run_seg] + run_skip
        # Slices of rows and runs per task.
        task_rows = np.append(seg_rows[task_segs], count)
        task_runs = np.append(np.searchsorted(run_seg, task_segs),
                              len(run_seg))
        task_pages = np.add.reduceat(seg_pages, task_segs)
        tasks = []
        for index in range(len(task_segs)):
            runs = slice(task_runs[index], task_runs[index + 1])
            rows = slice(task_rows[index], task_rows[index + 1])
            tasks.append(_Task(
                buffer_pages=int(task_pages[index]),
                run_file_pages=run_first[runs].tolist(),
                run_pages=run_pages[runs].tolist(),
                run_buffer_pages=run_buffer[runs].tolist(),
                row_start=rows.start,
                row_stop=rows.stop,
                row_elements=row_elements[rows],
            ))
        return tasks

    def _run_task(self, task: _Task, out: np.ndarray) -> tuple[int, int, int]:
        """Read a task's runs, copy its rows into ``out``.

        Returns
        -------
        (int, int, int)
            Pages read, bytes transferred and ``preadv`` calls.
        """
        buffer = self._buffer(task.buffer_pages * PAGE_BYTES)
        view = memoryview(buffer)
        nbytes = reads = 0
        for file_page, pages, buffer_page in zip(
            task.run_file_pages, task.run_pages, task.run_buffer_pages,
            strict=True,
        ):
            low = buffer_page * PAGE_BYTES
            run_bytes, run_reads = self._read_run(
                view[low:low + pages * PAGE_BYTES], file_page * PAGE_BYTES
            )
            nbytes += run_bytes
            reads += run_reads
        # Row i of the task starts at element row_elements[i] of the buffer:
        # a sliding window view gathers whole rows without an index matrix.
        elements = np.frombuffer(buffer, dtype=self._np_dtype)
        windows = sliding_window_view(elements, self._row_numel)
        out[task.row_start:task.row_stop] = windows[task.row_elements]
        return sum(task.run_pages), nbytes, reads

    def _buffer(self, nbytes: int) -> mmap.mmap:
        """This thread's page-aligned buffer of at least ``nbytes``.

        Kept between reads: a fresh anonymous mapping per task would cost
        a zero-filled page fault for every page read.
        """
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer) < nbytes:
            # The old mapping is unmapped once its last view is gone.
            buffer = mmap.mmap(-1, nbytes)
            self._buffers.buffer = buffer
        return buffer

    def _read_run(self, view: memoryview, offset: int) -> tuple[int, int]:
        """Fill ``view`` from file ``offset``; return (bytes, preadv calls)."""
        length = len(view)
        done = nbytes = reads = 0
        while done < length:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            reads += 1
            nbytes += got
            reached = done + got
            if self.direct and reached < length:
                # O_DIRECT continues from a page boundary only.
                reached -= reached % PAGE_BYTES
            if reached <= done:
                raise ValueError(
                    f"feature file {self.path} is truncated: a read at byte "
                    f"{offset + done} found its end, its manifest needs "
                    f"{self._file_bytes} bytes; delete it to rebuild it"
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

    def __del__(self):
        try:
            self.close()
        except Exception:  # best effort at interpreter exit
            pass

    def __repr__(self) -> str:
        return (f"StorageFeature({str(self.path)!r}, "
                f"num_rows={self.num_rows}, row_shape={self.row_shape}, "
                f"dtype={self.dtype}, direct={self.direct})")

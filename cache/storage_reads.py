"""Reads of the storage tier: its file opened, its tasks run on threads.

`hmgraph.cache.storage.StorageFeature` opens its file with `open_direct`
and hands the tasks it plans (`hmgraph.cache.storage_plan`) to a
`TaskReader`, which runs them on a pool of ``num_threads`` threads:

- Each task reads its runs into one page-aligned buffer (an anonymous
  ``mmap``) in a compiled loop of ``pread`` calls that holds no GIL
  (`hmgraph.cache.diskio`), so ``num_threads`` requests stay in flight
  while sampling and training go on, and copies each row out of its
  task's buffer straight to its place in the output (compiled too): no
  second pass to reorder them.
- Rows of whole blocks are read straight into an aligned output with
  ``preadv``, no copy (gaps read through land in a sink); a direct read
  that fails is read again through a buffer.
- A run the compiled loop reports failed is read again in Python, which
  raises its error (a file found cut short) or goes on (a transient
  error).
- Where the kernel allows io_uring (``engine="auto"`` or ``"uring"``),
  ``O_DIRECT`` reads go through rings instead (`hmgraph.cache.uring`): a
  request's tasks in at most `RING_THREADS` groups, each group's reads
  kept in flight from one thread, a fraction of the CPU a thread per read
  costs; rows straight into place, or into piece buffers copied out as
  each piece lands while the other reads go on.

Where the filesystem refuses ``O_DIRECT`` the file is read buffered and a
warning is emitted once.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hmgraph.cache import uring
from hmgraph.cache.diskio import (
    IOV_MAX,
    address,
    read_direct,
    read_pieces,
    read_runs,
)
from hmgraph.cache.engine import scatter_rows
from hmgraph.cache.format import PAGE_BYTES, REBUILD
from hmgraph.cache.storage_plan import PiecePlan, ReadTask

__all__ = ["ENGINES", "RING_THREADS", "TaskReader", "open_direct"]

#: How the storage tier keeps reads in flight: ``"threads"`` (a thread
#: per read in flight, ``pread``), ``"uring"`` (io_uring rings), or
#: ``"auto"`` (rings where the kernel allows them, for O_DIRECT reads).
ENGINES = ("auto", "threads", "uring")
#: Threads that drive rings: each keeps its share of the depth in flight.
RING_THREADS = 2


def open_direct(path: Path, direct: bool) -> tuple[int, bool]:
    """Open ``path`` to read; fall back to buffered reads if O_DIRECT
    fails.

    Returns
    -------
    (int, bool)
        The file descriptor, and whether it reads with ``O_DIRECT``.
        Where ``direct`` is asked for and refused, a ``RuntimeWarning``
        naming the file is emitted (at the caller of the caller).
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not direct:
        return os.open(path, os.O_RDONLY), False
    reason = "this platform has no O_DIRECT"
    if flag:
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | flag)
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
        f"{path}: {reason}; reading it through the page cache "
        f"instead, so storage reads may be served from RAM",
        RuntimeWarning,
        stacklevel=3,
    )
    return os.open(path, os.O_RDONLY), False


class TaskReader:
    """Runs read tasks of one feature file on a pool of threads.

    Parameters
    ----------
    fd : int
        The file, open to read (`open_direct`); the caller closes it after
        `shutdown`.
    direct : bool
        Whether ``fd`` reads with ``O_DIRECT``.
    block_bytes : int
        The read unit, in bytes.
    row_bytes : int
        Bytes of one row.
    num_threads : int
        Threads of the pool.
    path : pathlib.Path
        The file, for error messages.
    file_bytes : int
        The file's size its manifest needs, for the message of a file
        found cut short.
    sink_bytes : int
        Size of the buffer that direct reads drop the gaps they read
        through into: the longest gap read through, at least a block.
    engine : str
        One of `ENGINES`.

    Attributes
    ----------
    sink_bytes : int
        As above; the owner sets it anew when its gap changes.
    remedy : str
        The way out that the message of a file found cut short names;
        `hmgraph.cache.format.REBUILD` until set.
    engine : str
        ``"uring"`` where reads go through rings (an ``O_DIRECT`` file and
        a kernel that allows them), else ``"threads"``.

    Raises
    ------
    OSError
        If ``engine="uring"`` and the kernel refuses io_uring.
    """

    def __init__(self, fd: int, direct: bool, block_bytes: int,
                 row_bytes: int, num_threads: int, path: Path,
                 file_bytes: int, sink_bytes: int, engine: str = "auto"):
        if engine not in ENGINES:
            raise ValueError(f"unknown storage engine {engine!r}; "
                             f"available: {', '.join(ENGINES)}")
        if engine == "uring" and not uring.available():
            uring.Ring(2)  # raises the kernel's refusal
        self.fd = fd
        self.direct = direct
        self.block_bytes = block_bytes
        self.row_bytes = row_bytes
        self.path = path
        self.file_bytes = file_bytes
        self.sink_bytes = sink_bytes
        self.remedy = REBUILD
        self._buffers = threading.local()
        self._pool = ThreadPoolExecutor(
            num_threads, thread_name_prefix="hmgraph-storage"
        )
        self.engine = "uring" if direct and (
            engine == "uring" or engine == "auto" and uring.available()) \
            else "threads"
        self._ring_entries = 1 << max(
            0, int(-(-num_threads // RING_THREADS) - 1).bit_length())
        self._rings: list[uring.Ring] = []
        self._ring_pool = ThreadPoolExecutor(
            RING_THREADS, thread_name_prefix="hmgraph-uring") \
            if self.engine == "uring" else None

    def submit(self, tasks: list[ReadTask], into: tuple) -> list[Future]:
        """Queue ``tasks`` on the threads (`run_task`), or in consecutive
        groups on the ring threads (`run_ring`), each group keeping its
        share of the tasks' depth in flight; raises ``RuntimeError`` once
        the pool is shut down."""
        if self._ring_pool is not None and tasks:
            groups = min(RING_THREADS, len(tasks))
            depth = -(-len(tasks) // groups)
            bounds = np.linspace(0, len(tasks), groups + 1).astype(int)
            return [self._ring_pool.submit(self.run_ring, tasks[a:b], into,
                                           depth)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return [self._pool.submit(self.run_task, task, into)
                for task in tasks]

    def shutdown(self) -> None:
        """Stop the threads once their tasks are done; close the rings."""
        self._pool.shutdown(wait=True)
        if self._ring_pool is not None:
            self._ring_pool.shutdown(wait=True)
        for ring in self._rings:
            ring.close()

    @staticmethod
    def wait(futures: list[Future]
             ) -> tuple[int, int, int, float, float]:
        """Wait for every task of a read, then sum them (or raise the
        first task's error).

        Returns
        -------
        (int, int, int, float, float)
            Blocks read, bytes transferred, ``pread`` calls, the tasks'
            span from the first start to the last end in seconds (0.0
            without tasks), and the CPU seconds of their threads.
        """
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
        return blocks, nbytes, reads, max(0.0, last - first), cpu

    def direct_bases(self, targets: tuple) -> np.ndarray | None:
        """The targets' addresses where rows can be read straight into
        them: ``O_DIRECT``, rows of whole blocks, every target's start on
        a block (`hmgraph.cache.buffers.aligned_empty`); else None, read
        through a buffer and copied."""
        bases = np.array([t.ctypes.data for t in targets], dtype=np.int64)
        if not self.direct or self.row_bytes % self.block_bytes \
                or (bases % self.block_bytes).any() \
                or any(t.strides[0] != self.row_bytes for t in targets):
            return None
        return bases

    def run_task(self, task: ReadTask, into: tuple
                 ) -> tuple[int, int, int, float, float, float]:
        """Read a task's runs into their rows' places: straight (rows of
        whole blocks into aligned targets: ``preadv``, no copy), else
        piece by piece through a buffer (``into``: ``(targets, which,
        where, bases)``, `StorageFeature.read_into`'s and
        `direct_bases`').

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

    def run_ring(self, tasks: list[ReadTask], into: tuple, depth: int
                 ) -> tuple[int, int, int, float, float, float]:
        """Read consecutive ``tasks`` through this thread's ring, ``depth``
        reads in flight: straight into their rows' places where `direct
        bases` allow it (`uring.ring_direct`), else piece by piece through
        buffers (`uring.ring_pieces`); where a read fails or comes back
        short, they are read again through a buffer (`_read_pieces`, which
        raises a file's error). Returns `run_task`'s tuple for them."""
        began, cpu = time.perf_counter(), time.thread_time()
        counts = np.zeros(2, dtype=np.int64)
        ring = self._ring()
        depth = min(depth, ring.entries)
        reads, first, stop = tasks[0].reads, tasks[0].first, tasks[-1].stop
        if into[3] is not None:
            failed = self._ring_direct(ring, depth, reads, first, stop,
                                       into, counts)
        else:
            failed = self._ring_pieces(ring, depth, tasks, into, counts)
        if failed < -1:
            raise OSError(-2 - failed, f"io_uring_enter on {self.path}: "
                          f"{os.strerror(-2 - failed)}")
        if failed >= 0:
            counts[:] = 0
            for task in tasks:
                self._read_pieces(task, into[:3], counts)
        return (sum(task.blocks for task in tasks), int(counts[0]),
                int(counts[1]), began, time.perf_counter(),
                time.thread_time() - cpu)

    def _ring_direct(self, ring, depth, reads, first, stop, into, counts):
        """`uring.ring_direct` over pieces ``first`` to ``stop - 1``."""
        _, which, where, bases = into
        sink, sink_address = self._buffer(self.sink_bytes)
        return uring.ring_direct(
            ring.sq, ring.cq, ring.sqes, ring.layout, ring.iov, ring.slots,
            depth, self.fd, reads.run_file, reads.run_bytes,
            reads.piece_runs[first], reads.piece_runs[stop], reads.row_file,
            reads.piece_rows[first], reads.piece_rows[stop], self.row_bytes,
            bases, which, where, sink_address, len(sink), counts)

    def _ring_pieces(self, ring, depth, tasks, into, counts):
        """`uring.ring_pieces` over ``tasks``' pieces, with enough piece
        buffers in this thread's buffer to keep ``depth`` runs in flight
        (pieces of a few runs each)."""
        reads, first, stop = tasks[0].reads, tasks[0].first, tasks[-1].stop
        stride = -(-max(t.buffer_bytes for t in tasks) // PAGE_BYTES) \
            * PAGE_BYTES
        runs = int(reads.piece_runs[stop] - reads.piece_runs[first])
        per_piece = max(1, runs // max(1, stop - first))
        count = max(2, min(stop - first, -(-depth // per_piece) + 1))
        view, base = self._buffer(count * stride)
        targets, which, where = into[:3]
        return uring.ring_pieces(
            ring.sq, ring.cq, ring.sqes, ring.layout, ring.slots, depth,
            self.fd, view[:count * stride], base, stride, reads.run_file,
            reads.run_bytes, reads.run_buffer, reads.piece_runs,
            reads.piece_rows, reads.row_offsets, self.row_bytes, targets,
            which, where, first, stop, counts)

    def _ring(self) -> uring.Ring:
        """This thread's ring (set up on first use)."""
        ring = getattr(self._buffers, "ring", None)
        if ring is None:
            ring = self._buffers.ring = uring.Ring(self._ring_entries)
            self._rings.append(ring)
        return ring

    def _read_direct(self, task: ReadTask, into: tuple,
                     counts: np.ndarray) -> bool:
        """The task's runs by `read_direct`; False where one failed."""
        reads = task.reads
        _, which, where, bases = into
        sink, sink_address = self._buffer(self.sink_bytes)
        iov = getattr(self._buffers, "iov", None)
        if iov is None:
            iov = self._buffers.iov = np.empty((IOV_MAX, 2), np.int64)
        return read_direct(
            self.fd, reads.run_file, reads.run_bytes,
            reads.piece_runs[task.first], reads.piece_runs[task.stop],
            reads.row_file, reads.piece_rows[task.first],
            reads.piece_rows[task.stop], self.row_bytes, bases, which,
            where, sink_address, len(sink), iov, counts) < 0

    def _read_pieces(self, task: ReadTask, into: tuple,
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
                self.fd, view, base, reads.run_file, reads.run_bytes,
                reads.run_buffer, self.block_bytes if self.direct else 1,
                reads.piece_runs, reads.piece_rows, reads.row_offsets,
                self.row_bytes, targets, which, where, first, task.stop,
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

    def _finish_piece(self, view, base, reads: PiecePlan, piece: int,
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
            done = read_runs(self.fd, base, reads.run_file[runs],
                             reads.run_bytes[runs], reads.run_buffer[runs],
                             self.block_bytes if self.direct else 1, counts)
            failed = stop if done < 0 else failed + done
        rows = slice(int(reads.piece_rows[piece]),
                     int(reads.piece_rows[piece + 1]))
        scatter_rows(view, reads.row_offsets[rows], self.row_bytes,
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
            got = os.preadv(self.fd, [view[done:]], offset + done)
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
                    f"{self.file_bytes} bytes; {self.remedy}"
                )
            done = reached
        return nbytes, reads

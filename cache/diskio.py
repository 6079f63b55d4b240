"""Compiled ``pread`` loops: many reads in flight, none holding the GIL.

A disk serves random reads faster the more of them wait in its queue (on
the virtio disk this was written on: 13,000 random 4 KiB ``O_DIRECT``
reads/s with one in flight, 35,000 with 4, 147,000 with 64). Keeping 64
requests in flight from Python threads calling ``os.preadv`` makes the
interpreter the bottleneck: each call takes and gives back the GIL, and
sampling and training need it too. Here the loops are compiled with numba
and call libc's ``pread`` directly (``nogil=True``), so each thread of the
storage tier's pool issues its requests back to back, and ``depth``
threads keep ``depth`` requests queued.

The kernels take a buffer's address (`address`), not the buffer: the
buffers are page-aligned anonymous mappings, as ``O_DIRECT`` requires, and
the caller keeps them alive until the kernel returns.
"""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np
from numba import njit, types

from hmgraph.cache.engine import scatter_rows

__all__ = ["IOV_MAX", "address", "fill_iovecs", "read_at", "read_direct",
           "read_pieces", "read_runs", "reads_per_second"]

# ssize_t pread(int fd, void *buf, size_t count, off_t offset), with the
# buffer passed as an address (the same register as a pointer).
_pread = types.ExternalFunction(
    "pread", types.intp(types.intc, types.intp, types.uintp, types.int64))
# ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t
# offset): iovecs as an (n, 2) int64 array of (address, length) pairs.
_preadv = types.ExternalFunction(
    "preadv", types.intp(types.intc, types.intp, types.intc, types.int64))
#: iovecs per ``preadv`` call (Linux's ``IOV_MAX``).
IOV_MAX = 1024


def address(buffer: mmap.mmap) -> tuple[np.ndarray, int]:
    """A mapping's bytes as a uint8 array, and their address.

    Keep the array while a kernel reads into the address: it holds the
    mapping open.
    """
    view = np.frombuffer(buffer, dtype=np.uint8)
    return view, view.ctypes.data


@njit(nogil=True, cache=True)
def read_runs(fd, base, file_offsets, lengths, buffer_offsets, block,
              counts):
    """Read run ``i`` (``lengths[i]`` bytes at ``file_offsets[i]``) to
    ``base + buffer_offsets[i]``, for every run in turn.

    A short read continues from its last whole ``block`` (``O_DIRECT``
    resumes at block boundaries only; 1 for buffered reads). Adds the
    bytes transferred and ``pread`` calls to ``counts[0]`` and
    ``counts[1]``. Returns -1, or the index of the first run that failed
    (an error, or the file's end before the run's): the caller reads that
    run again in Python for the error's message.
    """
    for i in range(file_offsets.shape[0]):
        done = 0
        length = lengths[i]
        while done < length:
            got = _pread(fd, base + buffer_offsets[i] + done, length - done,
                         file_offsets[i] + done)
            counts[1] += 1
            if got <= 0:
                return i
            counts[0] += got
            reached = done + got
            if reached < length:
                reached -= reached % block
            if reached <= done:
                return i
            done = reached
    return -1


@njit(nogil=True, cache=True)
def read_pieces(fd, buffer, base, file_offsets, lengths, buffer_offsets,
                block, piece_runs, piece_rows, row_offsets, row_bytes,
                targets, which, where, first, stop, counts):
    """Pieces ``first`` to ``stop - 1`` of a read plan, one after the
    other through one buffer: read a piece's runs (`read_runs`: runs
    ``piece_runs[p]`` to ``piece_runs[p + 1] - 1``, at buffer offsets
    from the piece's start), then copy its rows into their places (rows
    ``piece_rows[p]`` to ``piece_rows[p + 1] - 1``, row ``i`` from byte
    ``row_offsets[i]`` of the buffer to row ``where[i]`` of
    ``targets[which[i]]``).

    One call per thread's share of a request: while this thread copies a
    piece, the other threads' reads are in flight. Returns -1, or the
    index of the first run that failed (its piece's earlier runs read,
    none of its rows copied).
    """
    for p in range(first, stop):
        r0 = piece_runs[p]
        r1 = piece_runs[p + 1]
        failed = read_runs(fd, base, file_offsets[r0:r1], lengths[r0:r1],
                           buffer_offsets[r0:r1], block, counts)
        if failed >= 0:
            return r0 + failed
        w0 = piece_rows[p]
        scatter_rows(buffer, row_offsets[w0:piece_rows[p + 1]], row_bytes,
                     targets, which, where, w0)
    return -1


@njit(nogil=True, cache=True, inline="always")
def fill_iovecs(iov, pos, end, k, row_offsets, row_stop, row_bytes, bases,
                which, where, sink, sink_bytes):
    """One read's iovecs into ``iov`` (at most its rows), from file byte
    ``pos`` towards ``end``: each row's bytes to its place (row ``k`` on,
    as `read_direct` lays rows out), the gaps between rows to ``sink``,
    ``sink_bytes`` at a time. Returns ``(iovecs, pos, k)``: where the
    read ends and the row reached. Shared by `read_direct` and
    `hmgraph.cache.uring.ring_direct`."""
    n = 0
    while pos < end and n < iov.shape[0]:
        while k < row_stop and row_offsets[k] + row_bytes <= pos:
            k += 1
        if k < row_stop and row_offsets[k] <= pos:
            step = min(row_offsets[k] + row_bytes, end) - pos
            iov[n, 0] = bases[which[k]] + where[k] * row_bytes + pos \
                - row_offsets[k]
        else:
            gap = end if k == row_stop else min(row_offsets[k], end)
            step = min(gap - pos, sink_bytes)
            iov[n, 0] = sink
        iov[n, 1] = step
        n += 1
        pos += step
    return n, pos, k


@njit(nogil=True, cache=True)
def read_direct(fd, file_offsets, lengths, first, stop, row_offsets,
                row_first, row_stop, row_bytes, bases, which, where, sink,
                sink_bytes, iov, counts):
    """Runs ``first`` to ``stop - 1`` read straight into their rows' places,
    one ``preadv`` per run (or per `IOV_MAX` pieces of one).

    Row ``i`` (``row_first <= i < row_stop``, in file order) lies at byte
    ``row_offsets[i]`` of the file and goes to address ``bases[which[i]] +
    where[i] * row_bytes``; bytes of a run between rows (gaps read
    through) go to ``sink`` (``sink_bytes`` long, reused). Every address
    and length must be block-aligned (``O_DIRECT``): rows of a whole
    number of blocks, page-aligned targets. ``iov`` is an ``(IOV_MAX, 2)``
    int64 scratch array. Adds the bytes and calls to ``counts``. Returns
    -1, or the first run that failed or came back short (the caller reads
    the task again through a buffer).
    """
    k = row_first
    for r in range(first, stop):
        pos = file_offsets[r]
        end = pos + lengths[r]
        while pos < end:
            start = pos
            n, pos, k = fill_iovecs(iov, pos, end, k, row_offsets, row_stop,
                                    row_bytes, bases, which, where, sink,
                                    sink_bytes)
            got = _preadv(fd, iov.ctypes.data, n, start)
            counts[1] += 1
            if got != pos - start:
                return r
            counts[0] += got
    return -1


#: Bytes the first round of `reads_per_second` reads at most, and the
#: reads a thread makes in it at least (a rate needs a request to follow
#: another).
_FIRST_ROUND_BYTES = 32 << 20
_MIN_READS = 2


@njit(nogil=True, cache=True)
def read_at(fd, base, size, offsets, start, stop):
    """Read ``size`` bytes at each of ``offsets[start:stop]`` into
    ``base`` (one buffer, reused): the disk probe's loop. Returns the
    reads done, -1 at the first that failed or came back short."""
    for i in range(start, stop):
        if _pread(fd, base, size, offsets[i]) != size:
            return -1
    return stop - start


def reads_per_second(fd: int, offsets: np.ndarray, size: int, depth: int,
                     seconds: float) -> float:
    """``size``-byte reads per second at ``offsets``, ``depth`` in flight.

    ``depth`` threads each read their own slice of ``offsets`` in turn;
    the slices grow until one round takes ``seconds`` (or ``offsets`` run
    out), and the last round's rate is returned. The first round reads
    at most `_FIRST_ROUND_BYTES` (at least `_MIN_READS` a thread): it
    started at 8 reads a thread whatever their size, 4 GiB at depth 128
    in 4 MiB reads, and a whole `hmgraph.cache.disk.measure_disk` read
    26 GB in 18 s (now 9 GB in 9 s, on synth-igb-large's file).

    Raises
    ------
    OSError
        If a read fails or comes back short.
    """
    per_thread = max(_MIN_READS, min(8, _FIRST_ROUND_BYTES // max(
        1, depth * size)))
    while True:
        per_thread = min(per_thread, len(offsets) // depth)
        took = _round(fd, offsets, size, depth, per_thread)
        if took >= seconds or per_thread == len(offsets) // depth:
            return depth * per_thread / took
        grow = seconds / max(took, 1e-6) * 1.1
        per_thread = int(per_thread * min(max(grow, 2.0), 64.0))


def _round(fd: int, offsets: np.ndarray, size: int, depth: int,
           per_thread: int) -> float:
    """Seconds for ``depth`` threads to read ``per_thread`` offsets each."""
    buffers = [address(mmap.mmap(-1, max(size, mmap.PAGESIZE)))
               for _ in range(depth)]
    failed = []

    def work(index: int) -> None:
        start = index * per_thread
        if read_at(fd, buffers[index][1], size, offsets, start,
                   start + per_thread) < 0:
            failed.append(index)

    began = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(depth)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = max(time.perf_counter() - began, 1e-9)
    if failed:
        raise OSError(f"a {size}-byte probe read failed or came back short")
    return took

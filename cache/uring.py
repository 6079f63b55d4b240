"""io_uring reads for the storage tier: a deep queue from one thread.

A thread per request in flight (`hmgraph.cache.diskio`) pays a system
call, a sleep and a wake-up for every read: on the virtio disk of
`bench/results`, 6.8-9.9 us of CPU per random 4 KiB ``O_DIRECT`` read at
16 to 128 threads, against 3.1-3.9 us through one io_uring at the same
depth (a C probe, 60,000 reads each), at about the same reads/s. Beside a
model training on every core, that CPU is what the loader takes from it.
DGL GraphBolt's ``DiskBasedFeature`` and GNNDrive read through io_uring
for that reason.

`Ring` sets one up (``io_uring_setup``, its three areas mapped); two
loops keep up to ``depth`` reads of a read plan in flight on it:

- `ring_direct`: rows of whole blocks, each run one ``IORING_OP_READV``
  (or one per `IOV_MAX` pieces of it) straight into its rows' places,
  the gaps read through into a sink, as `hmgraph.cache.diskio.
  read_direct` does with ``preadv``;
- `ring_pieces`: other rows, each piece of the plan read into a buffer
  of its own, its rows copied out as soon as its runs land while the
  other reads go on (a thread per read copies with its read stopped).

Both are compiled with numba and hold no GIL; they call
``io_uring_enter`` through libc's ``syscall`` (no ``SQPOLL``: the
kernel looks at the queue only inside that call), with fences around
the ring's shared indices.

`available` says whether this kernel and its seccomp policy allow
io_uring (some containers refuse ``io_uring_setup``); where they do not,
the storage tier keeps its threads.
"""

from __future__ import annotations

import functools
import mmap
import os

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from hmgraph.cache.diskio import IOV_MAX, fill_iovecs
from hmgraph.cache.engine import scatter_rows

__all__ = ["Ring", "available", "ring_direct", "ring_pieces"]

# The system calls' numbers are the same on every architecture (5.1+).
_SETUP, _ENTER = 425, 426
_READV, _READ = 1, 22  # IORING_OP_READV, IORING_OP_READ
_GETEVENTS = 1  # IORING_ENTER_GETEVENTS
_OFF_CQ_RING, _OFF_SQES = 0x8000000, 0x10000000
_EINTR, _EAGAIN, _EBUSY = 4, 11, 16
_BATCH_SHARE = 4  # `_batch`: wait for a quarter of the reads in flight
_syscall = types.ExternalFunction(
    "syscall", types.intp(types.intp, types.intp, types.intp, types.intp,
                          types.intp, types.intp, types.intp))
_errno_location = types.ExternalFunction(
    "__errno_location", types.CPointer(types.int32)())

# `Ring.layout`: indices (in 4-byte words) into the mapped areas, and the
# masks, of what the kernel shares.
_SQ_HEAD, _SQ_TAIL, _SQ_MASK, _SQ_ARRAY, _CQ_HEAD, _CQ_TAIL, _CQ_MASK, \
    _CQES, _RING_FD = range(9)


@intrinsic
def _fence(typingctx):
    """A full memory barrier (``fence seq_cst``): the ring's entries are
    written before its tail, and its completions read after theirs, as the
    kernel's side of the ring expects on every architecture."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(nogil=True, cache=True)
def _setup(entries, params):
    """``io_uring_setup``: the ring's fd, or ``-errno``."""
    fd = _syscall(_SETUP, entries, params.ctypes.data, 0, 0, 0, 0)
    return fd if fd >= 0 else -np.int64(_errno_location()[0])


class Ring:
    """One io_uring instance of ``entries`` submission slots (a power of
    two), mapped for `ring_direct`; one thread uses it at a time.

    Raises
    ------
    OSError
        If the kernel refuses it (no io_uring, a seccomp policy, or
        ``RLIMIT_MEMLOCK`` on kernels before 5.12).
    """

    def __init__(self, entries: int):
        params = np.zeros(30, dtype=np.uint32)  # struct io_uring_params
        fd = int(_setup(entries, params))
        if fd < 0:
            raise OSError(-fd, f"io_uring_setup({entries}): "
                          f"{os.strerror(-fd)}")
        self.fd = fd
        self.entries = int(params[0])
        sq_off, cq_off = params[10:17], params[20:26]
        try:
            access = mmap.PROT_READ | mmap.PROT_WRITE
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._sq = mmap.mmap(fd, int(sq_off[6]) + 4 * self.entries,
                                 flags, access, offset=0)
            self._cq = mmap.mmap(fd, int(cq_off[5]) + 16 * int(params[1]),
                                 flags, access, offset=_OFF_CQ_RING)
            self._sqes = mmap.mmap(fd, 64 * self.entries, flags, access,
                                   offset=_OFF_SQES)
        except BaseException:
            os.close(fd)
            raise
        self.sq = np.frombuffer(self._sq, dtype=np.uint32)
        self.cq = np.frombuffer(self._cq, dtype=np.int32)
        self.sqes = np.frombuffer(self._sqes, dtype=np.int64).reshape(-1, 8)
        self.layout = np.array(
            [sq_off[0] // 4, sq_off[1] // 4,
             self.sq[sq_off[2] // 4], sq_off[6] // 4,
             cq_off[0] // 4, cq_off[1] // 4,
             self.cq[cq_off[2] // 4], cq_off[5] // 4, fd], dtype=np.int64)
        #: Scratch of `ring_direct`: each slot's iovecs, run, and length.
        self.iov = np.zeros((self.entries, IOV_MAX, 2), dtype=np.int64)
        self.slots = np.zeros((self.entries, 2), dtype=np.int64)

    def close(self) -> None:
        """Unmap the areas and close the fd (no read may be in flight)."""
        if self.fd >= 0:
            del self.sq, self.cq, self.sqes
            for area in (self._sq, self._cq, self._sqes):
                area.close()
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:  # best effort at interpreter exit
            pass


@functools.cache
def available() -> bool:
    """Whether io_uring can be set up here (tried once per process)."""
    try:
        Ring(2).close()
    except OSError:
        return False
    return True


@njit(nogil=True, cache=True)
def _enter(layout, submit, wait):
    """``io_uring_enter``: submit ``submit`` queued reads, wait for
    ``wait`` completions; retried while interrupted. Returns 0, or
    ``-errno`` of a failure."""
    while True:
        got = _syscall(_ENTER, layout[_RING_FD], submit, wait, _GETEVENTS,
                       0, 0)
        if got >= 0:
            return 0
        error = np.int64(_errno_location()[0])
        if error != _EINTR and error != _EAGAIN and error != _EBUSY:
            return -error
        if error != _EINTR:
            # The completion queue is full: reap before more are taken.
            return 0


@njit(nogil=True, cache=True, inline="always")
def _batch(flying):
    """Completions to wait for with ``flying`` reads in flight: a
    quarter of them (at least one), so that one wake-up reaps several
    and refills the queue with as many. Waiting for one at a time took
    about 12% more CPU per read on the virtio disk of `bench/results`
    (synth-igb, depth 64: 4.9 us against 4.3 us over 8 batches of 43K
    random 4 KiB reads, at the same reads/s)."""
    return max(1, flying // _BATCH_SHARE)


@njit(nogil=True, cache=True, inline="always")
def _queue(sq, sqes, layout, opcode, fd, offset, address, n, slot):
    """Queue one read at file ``offset`` tagged with ``slot``: ``READV``
    of ``n`` iovecs at ``address``, or ``READ`` of ``n`` bytes to it; its
    entry written, then the tail moved past it."""
    tail = np.int64(sq[layout[_SQ_TAIL]])
    index = tail & layout[_SQ_MASK]
    sqes[index, 0] = opcode | (np.int64(fd) << 32)
    sqes[index, 1] = offset
    sqes[index, 2] = address
    sqes[index, 3] = n
    sqes[index, 4] = slot
    sqes[index, 5] = 0
    sqes[index, 6] = 0
    sqes[index, 7] = 0
    sq[layout[_SQ_ARRAY] + index] = index
    _fence()
    sq[layout[_SQ_TAIL]] = (tail + 1) & 0xFFFFFFFF


@njit(nogil=True, cache=True, inline="always")
def _reap(cq, layout, done):
    """The completions posted, as ``(tag, result)`` rows of ``done`` (room
    for every read in flight); the queue's head moved past them. Returns
    how many."""
    head = np.int64(cq[layout[_CQ_HEAD]]) & 0xFFFFFFFF
    tail = np.int64(cq[layout[_CQ_TAIL]]) & 0xFFFFFFFF
    _fence()
    count = 0
    while head != tail:
        at = layout[_CQES] + 4 * (head & layout[_CQ_MASK])
        done[count, 0] = np.int64(cq[at]) & 0xFFFFFFFF
        done[count, 1] = cq[at + 2]
        count += 1
        head = (head + 1) & 0xFFFFFFFF
    _fence()
    cq[layout[_CQ_HEAD]] = np.int32(head if head < 2**31 else head - 2**32)
    return count


@njit(nogil=True, cache=True, inline="always")
def _landed(slots, free, free_count, slot, got, failed, counts):
    """A read of ``slot`` landed with result ``got``: its bytes and the
    read counted, the slot freed; short of the slot's length, its run
    becomes ``failed`` (the first such run). Returns ``(free_count,
    failed)``."""
    counts[1] += 1
    if got > 0:
        counts[0] += got
    if got != slots[slot, 1] and (failed < 0 or slots[slot, 0] < failed):
        failed = slots[slot, 0]
    free[free_count] = slot
    return free_count + 1, failed


@njit(nogil=True, cache=True)
def ring_direct(sq, cq, sqes, layout, iov, slots, depth, fd, file_offsets,
                lengths, first, stop, row_offsets, row_first, row_stop,
                row_bytes, bases, which, where, sink, sink_bytes, counts):
    """Runs ``first`` to ``stop - 1`` read straight into their rows'
    places through the ring, up to ``depth`` reads in flight.

    The arguments after ``depth`` are `hmgraph.cache.diskio.
    read_direct`'s (without its ``iov``): row ``i`` lies at byte
    ``row_offsets[i]`` of the file and goes to ``bases[which[i]] +
    where[i] * row_bytes``; gaps go to ``sink``. ``sq``, ``cq``,
    ``sqes``, ``layout``, ``iov`` and ``slots`` are a `Ring`'s; ``depth``
    is at most its ``entries``. Adds the bytes and reads to ``counts``.

    Returns
    -------
    int
        -1; or the first run that failed or came back short (every read
        in flight is waited for first, so none writes after the return:
        the caller reads again through a buffer); or ``-2 - errno``
        where ``io_uring_enter`` failed.
    """
    free = np.arange(depth)
    free_count = depth
    done = np.empty((depth, 2), dtype=np.int64)
    queued = 0  # queued, not yet submitted
    flying = 0
    failed = -1
    r = first
    pos = file_offsets[r] if r < stop else 0
    k = row_first
    while True:
        # (1) Queue reads while slots are free: one run, or IOV_MAX
        # pieces of it, per read.
        while failed < 0 and free_count and r < stop:
            free_count -= 1
            slot = free[free_count]
            start = pos
            end = file_offsets[r] + lengths[r]
            n, pos, k = fill_iovecs(iov[slot], pos, end, k, row_offsets,
                                    row_stop, row_bytes, bases, which,
                                    where, sink, sink_bytes)
            slots[slot, 0] = r
            slots[slot, 1] = pos - start
            _queue(sq, sqes, layout, _READV, fd, start,
                   iov[slot].ctypes.data, n, slot)
            queued += 1
            flying += 1
            if pos == end:
                r += 1
                if r < stop:
                    pos = file_offsets[r]
        if not flying:
            return failed
        # (2) Submit them and wait for a share to finish; (3) reap.
        error = _enter(layout, queued, _batch(flying))
        if error:  # a misuse of the ring (EBADF, EFAULT, ...), not a read
            return -2 + error
        queued = (np.int64(sq[layout[_SQ_TAIL]])
                  - np.int64(sq[layout[_SQ_HEAD]])) & 0xFFFFFFFF
        for j in range(_reap(cq, layout, done)):
            free_count, failed = _landed(slots, free, free_count,
                                         done[j, 0], done[j, 1], failed,
                                         counts)
            flying -= 1


@njit(nogil=True, cache=True, inline="always")
def _piece_landed(b, idle, idle_count, owner, failed, buffer, stride,
                  piece_rows, row_offsets, row_bytes, targets, which,
                  where):
    """Piece buffer ``b``'s runs all landed: its rows copied out (unless a
    read failed), the buffer freed. Returns ``idle_count``."""
    if failed < 0:
        w0 = piece_rows[owner[b]]
        scatter_rows(buffer[b * stride:],
                     row_offsets[w0:piece_rows[owner[b] + 1]], row_bytes,
                     targets, which, where, w0)
    idle[idle_count] = b
    return idle_count + 1


@njit(nogil=True, cache=True)
def ring_pieces(sq, cq, sqes, layout, slots, depth, fd, buffer, base,
                stride, file_offsets, lengths, buffer_offsets, piece_runs,
                piece_rows, row_offsets, row_bytes, targets, which, where,
                first, stop, counts):
    """Pieces ``first`` to ``stop - 1`` of a read plan through the ring:
    up to ``depth`` runs in flight, each piece read into a buffer of its
    own, its rows copied out as soon as its last run lands while the
    others' reads go on.

    ``buffer`` (``base``: its address) holds ``len(buffer) // stride``
    piece buffers of ``stride`` bytes; the rest is
    `hmgraph.cache.diskio.read_pieces`' (run ``r`` of a piece goes to
    ``buffer_offsets[r]`` of the piece's buffer; rows are cut out with
    `hmgraph.cache.engine.scatter_rows`). ``slots`` is a `Ring`'s.

    Returns
    -------
    int
        -1; the first run that failed or came back short (every read in
        flight waited for first; the caller reads again); or ``-2 -
        errno`` where ``io_uring_enter`` failed.
    """
    buffers = buffer.shape[0] // stride
    free = np.arange(depth)
    free_count = depth
    done = np.empty((depth, 2), dtype=np.int64)
    idle = np.arange(buffers)  # piece buffers not in use
    idle_count = buffers
    owner = np.full(buffers, -1, dtype=np.int64)  # its piece
    left = np.zeros(buffers, dtype=np.int64)  # its runs not landed
    queued = 0
    flying = 0
    failed = -1
    p = first  # the next piece to start
    r = piece_runs[first] if first < stop else 0  # its next run
    b = -1  # the piece buffer of the piece being queued
    while True:
        # (1) Queue runs while slots are free; a piece takes a buffer when
        # its first run is queued.
        while failed < 0 and free_count and p < stop:
            if b < 0:
                if not idle_count:
                    break
                idle_count -= 1
                b = idle[idle_count]
                owner[b] = p
                left[b] = piece_runs[p + 1] - piece_runs[p]
            free_count -= 1
            slot = free[free_count]
            slots[slot, 0] = r
            slots[slot, 1] = lengths[r]
            _queue(sq, sqes, layout, _READ, fd, file_offsets[r],
                   base + b * stride + buffer_offsets[r], lengths[r],
                   slot * buffers + b)
            queued += 1
            flying += 1
            r += 1
            if r == piece_runs[p + 1]:
                p += 1
                b = -1
        if not flying:
            return failed
        # (2) Submit, wait for a share; (3) reap, and copy out every piece
        # whose runs all landed.
        error = _enter(layout, queued, _batch(flying))
        if error:
            return -2 + error
        queued = (np.int64(sq[layout[_SQ_TAIL]])
                  - np.int64(sq[layout[_SQ_HEAD]])) & 0xFFFFFFFF
        for j in range(_reap(cq, layout, done)):
            slot, b_done = done[j, 0] // buffers, done[j, 0] % buffers
            free_count, failed = _landed(slots, free, free_count, slot,
                                         done[j, 1], failed, counts)
            flying -= 1
            left[b_done] -= 1
            if left[b_done] == 0:
                idle_count = _piece_landed(
                    b_done, idle, idle_count, owner, failed, buffer, stride,
                    piece_rows, row_offsets, row_bytes, targets, which,
                    where)

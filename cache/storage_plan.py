"""Read planning of the storage tier: sorted row ids to runs and tasks.

`hmgraph.cache.storage.StorageFeature` plans every request here before
its threads read it (`hmgraph.cache.storage_reads`), all vectorised over
the ids:

1. Map each row's byte range to its range of blocks: the disk's logical
   blocks (512 B on most disks), the smallest unit ``O_DIRECT`` can read.
   Rows may straddle blocks; the data start is page aligned.
2. Coalesce the blocks into runs of consecutive blocks: rows on the same
   block or on blocks at most ``max_gap_blocks`` apart share one run (the
   gap is read too), and no run exceeds ``max_run_blocks``. By default the
   block size and the gap come from the disk's measured model
   (`hmgraph.cache.disk`): a gap is read through when moving its bytes
   costs less than one more request.
3. Group the runs into pieces of about ``chunk_blocks`` (one read
   buffer's worth) and the pieces into tasks, one per thread. A thread
   reads a piece, copies its rows into place, then reads the next, so the
   disk and the copies are busy together: while one thread copies, the
   others' reads are in flight (on synth-small's batches of 80 MB, 0.057 s
   a batch with pieces of two 256 KiB runs against 0.079 s with one 4 MiB
   buffer of 4 MiB runs per task).

How many requests to keep in flight is measured, not guessed: the disk
model (`hmgraph.cache.disk`) tries depths 1 to 128 and the tier uses the
depth where random reads/s stop growing (64 on the virtio disk this was
written on, with 3.6x the reads/s of depth 4). The same model prices a
request against a byte, so a gap is read through only when it is cheaper
than one more request at that depth (10 KiB there, against 49 KiB at
depth 4); and each request gets as many tasks as the depth the model
prices its reads and bytes soonest at (`DiskModel.depth_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hmgraph.cache.disk import DiskModel, ReadPlan, read_plan
from hmgraph.cache.format import PAGE_BYTES

__all__ = ["PiecePlan", "ReadTask", "check_sizes", "plan_tasks",
           "read_sizes"]


@dataclass(frozen=True)
class PiecePlan:
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
class ReadTask:
    """One thread's share of a request: pieces ``first`` to ``stop - 1``
    of ``reads``, through a buffer of ``buffer_bytes``; ``blocks`` is
    what its pieces read."""

    reads: PiecePlan
    first: int
    stop: int
    buffer_bytes: int
    blocks: int


def plan_tasks(unique: np.ndarray, row_bytes: int, data_offset: int,
               block_bytes: int, *, max_gap_blocks: int,
               max_run_blocks: int, chunk_blocks: int, num_threads: int,
               disk: DiskModel) -> list[ReadTask]:
    """Block runs, pieces and tasks for sorted unique row ids.

    Parameters
    ----------
    unique : numpy.ndarray
        Sorted unique int64 row ids, at least one.
    row_bytes : int
        Bytes of one row, more than 0.
    data_offset : int
        File offset of row 0, in bytes; a multiple of ``block_bytes``.
    block_bytes : int
        The read unit, in bytes.
    max_gap_blocks : int
        Gaps of at most this many blocks between wanted blocks are read
        through.
    max_run_blocks : int
        Most blocks of one read (a run).
    chunk_blocks : int
        Target blocks of one piece (a read buffer's worth).
    num_threads : int
        Most tasks.
    disk : DiskModel
        Prices the request's reads and bytes: how many tasks to run.

    Returns
    -------
    list of ReadTask
        At most ``num_threads`` tasks over one `PiecePlan`, in file order.
    """
    count = len(unique)
    # (1)-(2) Each row's block range; segments of consecutive blocks
    # (short gaps read through).
    plan = read_plan(unique, row_bytes, data_offset, block_bytes,
                     max_gap_blocks)
    first, last = plan.first, plan.last
    target, segment, seg_rows = _segments(plan, num_threads, chunk_blocks,
                                          max_run_blocks)
    seg_first = first[seg_rows]
    seg_last = last[np.append(seg_rows[1:], count) - 1]
    seg_blocks = seg_last - seg_first + 1
    # (3) Pieces: consecutive segments, about `target` blocks each. A
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
    start = data_offset + unique * row_bytes
    row_offsets = (seg_buffer - seg_first)[segment] * block_bytes + start
    # Runs: segments cut into pieces of at most `max_run_blocks`.
    run_count = -(-seg_blocks // max_run_blocks)
    run_seg = np.repeat(np.arange(len(seg_rows)), run_count)
    run_index = np.arange(len(run_seg)) - np.repeat(
        np.cumsum(run_count) - run_count, run_count)
    run_skip = run_index * max_run_blocks
    run_first = seg_first[run_seg] + run_skip
    run_blocks = np.minimum(max_run_blocks,
                            seg_last[run_seg] - run_first + 1)
    reads = PiecePlan(
        run_file=run_first * block_bytes, run_bytes=run_blocks * block_bytes,
        run_buffer=(seg_buffer[run_seg] + run_skip) * block_bytes,
        piece_runs=np.append(np.searchsorted(run_seg, piece_segs),
                             len(run_seg)),
        piece_rows=np.append(seg_rows[piece_segs], count),
        row_offsets=row_offsets, row_file=start)
    depth = disk.depth_for(len(run_seg),
                           int(run_blocks.sum()) * block_bytes)
    return _split_tasks(reads, np.add.reduceat(seg_blocks, piece_segs),
                        min(len(piece_segs), num_threads, depth),
                        block_bytes)


def check_sizes(max_run_bytes: int | None, chunk_bytes: int | None,
                max_gap_bytes: int | None) -> None:
    """Check the read sizes a storage tier is given (None: the default).

    Raises
    ------
    ValueError
        If ``max_run_bytes`` is under a page, ``chunk_bytes`` under
        ``max_run_bytes`` (a task reads whole runs) or ``max_gap_bytes``
        negative.
    """
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


def read_sizes(disk: DiskModel, direct: bool, itemsize: int,
               block_bytes: int | None, max_run_bytes: int | None,
               chunk_bytes: int | None, max_gap_bytes: int | None
               ) -> tuple[int, int, int, int]:
    """The read sizes of a storage tier, defaults filled in from the disk.

    Parameters
    ----------
    disk : DiskModel
        The disk's model: its block size, gap and fastest request size.
    direct : bool
        Whether reads bypass the page cache (else the block is a page).
    itemsize : int
        Bytes of one element of the rows; a block holds whole elements.
    block_bytes, max_run_bytes, chunk_bytes, max_gap_bytes : int or None
        As `hmgraph.cache.storage.StorageFeature` takes them; None for
        the default.

    Returns
    -------
    (int, int, int, int)
        ``block_bytes``, ``max_gap_bytes``, then the most blocks of a run
        and a piece's target blocks.

    Raises
    ------
    ValueError
        If ``block_bytes`` does not divide `PAGE_BYTES` or is no multiple
        of ``itemsize``.
    """
    if max_run_bytes is None:
        max_run_bytes = min(disk.run_bytes, chunk_bytes or disk.run_bytes)
    if chunk_bytes is None:
        chunk_bytes = 2 * max_run_bytes
    if block_bytes is None:
        block_bytes = disk.block_bytes if direct else PAGE_BYTES
    if block_bytes < 1 or PAGE_BYTES % block_bytes \
            or block_bytes % itemsize:
        raise ValueError(
            f"block_bytes must divide {PAGE_BYTES} and be a multiple of "
            f"the {itemsize}-byte element, got {block_bytes}"
        )
    if max_gap_bytes is None:
        max_gap_bytes = disk.gap_bytes
    return (block_bytes, max_gap_bytes, max_run_bytes // block_bytes,
            chunk_bytes // block_bytes)


def _segments(plan: ReadPlan, num_threads: int, chunk_blocks: int,
              max_run_blocks: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Cut a read plan's runs into segments; ``(target, segment,
    seg_rows)``: blocks per piece, each row's segment, each segment's
    first row. ``plan.opens`` is updated in place.

    Pieces of `target` blocks are read and copied out one at a time:
    small enough that every thread gets some of a small request, and that
    one thread's copying overlaps the others' reads. Long segments are
    cut (between rows) every `cut` blocks, no finer than a run, since a
    row straddling the cut costs a block twice.
    """
    first, last, opens = plan.first, plan.last, plan.opens
    before = np.empty(len(first), dtype=np.int64)
    before[0] = first[0] - 1
    before[1:] = last[:-1]
    total_blocks = int((last - np.maximum(first - 1, before)).sum())
    target = min(chunk_blocks, max(1, -(-total_blocks // num_threads)))
    cut = max(target, max_run_blocks)
    segment = np.cumsum(opens) - 1
    offset = first - first[opens][segment]
    piece = offset // cut
    opens[1:] |= piece[1:] != piece[:-1]
    segment = np.cumsum(opens) - 1
    return target, segment, np.flatnonzero(opens)


def _split_tasks(reads: PiecePlan, piece_blocks: np.ndarray, tasks: int,
                 block_bytes: int) -> list[ReadTask]:
    """Consecutive pieces in ``tasks`` tasks of about equal blocks.

    Each task is one call of the compiled loop (not one call per piece),
    one per thread at the depth the model prices the request's reads and
    bytes soonest at: every thread for many small reads, fewer where
    bytes dominate.
    """
    share = -(-int(piece_blocks.sum()) // tasks)
    piece_before = np.cumsum(piece_blocks) - piece_blocks
    bounds = np.flatnonzero(np.diff(piece_before // share, prepend=-1))
    bounds = np.append(bounds, len(piece_blocks))
    return [ReadTask(reads, int(a), int(b),
                     int(piece_blocks[a:b].max()) * block_bytes,
                     int(piece_blocks[a:b].sum()))
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

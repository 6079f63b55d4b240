"""What a disk charges for reads: a measured model, and read plans priced by it.

A disk is charged per request and per byte, never per row. `DiskModel`
holds what one device was measured to do:

* ``block_bytes``: its logical block size, the unit ``O_DIRECT`` reads
  align to (512 B on most NVMe and virtio disks, 4096 B on some);
* ``iops``: random 4 KiB ``O_DIRECT`` reads per second with ``queue_depth``
  requests in flight (the storage tier's thread count);
* ``bandwidth``: bytes per second of large reads, ``queue_depth`` in
  flight.

A read plan that issues ``r`` requests for ``b`` bytes then costs about
``r / iops + b / bandwidth`` seconds (`DiskModel.seconds`), and a gap
between two wanted blocks is worth reading through when it is shorter than
``bandwidth / iops`` bytes (`DiskModel.gap_bytes`): moving those bytes
costs less than one more request.

`disk_model` measures a device once, briefly (about two seconds, on the
feature file itself), and caches the result in ``<file>.disk.json`` beside
the file, keyed by the device id, and in memory for the process.

`read_plan` is the planner's first step, shared by the storage tier and the
analysis: the block runs a set of rows needs under a gap rule, and what
they cost in requests and bytes.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import numbers
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hmgraph.cache.format import PAGE_BYTES, atomic_path

log = logging.getLogger(__name__)

__all__ = ["BLOCK_SIZES", "DiskModel", "ReadPlan", "block_span", "disk_model",
           "measure_disk", "read_plan"]

#: Version of the cached measurement; older caches are measured again.
_MODEL_VERSION = 2
_IOPS_READ_BYTES = 4096
_SEQ_READ_BYTES = 1 << 20
_PROBE_SIZES = (512, 1024, 2048, 4096)
#: Logical block sizes a model may hold: what `measure_disk` can find.
BLOCK_SIZES = _PROBE_SIZES
_memo: dict[tuple, DiskModel] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class DiskModel:
    """What a device charges for reads.

    Attributes
    ----------
    block_bytes : int
        Logical block size: the smallest ``O_DIRECT`` read unit.
    iops : float
        Random 4 KiB reads per second at ``queue_depth``.
    bandwidth : float
        Bytes per second of large reads at ``queue_depth``.
    queue_depth : int
        Requests in flight while measuring (the tier's threads).
    device : int
        ``st_dev`` of the file measured on.
    """

    block_bytes: int
    iops: float
    bandwidth: float
    queue_depth: int
    device: int = 0

    def __post_init__(self):
        block = self.block_bytes
        if isinstance(block, bool) or not isinstance(block, numbers.Integral) \
                or block not in BLOCK_SIZES:
            raise ValueError(
                f"block_bytes must divide {PAGE_BYTES} and be an integer "
                f"of at least 512 ({', '.join(map(str, BLOCK_SIZES))}), "
                f"got {block!r}"
            )
        for key, unit in (("iops", "reads per second"),
                          ("bandwidth", "bytes per second")):
            value = getattr(self, key)
            if isinstance(value, bool) \
                    or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"{key} must be positive and finite ({unit}), got "
                    f"{value!r}"
                )

    def seconds(self, requests: int, nbytes: int) -> float:
        """Modelled seconds of ``requests`` reads moving ``nbytes``."""
        return requests / self.iops + nbytes / self.bandwidth

    @property
    def gap_bytes(self) -> int:
        """Longest gap cheaper to read through than to skip (bytes)."""
        return int(self.bandwidth / self.iops)

    def as_dict(self) -> dict:
        """The model as JSON-ready data, the break-even gap included."""
        return dict(asdict(self), gap_bytes=self.gap_bytes)

    def describe(self) -> str:
        """One line for logs and reports."""
        return (f"{self.iops:,.0f} random 4 KiB reads/s at queue depth "
                f"{self.queue_depth}, {self.bandwidth / 1e9:.2f} GB/s "
                f"sequential, {self.block_bytes} B blocks (read through "
                f"gaps under {self.gap_bytes / 1024:.0f} KiB)")


#: Used where nothing can be measured (no O_DIRECT): a page per block and
#: a typical SATA/NVMe-over-virtio balance.
FALLBACK = DiskModel(PAGE_BYTES, 10_000.0, 700e6, 4)


def _direct_fd(path: Path) -> int | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None


def _block_bytes(fd: int, limit: int) -> int | None:
    """Smallest read size (and alignment) ``O_DIRECT`` accepts."""
    buffer = mmap.mmap(-1, PAGE_BYTES)
    for size in _PROBE_SIZES:
        if 2 * size > limit:
            break
        try:
            os.preadv(fd, [memoryview(buffer)[:size]], size)
            return size
        except OSError:
            continue
    return None


def _hammer(fd: int, offsets: np.ndarray, size: int, threads: int,
            seconds: float) -> tuple[int, float]:
    """Read ``size`` bytes at ``offsets`` from ``threads`` threads.

    Each thread takes the next offset in turn (so ``threads`` requests are
    in flight) until the offsets or the time run out. Returns the reads
    done and the seconds taken.
    """
    position = iter(range(len(offsets)))
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    done = [0] * threads

    def work(index: int) -> None:
        buffer = mmap.mmap(-1, size)
        view = memoryview(buffer)
        while time.perf_counter() < deadline:
            with lock:
                at = next(position, None)
            if at is None:
                return
            os.preadv(fd, [view], int(offsets[at]))
            done[index] += 1

    began = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,), daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(done), max(time.perf_counter() - began, 1e-9)


def measure_disk(path: str | os.PathLike, queue_depth: int = 4,
                 seconds: float = 2.0, seed: int = 0) -> DiskModel:
    """Measure the device holding ``path`` by reading ``path`` itself.

    After a warm-up of a tenth of ``seconds``, half of ``seconds`` goes to
    random 4 KiB ``O_DIRECT`` reads at random page offsets of the file,
    half to 1 MiB reads sweeping the file, each with ``queue_depth``
    threads reading. The logical block size is the
    smallest read ``O_DIRECT`` accepts (probed at 512 B to 4 KiB).

    Returns `FALLBACK` (with a warning in the log) where the file cannot
    be opened with ``O_DIRECT`` or is smaller than two pages.
    """
    path = Path(path)
    size = path.stat().st_size
    device = path.stat().st_dev
    fd = _direct_fd(path)
    if fd is None or size < 2 * PAGE_BYTES:
        if fd is not None:
            os.close(fd)
        log.warning("%s: cannot measure the disk (no O_DIRECT or too "
                    "small); using %s", path, FALLBACK.describe())
        return DiskModel(**dict(asdict(FALLBACK), device=device))
    try:
        block = _block_bytes(fd, size) or PAGE_BYTES
        rng = np.random.default_rng(seed)
        pages = size // PAGE_BYTES
        offsets = rng.integers(0, pages, 1 << 21) * PAGE_BYTES
        # Virtual disks start slow after idling: a short warm-up first.
        _hammer(fd, offsets[-(1 << 20):], _IOPS_READ_BYTES, queue_depth,
                seconds / 10)
        reads, took = _hammer(fd, offsets, _IOPS_READ_BYTES, queue_depth,
                              seconds / 2)
        iops = reads / took
        # Sequential: consecutive 1 MiB reads, wrapping around small files.
        chunks = max(1, size // _SEQ_READ_BYTES)
        sweep = (np.arange(1 << 16) % chunks) * _SEQ_READ_BYTES
        length = min(_SEQ_READ_BYTES, size - size % PAGE_BYTES)
        reads, took = _hammer(fd, sweep, length, queue_depth, seconds / 2)
        bandwidth = reads * length / took
    finally:
        os.close(fd)
    return DiskModel(block, iops, bandwidth, queue_depth, device)


def disk_model(path: str | os.PathLike, queue_depth: int = 4,
               seconds: float = 2.0, refresh: bool = False) -> DiskModel:
    """The device model for ``path``'s device: cached, else measured.

    The measurement is kept in ``<path>.disk.json`` (written atomically)
    and in memory, keyed by the device id and queue depth; a cache from
    another device (the file was moved) is measured again, and so is any
    with ``refresh`` (a disk whose speed has drifted: ``hmgraph disk
    --refresh``).
    """
    path = Path(path)
    device = path.stat().st_dev
    key = (device, queue_depth)
    with _memo_lock:
        if key in _memo and not refresh:
            return _memo[key]
        cache = path.with_name(path.name + ".disk.json")
        model = None if refresh else _load(cache, device, queue_depth)
        if model is None:
            model = measure_disk(path, queue_depth, seconds)
            log.info("measured %s: %s", path, model.describe())
            try:
                with atomic_path(cache) as tmp:
                    tmp.write_text(json.dumps(
                        dict(model.as_dict(), version=_MODEL_VERSION),
                        indent=1))
            except OSError as err:  # a read-only dataset folder
                log.info("cannot cache the disk model in %s: %s", cache, err)
        _memo[key] = model
        return model


def _load(cache: Path, device: int, queue_depth: int) -> DiskModel | None:
    """The model cached in ``cache``; None: measure again.

    A cache of another version, device or queue depth is measured again
    quietly; one that cannot be read or holds a bad value (NaN IOPS, an
    infinite bandwidth, a block size of 8 or 512.0) is measured again with
    a warning naming the file, the key and the valid range, and then
    rewritten by `disk_model`.
    """
    try:
        record = json.loads(cache.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s); measuring the disk again",
                    cache, err)
        return None
    if not isinstance(record, dict):
        log.warning("%s holds no disk model; measuring the disk again", cache)
        return None
    if (record.get("version") != _MODEL_VERSION
            or record.get("device") != device
            or record.get("queue_depth") != queue_depth):
        return None
    try:
        return DiskModel(record["block_bytes"], record["iops"],
                         record["bandwidth"], queue_depth, device)
    except KeyError as err:
        log.warning("%s lacks %s; measuring the disk again", cache, err)
    except ValueError as err:
        log.warning("%s: %s; measuring the disk again", cache, err)
    return None


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

"""What a disk charges for reads: a measured model, and read plans priced by it.

A disk is charged per request and per byte, never per row. `DiskModel`
holds what one device was measured to do:

* ``block_bytes``: its logical block size, the unit ``O_DIRECT`` reads
  align to (512 B on most NVMe and virtio disks, 4096 B on some);
* ``queue_depth``: requests in flight, measured where reads/s stop
  growing (1 to 128 tried; the storage tier keeps that many in flight);
* ``iops``: random 4 KiB ``O_DIRECT`` reads per second at that depth;
* ``bandwidth``: what one more byte of a read costs at that depth, as
  bytes per second: the slope between random 4 KiB and random
  ``THROUGH_BYTES`` reads (``through_sweep``, every depth). That is what
  a run that reads through gaps pays for them, at a random place in the
  file; long sequential streams move more (``run_sweep``: per depth, the
  fastest of the request sizes ``RUN_SIZES``, the longest run the tier
  issues being ``run_bytes``). On the virtio disk of
  `bench/results`, at depth 32: 4 KiB reads 12.4 us each, 64 KiB 43.2
  us, 256 KiB 169 us (1.64 GB/s more per byte), sequential 4 MiB reads
  2.1 GB/s; a synth-papers batch's misses read in 2.35 s with gaps under
  16 KiB read through, 2.56 s under 30 KiB (the sequential rate's
  break-even) and 3.48 s under 64 KiB.
  Neither deeper nor bigger is always faster: random 4 KiB reads/s grew
  up to depth 128 there, while 80 MB of 256 KiB runs took 0.048 s at 16
  threads and 0.066 s at 128.

A read plan that issues ``r`` requests for ``b`` bytes then costs about
``r / iops + b / bandwidth`` seconds; where both were measured at every
depth, the least over the depths of ``r / iops(d) + b / bandwidth(d)``
(`DiskModel.seconds`), and the storage tier keeps that depth
(`DiskModel.depth_for`) of reads in flight for it. A gap
between two wanted blocks is worth reading through when it is shorter than
``bandwidth / iops`` bytes (`DiskModel.gap_bytes`): moving those bytes
costs less than one more request.

`disk_model` measures a device once, briefly (on the feature file
itself: about nine seconds and 9 GB read on synth-igb-large's), and
caches the result in ``<file>.disk.json`` beside the file, keyed by the
device id, and in memory for the process.

Depth matters more than any other setting: the planner reads through a
gap shorter than ``bandwidth / iops`` bytes, and measured at depth 4 on a
disk that serves 4x the reads/s at depth 64, that gap is 4x too long and
every batch reads bytes it does not need.

`read_plan` (`hmgraph.cache.readplan`, imported here) is the planner's
first step, shared by the storage tier and the analysis: the block runs a
set of rows needs under a gap rule, and what they cost in requests and
bytes.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import numbers
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hmgraph.cache.diskio import reads_per_second
from hmgraph.cache.format import PAGE_BYTES, atomic_path
from hmgraph.cache.readplan import ReadPlan, block_span, read_plan

log = logging.getLogger(__name__)

__all__ = ["BLOCK_SIZES", "DEPTHS", "RUN_SIZES", "THROUGH_BYTES",
           "DiskModel", "ReadPlan", "block_span", "choose_depth",
           "disk_model", "measure_disk", "read_plan", "through_rate"]

#: Version of the cached measurement; older caches are measured again.
_MODEL_VERSION = 7
_IOPS_READ_BYTES = 4096
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
        Bytes per second that reading through costs at ``queue_depth``
        (``through_sweep``'s rate there); where that was not measured,
        of sequential reads in requests of ``run_bytes`` at the depth
        that moved the most.
    queue_depth : int
        Requests in flight for random reads (the tier's threads).
    device : int
        ``st_dev`` of the file measured on.
    sweep : tuple of (int, float)
        Reads/s per depth tried, where the depth was chosen by
        measurement (`measure_disk`); empty otherwise.
    run_bytes : int
        The request size of sequential reads the storage tier issues
        (its longest run): where bytes per second peaked.
    run_sweep : tuple of (int, int, float)
        Per depth tried, its fastest request size and that size's
        bytes/s of sequential reads (`RUN_SIZES`); empty where none was
        measured.
    through_sweep : tuple of (int, float)
        Per depth tried, the bytes/s one more byte of a random read costs
        (`through_rate`); empty where none was measured.
    """

    block_bytes: int
    iops: float
    bandwidth: float
    queue_depth: int
    device: int = 0
    sweep: tuple = ()
    run_bytes: int = 1 << 20
    run_sweep: tuple = ()
    through_sweep: tuple = ()

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
        depth = self.queue_depth
        if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) \
                or depth < 1:
            raise ValueError(
                f"queue_depth must be a positive integer (requests in "
                f"flight), got {depth!r}"
            )
        run = self.run_bytes
        if isinstance(run, bool) or not isinstance(run, numbers.Integral) \
                or run < PAGE_BYTES or run % PAGE_BYTES:
            raise ValueError(
                f"run_bytes must be a positive multiple of {PAGE_BYTES} "
                f"(bytes per request), got {run!r}"
            )
        rates = [(name, cell[-1]) for name, cells in (
            ("sweep", self.sweep), ("run_sweep", self.run_sweep),
            ("through_sweep", self.through_sweep))
            for cell in cells]
        for name, rate in rates:
            if isinstance(rate, bool) or not isinstance(rate, numbers.Real) \
                    or not math.isfinite(rate) or rate <= 0:
                raise ValueError(
                    f"{name} rates must be positive and finite (per "
                    f"second), got {rate!r}"
                )

    def seconds(self, requests: int, nbytes: int) -> float:
        """Modelled seconds of ``requests`` reads moving ``nbytes``, at
        the depth `depth_for` picks."""
        return min(requests / iops + nbytes / bandwidth for _, iops,
                   bandwidth in self._by_depth())

    def depth_for(self, requests: int, nbytes: int) -> int:
        """The depth (reads in flight) that serves ``requests`` reads
        moving ``nbytes`` soonest: deep for many small reads, shallower
        where bytes dominate (the shallowest of equals)."""
        return min(self._by_depth(), key=lambda entry: (
            requests / entry[1] + nbytes / entry[2], entry[0]))[0]

    def _by_depth(self) -> list[tuple[int, float, float]]:
        """``(depth, reads/s, bytes/s)`` for every depth measured both
        ways, no deeper than `queue_depth`; else this model's own. A
        depth's bytes/s are reading through's where measured, else
        sequential reads'."""
        bandwidths = {depth: rate for depth, _, rate in self.run_sweep}
        bandwidths.update(
            (depth, rate) for depth, rate in self.through_sweep
            if depth in bandwidths)
        rows = [(depth, iops, bandwidths[depth]) for depth, iops in
                self.sweep if depth in bandwidths
                and depth <= self.queue_depth]
        return rows or [(self.queue_depth, self.iops, self.bandwidth)]

    @property
    def gap_bytes(self) -> int:
        """Longest gap cheaper to read through than to skip (bytes)."""
        return int(self.bandwidth / self.iops)

    def as_dict(self) -> dict:
        """The model as JSON-ready data, the break-even gap included."""
        return dict(asdict(self), gap_bytes=self.gap_bytes)

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.through_sweep and self.run_sweep:
            depth, _, rate = max(self.run_sweep, key=lambda c: c[2])
            moves = (f"{self.bandwidth / 1e9:.2f} GB/s read through, "
                     f"{rate / 1e9:.2f} GB/s sequential at depth {depth}")
        else:
            moves = (f"{self.bandwidth / 1e9:.2f} GB/s sequential at "
                     f"depth {self.depth_for(0, 1)}")
        return (f"{self.iops:,.0f} random 4 KiB reads/s at queue depth "
                f"{self.queue_depth}, {moves} in {self.run_bytes >> 10} "
                f"KiB reads, {self.block_bytes} B blocks (read through "
                f"gaps under {self.gap_bytes / 1024:.0f} KiB)")

    def describe_sweep(self) -> str:
        """Reads/s per depth tried, then GB/s per request size tried and
        read through; one line (empty without a sweep)."""
        depths = ", ".join(f"{depth}: {rate:,.0f}" for depth, rate in
                           self.sweep)
        runs = ", ".join(f"{depth}: {rate / 1e9:.2f} ({size >> 10} KiB)"
                         for depth, size, rate in self.run_sweep)
        runs = runs and f"sequential GB/s per depth {runs}"
        through = ", ".join(f"{depth}: {rate / 1e9:.2f}"
                            for depth, rate in self.through_sweep)
        through = through and f"read-through GB/s per depth {through}"
        return "; ".join(part for part in (depths, runs, through) if part)


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


#: Queue depths `measure_disk` tries when it chooses one.
DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)
#: A depth is deep enough once its reads/s reach this share of the best.
_KNEE = 0.9


#: Request sizes `measure_disk` reads sequentially, at every depth.
RUN_SIZES = (128 << 10, 256 << 10, 1 << 20, 4 << 20)
_RUN_ROUNDS = 2
#: Size of the random reads whose time over a 4 KiB read's prices a byte
#: read through (`through_rate`).
THROUGH_BYTES = 256 << 10


def through_rate(small_rate: float, large_rate: float, large_bytes: int,
                 sequential: float) -> float:
    """Bytes/s one more byte of a random read costs: ``large_bytes``
    random reads at ``large_rate`` per second against 4 KiB ones at
    ``small_rate``, and never above ``sequential`` (the same depth's
    sequential bytes/s: what the model prices long runs with too). A disk
    whose large reads take no longer than small ones (or a file too small
    to tell) gets ``sequential``."""
    extra = 1.0 / large_rate - 1.0 / small_rate
    if large_bytes <= _IOPS_READ_BYTES or extra <= 0:
        return sequential
    return min(sequential, (large_bytes - _IOPS_READ_BYTES) / extra)


def choose_depth(sweep: dict[int, float]) -> int:
    """The shallowest depth whose reads/s reach 90% of the best measured:
    where reads/s stop growing. Deeper queues cost threads and latency
    for nothing once the device is saturated."""
    best = max(sweep.values())
    return min(depth for depth, rate in sweep.items() if rate >= _KNEE * best)


def measure_disk(path: str | os.PathLike, queue_depth: int | None = None,
                 seconds: float = 3.0, seed: int = 0) -> DiskModel:
    """Measure the device holding ``path`` by reading ``path`` itself.

    Random 4 KiB ``O_DIRECT`` reads at random page offsets of the file,
    ``queue_depth`` in flight (compiled threads, `hmgraph.cache.diskio`),
    then sequential reads of each size of `RUN_SIZES` (each thread
    sweeping its own part of the file) and random reads of
    `THROUGH_BYTES` at the same depths: the model keeps each depth's
    fastest sequential size, the fastest of all as ``run_bytes``, and
    what a byte read through costs at each depth (`through_rate`), the
    chosen depth's as ``bandwidth``. With
    ``queue_depth=None`` the random reads are measured at every depth of
    `DEPTHS` (about half of ``seconds`` in all) and the model is the
    depth `choose_depth` picks; its ``sweep`` holds every depth's reads/s.
    A short warm-up comes first: virtual disks start slow after idling.
    The logical block size is the smallest read ``O_DIRECT`` accepts
    (probed at 512 B to 4 KiB).

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
    depths = DEPTHS if queue_depth is None else (queue_depth,)
    try:
        block = _block_bytes(fd, size) or PAGE_BYTES
        rng = np.random.default_rng(seed)
        offsets = rng.integers(0, size // PAGE_BYTES, 1 << 20) * PAGE_BYTES
        reads_per_second(fd, offsets, _IOPS_READ_BYTES, max(depths),
                         seconds / 20)
        each = seconds / 2 / len(depths)
        sweep = {depth: reads_per_second(fd, offsets, _IOPS_READ_BYTES,
                                         depth, each) for depth in depths}
        depth = choose_depth(sweep)
        # Sizes and depths interleaved over rounds, each cell's best
        # round kept: a virtual disk's bandwidth wavers, and one slow
        # moment should not decide the depth or the request size.
        # Random reads of THROUGH_BYTES beside them, per depth.
        large = min(THROUGH_BYTES, size - size % PAGE_BYTES)
        spots = rng.integers(0, (size - large) // PAGE_BYTES + 1,
                             1 << 16) * PAGE_BYTES
        cells = {(d, length): 0.0 for d in depths for length in RUN_SIZES}
        random_reads = dict.fromkeys(depths, 0.0)
        each = seconds / 2 / (len(cells) + len(depths)) / _RUN_ROUNDS
        for _ in range(_RUN_ROUNDS):
            for d, length in cells:
                cells[d, length] = max(cells[d, length], _bytes_per_second(
                    fd, size, length, d, each))
            for d in depths:
                random_reads[d] = max(random_reads[d], reads_per_second(
                    fd, spots, large, d, each))
    finally:
        os.close(fd)
    runs = tuple(max(((d, length, rate) for (d_, length), rate in
                      cells.items() if d_ == d), key=lambda cell: cell[2])
                 for d in depths)
    run = max(runs, key=lambda cell: cell[2])[1]
    through = tuple((d, through_rate(sweep[d], random_reads[d], large,
                                     sequential)) for d, _, sequential in runs)
    return DiskModel(block, sweep[depth], dict(through)[depth], depth,
                     device,
                     tuple(sorted(sweep.items())) if len(sweep) > 1 else (),
                     run, runs, through)


def _bytes_per_second(fd: int, size: int, length: int, depth: int,
                      seconds: float) -> float:
    """Sequential ``length``-byte reads' bytes/s, ``depth`` in flight:
    consecutive offsets, wrapping around small files."""
    length = min(length, size - size % PAGE_BYTES)
    chunks = max(1, size // length)
    offsets = (np.arange(1 << 16) % chunks) * length
    return length * reads_per_second(fd, offsets, length, depth, seconds)


def disk_model(path: str | os.PathLike, queue_depth: int | None = None,
               seconds: float = 3.0, refresh: bool = False,
               keep: bool = True) -> DiskModel:
    """The device model for ``path``'s device: cached, else measured.

    ``queue_depth=None`` (the storage tier's default) asks for the depth
    where the device's reads/s stop growing (`measure_disk`); a number
    asks for the model at that depth. Measurements are kept in
    ``<path>.disk.json`` (written atomically, one entry per depth asked
    for) and in memory, keyed by the device id; a cache from another
    device (the file was moved) is measured again, and so is any with
    ``refresh`` (a disk whose speed has drifted: ``hmgraph disk
    --refresh``). ``keep=False`` holds a new measurement in memory only,
    for this process: one taken while the CPUs were busy says as much of
    them as of the disk, and would price every later run's reads.
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
            if keep:
                _save(cache, model, queue_depth)
        _memo[key] = model
        return model


def _entry(queue_depth: int | None) -> str:
    """The cache file's key for a depth asked for."""
    return "chosen" if queue_depth is None else str(queue_depth)


def _save(cache: Path, model: DiskModel, queue_depth: int | None) -> None:
    """Add ``model`` to the cache file (entries of other devices and
    versions dropped)."""
    record = _read(cache, quiet=True) or {}
    if record.get("version") != _MODEL_VERSION \
            or record.get("device") != model.device \
            or not isinstance(record.get("models"), dict):
        record = {"version": _MODEL_VERSION, "device": model.device,
                  "models": {}}
    record["models"][_entry(queue_depth)] = model.as_dict()
    try:
        with atomic_path(cache) as tmp:
            tmp.write_text(json.dumps(record, indent=1))
    except OSError as err:  # a read-only dataset folder
        log.info("cannot cache the disk model in %s: %s", cache, err)


def _read(cache: Path, quiet: bool = False) -> dict | None:
    """The cache file's record, or None (with a warning unless quiet)."""
    try:
        record = json.loads(cache.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        if not quiet:
            log.warning("%s is unreadable (%s); measuring the disk again",
                        cache, err)
        return None
    if not isinstance(record, dict):
        if not quiet:
            log.warning("%s holds no disk model; measuring the disk again",
                        cache)
        return None
    return record


def _load(cache: Path, device: int, queue_depth: int | None
          ) -> DiskModel | None:
    """The model cached in ``cache`` for ``queue_depth``; None: measure.

    A cache of another version or device, or without the depth asked
    for, is measured again quietly; one that cannot be read or holds a
    bad value (NaN IOPS, an infinite bandwidth, a block size of 8 or
    512.0) is measured again with a warning naming the file, the key and
    the valid range, and then rewritten by `disk_model`.
    """
    record = _read(cache)
    if record is None or record.get("version") != _MODEL_VERSION \
            or record.get("device") != device:
        return None
    entry = (record.get("models") or {}).get(_entry(queue_depth))
    if not isinstance(entry, dict):
        return None
    try:
        depth = entry["queue_depth"]
        if queue_depth is not None and depth != queue_depth:
            return None
        return DiskModel(
            entry["block_bytes"], entry["iops"], entry["bandwidth"], depth,
            device, tuple(tuple(pair) for pair in entry.get("sweep", ())),
            entry["run_bytes"],
            tuple(tuple(cell) for cell in entry.get("run_sweep", ())),
            tuple(tuple(cell) for cell in entry.get("through_sweep", ())))
    except KeyError as err:
        log.warning("%s lacks %s; measuring the disk again", cache, err)
    except (TypeError, ValueError) as err:
        log.warning("%s: %s; measuring the disk again", cache, err)
    return None

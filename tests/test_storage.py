"""The storage tier: exact rows, exact counters, O_DIRECT and its fallback."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import accepts_o_direct
from contract import check_feature_contract
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgraph.cache import disk, storage, storage_reads, uring
from hmgraph.cache.disk import (
    DEPTHS,
    RUN_SIZES,
    DiskModel,
    choose_depth,
    disk_model,
    measure_disk,
    through_rate,
)
from hmgraph.cache.format import (
    DATA_OFFSET,
    PAGE_BYTES,
    FeatureFileError,
    write_feature_file,
)
from hmgraph.cache.storage import StorageFeature, StorageStats

REPO = Path(__file__).resolve().parents[1]
DEV_SHM = Path("/dev/shm")

ROWS = {
    "float32x100": ((1000, 100), np.float32),
    "float32x7-straddling": ((3000, 7), np.float32),
    "float16-3d": ((700, 3, 5), np.float16),
    "int64": ((900, 3), np.int64),
    "wider-than-a-page": ((60, 1500), np.float32),
    # Rows of whole blocks: read straight into the output (preadv).
    "one-block": ((1500, 128), np.float32),
    "three-blocks": ((800, 384), np.float32),
    "one-page": ((300, 1024), np.float32),
}

#: A fixed disk model: counters below do not depend on this machine.
MODEL = DiskModel(block_bytes=512, iops=10_000.0, bandwidth=500e6,
                  queue_depth=4)
#: Page-granular reads with 32 KiB gaps read through (the old constants).
PAGES = {"disk": MODEL, "block_bytes": PAGE_BYTES, "max_gap_bytes": 32 << 10}

CONFIGS = {
    "default": {},
    "sectors-no-gaps": {"disk": MODEL, "max_gap_bytes": 0},
    "one-thread": {"num_threads": 1},
    "one-page-runs": {"max_run_bytes": PAGE_BYTES,
                      "chunk_bytes": 2 * PAGE_BYTES, "num_threads": 3},
}

ID_SETS = {
    "sorted": lambda n, rng: np.arange(0, n, 3),
    "unsorted-duplicates": lambda n, rng: rng.integers(0, n, 2 * n),
    "empty": lambda n, rng: np.zeros(0, np.int64),
    "last-row": lambda n, rng: np.array([n - 1]),
    "all-rows": lambda n, rng: np.arange(n),
    "single": lambda n, rng: np.array([n // 2]),
}


def make_rows(shape, dtype, seed=0) -> np.ndarray:
    """Seeded rows with no two alike, so a wrong row cannot pass."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 1000).astype(dtype)


@pytest.mark.parametrize("ids", ID_SETS.values(), ids=ID_SETS.keys())
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("shape,dtype", ROWS.values(), ids=ROWS.keys())
def test_reads_equal_written_rows(disk_dir, shape, dtype, config, ids):
    rows = make_rows(shape, dtype)
    path = disk_dir / "feat.bin"
    write_feature_file(path, rows)
    with StorageFeature(path, **config) as feature:
        assert feature.shape == shape
        assert feature.dtype == torch.from_numpy(rows[:0]).dtype
        check_feature_contract(
            feature, rows, ids(shape[0], np.random.default_rng(1)))


@pytest.fixture(scope="module")
def straddling(tmp_path_factory):
    """An open StorageFeature of 7-float rows (28 bytes: rows straddle)."""
    folder = tmp_path_factory.mktemp("straddling")
    rows = make_rows((2000, 7), np.float32)
    write_feature_file(folder / "feat.bin", rows)
    feature = StorageFeature(folder / "feat.bin", num_threads=3,
                             max_run_bytes=2 * PAGE_BYTES,
                             chunk_bytes=4 * PAGE_BYTES)
    yield feature, rows
    feature.close()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_ids_read_exactly(straddling, data):
    feature, rows = straddling
    last = len(rows) - 1
    ids = data.draw(st.lists(
        st.one_of(st.integers(0, last), st.sampled_from([0, last])),
        max_size=300,
    ))
    check_feature_contract(feature, rows, ids)


def test_int32_and_numpy_ids(disk_dir):
    rows = make_rows((50, 4), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin") as feature:
        ids = np.array([7, 3, 7], dtype=np.int32)
        assert feature.read(ids).numpy().tobytes() == rows[ids].tobytes()
        assert feature.read(torch.from_numpy(ids)).shape == (3, 4)


# Counters ---------------------------------------------------------------

def test_contiguous_rows_read_their_pages_once(disk_dir):
    rows = make_rows((1000, 100), np.float32)  # 400 bytes a row
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin", **PAGES) as feature:
        feature.read(torch.arange(10))  # 4000 bytes: one page
        assert feature.stats.blocks_read == 1
        assert feature.stats.bytes_read == PAGE_BYTES
        feature.stats.reset()
        feature.read(torch.arange(11))  # 4400 bytes: two pages
        assert (feature.stats.blocks_read, feature.stats.io_requests) == (2, 1)
        feature.stats.reset()
        feature.read(torch.arange(1000))  # 400,000 bytes: 98 pages
        assert feature.stats.blocks_read == -(-400_000 // PAGE_BYTES)
        assert feature.stats.io_requests == 1  # one run, under max_run_bytes


def test_duplicates_read_once_and_counters_are_exact(disk_dir):
    rows = make_rows((1000, 100), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin", **PAGES) as feature:
        assert feature.stats == StorageStats()
        feature.read(torch.tensor([500, 500, 500]))
        record = feature.stats.as_dict()
        assert record["model_seconds"] == pytest.approx(
            1 / MODEL.iops + PAGE_BYTES / MODEL.bandwidth)
        assert record["cpu_seconds"] >= 0.0
        assert record | {"seconds": 0.0, "model_seconds": 0.0,
                         "seconds_vs_model": 0.0, "cpu_seconds": 0.0} == {
            "calls": 1, "rows_requested": 3, "rows_read": 1,
            "blocks_read": 1, "block_bytes": PAGE_BYTES,
            "bytes_read": PAGE_BYTES, "useful_bytes": 400, "io_requests": 1,
            "seconds": 0.0, "model_seconds": 0.0, "cpu_seconds": 0.0,
            "amplification": PAGE_BYTES / 400, "seconds_vs_model": 0.0,
        }
        # Rows 0 and 1 share page 0; row 999 sits far away: two runs.
        feature.read(torch.tensor([999, 1, 0, 1]))
        assert feature.stats.calls == 2
        assert feature.stats.rows_requested == 7
        assert feature.stats.rows_read == 1 + 3
        assert feature.stats.blocks_read == 1 + 2
        assert feature.stats.io_requests == 1 + 2
        # Rows on adjacent pages share a run: row 10 is on pages 0-1.
        feature.stats.reset()
        feature.read(torch.tensor([10, 21]))  # pages 0-1 and 2
        assert (feature.stats.blocks_read, feature.stats.io_requests) == (3, 1)
        feature.read(torch.zeros(0, dtype=torch.int64))
        assert feature.stats.calls == 2
        assert feature.stats.blocks_read == 3
        assert feature.stats.seconds > 0.0
        feature.stats.reset()
        assert feature.stats == StorageStats(block_bytes=PAGE_BYTES)


def test_small_runs_mean_more_reads_same_rows(disk_dir):
    rows = make_rows((2000, 100), np.float32)  # 800,000 bytes
    write_feature_file(disk_dir / "feat.bin", rows)
    ids = torch.arange(2000)
    with StorageFeature(disk_dir / "feat.bin", **PAGES) as big, \
            StorageFeature(disk_dir / "feat.bin", **PAGES,
                           max_run_bytes=4 * PAGE_BYTES) as small:
        assert big.read(ids).numpy().tobytes() == rows.tobytes()
        assert small.read(ids).numpy().tobytes() == rows.tobytes()
        pages = -(-800_000 // PAGE_BYTES)
        assert big.stats.blocks_read == pages
        assert big.stats.io_requests == 1
        # Tasks (two runs each, the default) split between rows: a row
        # straddling a cut costs a page twice.
        cuts = -(-pages // 8)
        assert pages <= small.stats.blocks_read <= pages + cuts
        assert small.stats.io_requests >= pages // 4


# Direct I/O --------------------------------------------------------------

def test_direct_io_on_the_disk(disk_dir, recwarn):
    rows = make_rows((100, 100), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin") as feature:
        assert feature.direct
        check_feature_contract(feature, rows, [99, 0, 50])
    with StorageFeature(disk_dir / "feat.bin", direct=False) as feature:
        assert not feature.direct
        check_feature_contract(feature, rows, [99, 0, 50])
    assert not [w for w in recwarn if w.category is RuntimeWarning]


def _check_fallback(path: Path, rows: np.ndarray) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        feature = StorageFeature(path)
    with feature:
        assert not feature.direct
        check_feature_contract(feature, rows, [3, 0, len(rows) - 1, 3])
        check_feature_contract(feature, rows, np.arange(len(rows)))
    refusals = [w for w in caught if w.category is RuntimeWarning]
    assert len(refusals) == 1
    assert str(path) in str(refusals[0].message)
    assert "O_DIRECT" in str(refusals[0].message)


@pytest.mark.skipif(
    not DEV_SHM.is_dir() or accepts_o_direct(DEV_SHM),
    reason="no /dev/shm, or its tmpfs accepts O_DIRECT (Linux >= 6.6)",
)
def test_fallback_on_a_filesystem_refusing_o_direct():
    folder = Path(tempfile.mkdtemp(dir=DEV_SHM))
    try:
        rows = make_rows((300, 7), np.float32)
        write_feature_file(folder / "feat.bin", rows)
        _check_fallback(folder / "feat.bin", rows)
    finally:
        shutil.rmtree(folder)


def test_fallback_when_open_refuses_o_direct(disk_dir, monkeypatch):
    rows = make_rows((300, 7), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(storage.os, "open", refusing_open)
    _check_fallback(disk_dir / "feat.bin", rows)


def test_fallback_when_first_read_refuses_o_direct(disk_dir, monkeypatch):
    rows = make_rows((300, 7), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    real_preadv = os.preadv
    calls = []

    def refusing_once(fd, buffers, offset, *args):
        calls.append(offset)
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset, *args)

    monkeypatch.setattr(storage.os, "preadv", refusing_once)
    _check_fallback(disk_dir / "feat.bin", rows)


def test_other_open_errors_are_not_swallowed(disk_dir, monkeypatch):
    write_feature_file(disk_dir / "feat.bin", make_rows((10, 4), np.float32))

    def failing_open(path, flags, *args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(storage.os, "open", failing_open)
    with pytest.raises(PermissionError):
        StorageFeature(disk_dir / "feat.bin")


# Errors ------------------------------------------------------------------

@pytest.fixture
def small(disk_dir):
    rows = make_rows((1000, 10), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin") as feature:
        yield feature


def test_ids_out_of_range(small):
    with pytest.raises(ValueError, match=r"id 1002 out of range.*1000 rows"):
        small.read(torch.tensor([5, 1000, 1002, 3]))
    with pytest.raises(ValueError, match="id -1 out of range"):
        small.read(torch.tensor([-1, 0]))
    assert small.stats.calls == 0


def test_float_ids_are_refused(small):
    with pytest.raises(TypeError, match="float32"):
        small.read(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="list"):
        small.read([1, 2])


@pytest.mark.parametrize("kwargs,message", [
    ({"num_threads": 0}, "num_threads"),
    ({"max_run_bytes": 100}, "max_run_bytes"),
    ({"chunk_bytes": 1 << 19, "max_run_bytes": 1 << 20}, "chunk_bytes"),
    ({"chunk_bytes": 100}, "chunk_bytes"),
], ids=["no-threads", "run-under-a-page", "chunk-under-a-run",
                             "chunk-under-a-page"])
def test_bad_settings(disk_dir, kwargs, message):
    write_feature_file(disk_dir / "feat.bin", make_rows((10, 4), np.float32))
    with pytest.raises(ValueError, match=message):
        StorageFeature(disk_dir / "feat.bin", **kwargs)


def test_truncated_file_is_refused(disk_dir):
    path = disk_dir / "feat.bin"
    write_feature_file(path, make_rows((5000, 10), np.float32))
    with open(path, "r+b") as f:
        f.truncate(DATA_OFFSET + 1000)
    with pytest.raises(FeatureFileError, match="truncated"):
        StorageFeature(path)



ENGINES = ["threads"] + (["uring"] if uring.available() else [])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fail", [False, True], ids=["direct", "failed"])
def test_rows_of_whole_blocks_are_read_straight_into_place(
        disk_dir, monkeypatch, fail, engine):
    """Rows of whole blocks go straight into the batch's aligned buffer
    (and into an aligned target of `read_into`) with no copy, from
    threads or through io_uring rings; gaps read through land in a sink;
    a direct read that fails or comes back short is read again through a
    buffer. Every row exact either way; a target that is not
    block-aligned is read through a buffer."""
    path = disk_dir / "feat.bin"
    rows = make_rows((3000, 384), np.float32)  # 1536 B: three blocks
    write_feature_file(path, rows)
    # The loop that reads straight into place, and where its runs are.
    module, name, first = (storage_reads, "read_direct", 3) \
        if engine == "threads" else (uring, "ring_direct", 10)
    real, calls = getattr(module, name), []

    def spy(*args):
        calls.append(args[first + 1] - args[first])  # runs in the task
        return 0 if fail else real(*args)

    monkeypatch.setattr(module, name, spy)
    ids = torch.from_numpy(np.random.default_rng(0).permutation(3000)[:900])
    with StorageFeature(path, disk=MODEL, max_gap_bytes=4096,
                        max_run_bytes=PAGE_BYTES, chunk_bytes=2 * PAGE_BYTES,
                        num_threads=3, engine=engine) as feature:
        assert feature.engine == engine
        got = feature.read(ids)
        assert got.numpy().tobytes() == rows[ids.numpy()].tobytes()
        assert got.data_ptr() % 512 == 0 and sum(calls) > 0
        # Runs cut every page split rows across runs and reads.
        assert feature.stats.io_requests >= -(-feature.stats.bytes_read
                                               // PAGE_BYTES)
        unique = np.unique(ids.numpy())
        for offset in (0, 4):  # an aligned target, then one that is not
            raw = torch.zeros(len(unique) * 1536 + 4096 + 4, dtype=torch.uint8)
            skip = -raw.data_ptr() % 4096 + offset
            out = raw[skip:skip + len(unique) * 1536].view(len(unique), 1536)
            before = len(calls)
            feature.read_into(unique, (out.numpy(),),
                              np.zeros(len(unique), np.int64),
                              np.arange(len(unique))[::-1].copy())
            assert out.numpy()[::-1].tobytes() == rows[unique].tobytes()
            assert (len(calls) > before) == (offset == 0)


def test_a_run_failing_once_is_read_again(disk_dir, monkeypatch):
    """A run a thread's compiled loop reports failed (a transient error) is
    read again in Python, the rest of its piece after it, and the loop goes
    on with the next piece: every row exact, every piece read once."""
    path = disk_dir / "feat.bin"
    rows = make_rows((5000, 10), np.float32)  # 200,000 bytes, 49 pages
    write_feature_file(path, rows)
    real, failures = storage_reads.read_pieces, []

    def fail_each_piece_once(*args):
        piece_runs, first = args[7], args[14]
        if first not in failures:  # its second run "fails", once
            failures.append(first)
            if piece_runs[first + 1] - piece_runs[first] > 1:
                counts = args[16]
                runs = slice(piece_runs[first], piece_runs[first] + 1)
                real_read = storage_reads.read_runs(
                    args[0], args[2], args[3][runs], args[4][runs],
                    args[5][runs], args[6], counts)
                assert real_read == -1
                return piece_runs[first] + 1
        return real(*args)

    monkeypatch.setattr(storage_reads, "read_pieces", fail_each_piece_once)
    with StorageFeature(path, num_threads=1, disk=MODEL, engine="threads",
                        block_bytes=PAGE_BYTES, max_gap_bytes=0,
                        max_run_bytes=PAGE_BYTES,
                        chunk_bytes=4 * PAGE_BYTES) as feature:
        ids = torch.arange(0, 5000, 2)
        assert feature.read(ids).numpy().tobytes() == rows[ids].tobytes()
        assert len(failures) > 5  # pieces of four runs, each failed once
        pages = -(-200_000 // PAGE_BYTES)
        assert pages <= feature.stats.blocks_read <= pages + len(failures)
        assert feature.stats.io_requests == feature.stats.blocks_read

@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_file_cut_short_after_opening(disk_dir, direct):
    path = disk_dir / "feat.bin"
    rows = make_rows((5000, 10), np.float32)  # 200,000 bytes, 49 pages
    write_feature_file(path, rows)
    with StorageFeature(path, direct=direct) as feature:
        with open(path, "r+b") as f:
            f.truncate(DATA_OFFSET + 100_000 + 123)  # mid-page
        check_feature_contract(feature, rows, [0, 10])
        with pytest.raises(ValueError, match=re.escape(f"{path} is truncated")):
            feature.read(torch.tensor([0, 4999]))
        with pytest.raises(ValueError, match="truncated"):
            feature.read(torch.arange(5000))


def test_read_after_close(small):
    small.close()
    small.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        small.read(torch.tensor([0]))


# Threads -----------------------------------------------------------------

def test_thread_counts_agree_and_threads_end(disk_dir):
    rows = make_rows((4000, 100), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 4000, 3000))
    before = threading.active_count()
    results = []
    for num_threads in (1, 8):
        feature = StorageFeature(disk_dir / "feat.bin",
                                 num_threads=num_threads)
        results.append(feature.read(ids))
        assert threading.active_count() <= before + num_threads
        feature.close()
        assert threading.active_count() == before
    assert torch.equal(results[0], results[1])
    assert results[0].numpy().tobytes() == rows[ids.numpy()].tobytes()


def test_concurrent_callers(disk_dir):
    rows = make_rows((3000, 7), np.float32)
    write_feature_file(disk_dir / "feat.bin", rows)
    rng = np.random.default_rng(3)
    id_sets = [rng.integers(0, 3000, 500) for _ in range(6)]
    errors = []
    with StorageFeature(disk_dir / "feat.bin") as feature:

        def work(ids):
            try:
                check_feature_contract(feature, rows, ids)
            except BaseException as err:  # reported below
                errors.append(err)

        callers = [threading.Thread(target=work, args=(ids,))
                   for ids in id_sets]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert not errors
        assert feature.stats.calls == 6
        assert feature.stats.rows_requested == 3000
        assert feature.stats.rows_read == sum(
            len(np.unique(ids)) for ids in id_sets)


def test_repr_and_warnings_free_close(disk_dir):
    write_feature_file(disk_dir / "feat.bin", make_rows((10, 4), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        feature = StorageFeature(disk_dir / "feat.bin")
        assert "feat.bin" in repr(feature) and "direct=True" in repr(feature)
        del feature  # __del__ closes quietly


@pytest.mark.parametrize("gap_pages", [0, 1, 4])
def test_short_gaps_are_read_through(disk_dir, gap_pages):
    """Rows a few pages apart share one read; the gap pages count."""
    rows = make_rows((1024, 1024), np.float32)  # one row per page
    path = disk_dir / "feat.bin"
    write_feature_file(path, rows)
    ids = np.arange(0, 1024, 3)  # two unwanted pages between wanted ones
    # Runs of up to 4 MiB: the default is the measured disk's fastest
    # sequential request (256 KiB to 4 MiB), which cut the 4 MB run into
    # 16 requests on one run (the flake this test had).
    with StorageFeature(path, max_gap_bytes=gap_pages * 4096,
                        block_bytes=PAGE_BYTES, num_threads=1,
                        max_run_bytes=4 << 20) as feature:
        check_feature_contract(feature, rows, ids)
        if gap_pages >= 2:  # long runs through the gaps
            assert len(ids) < feature.stats.blocks_read <= ids[-1] + 1
            assert feature.stats.io_requests < 10
        else:
            assert feature.stats.blocks_read == len(ids)
            assert feature.stats.io_requests == len(ids)


# Blocks, amplification and the disk model -------------------------------

def test_sector_reads_cost_the_rows_bytes_only(disk_dir):
    """512 B rows on 512 B blocks, no gaps: amplification 1, not 8."""
    rows = make_rows((4096, 128), np.float32)  # 512 B a row
    write_feature_file(disk_dir / "feat.bin", rows)
    ids = np.arange(0, 4096, 37)
    with StorageFeature(disk_dir / "feat.bin", disk=MODEL,
                        max_gap_bytes=0) as sectors, \
            StorageFeature(disk_dir / "feat.bin", disk=MODEL,
                           block_bytes=PAGE_BYTES, max_gap_bytes=0) as pages:
        check_feature_contract(sectors, rows, ids)
        assert sectors.block_bytes == 512
        assert sectors.stats.blocks_read == len(ids)
        assert sectors.stats.io_requests == len(ids)
        assert sectors.stats.amplification == 1.0
        pages.read(torch.from_numpy(ids))
        assert pages.stats.bytes_read == len(ids) * PAGE_BYTES  # 37 apart
        assert pages.stats.amplification == 8.0


def test_model_prices_gaps(disk_dir):
    """The default gap is the model's break-even: bandwidth / iops bytes."""
    rows = make_rows((1024, 1024), np.float32)  # one row per page
    write_feature_file(disk_dir / "feat.bin", rows)
    slow_requests = DiskModel(512, iops=100.0, bandwidth=1e6, queue_depth=4)
    fast_requests = DiskModel(512, iops=1e6, bandwidth=1e6, queue_depth=4)
    assert slow_requests.gap_bytes == 10_000
    assert slow_requests.seconds(3, 2_000_000) == pytest.approx(2.03)
    ids = torch.arange(0, 1024, 3)  # 8 KiB gaps
    # `a` in one run and one piece (pieces are cut between rows, and a cut
    # skips the gap there): the span stays whole.
    whole = {"max_run_bytes": 8 << 20, "chunk_bytes": 8 << 20}
    with StorageFeature(disk_dir / "feat.bin", disk=slow_requests,
                        **whole) as a, \
            StorageFeature(disk_dir / "feat.bin", disk=fast_requests) as b:
        assert a.read(ids).numpy().tobytes() == rows[ids].tobytes()
        assert b.read(ids).numpy().tobytes() == rows[ids].tobytes()
        assert a.stats.io_requests == 1  # gaps read through
        assert a.stats.amplification == pytest.approx(
            (int(ids[-1]) + 1) / len(ids), rel=1e-3)
        assert b.stats.io_requests == len(ids)  # gaps skipped
        assert b.stats.amplification == 1.0
        assert a.stats.model_seconds == pytest.approx(
            1 / 100 + a.stats.bytes_read / 1e6)


def test_read_along_returns_candidates_on_blocks_read(disk_dir):
    rows = make_rows((2000, 100), np.float32)  # 400 B rows
    write_feature_file(disk_dir / "feat.bin", rows)
    with StorageFeature(disk_dir / "feat.bin", **PAGES) as feature:
        # 11 shares row 10's page, 30 is in a gap read through (rows 10
        # and 60 are 20 KB apart), 1900 is far from everything.
        ids = torch.tensor([60, 10, 10])
        candidates = torch.tensor([11, 30, 1900])
        got, taken, taken_rows = feature.read_along(ids, candidates)
        assert got.numpy().tobytes() == rows[[60, 10, 10]].tobytes()
        assert taken.tolist() == [11, 30]
        assert taken_rows.numpy().tobytes() == rows[[11, 30]].tobytes()
        assert feature.stats.io_requests == 1
        assert feature.stats.rows_read == 4
        # Room for one: the lower rank wins.
        _, taken, taken_rows = feature.read_along(
            ids, candidates, limit=1, rank=torch.tensor([5, 1, 0]))
        assert taken.tolist() == [30]
        assert taken_rows.numpy().tobytes() == rows[[30]].tobytes()
        got, taken, _ = feature.read_along(ids, torch.tensor([1900]))
        assert taken.numel() == 0
        assert got.numpy().tobytes() == rows[[60, 10, 10]].tobytes()


def test_disk_model_is_measured_once_and_cached_beside_the_file(
        disk_dir, monkeypatch):
    write_feature_file(disk_dir / "feat.bin", make_rows((5000, 100),
                                                        np.float32))
    path = disk_dir / "feat.bin"
    model = measure_disk(path, queue_depth=2, seconds=0.2)
    assert 4096 % model.block_bytes == 0 and model.block_bytes >= 512
    assert model.iops > 0 and model.bandwidth > 0
    assert model.device == path.stat().st_dev
    monkeypatch.setattr(disk, "_memo", {})
    first = disk_model(path, queue_depth=3, seconds=0.2)
    cache = disk_dir / "feat.bin.disk.json"
    record = json.loads(cache.read_text())
    entry = record["models"]["3"]
    assert entry["iops"] == first.iops and entry["queue_depth"] == 3
    # A fresh process reads the cache instead of measuring again...
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", _refuse)
    assert disk_model(path, queue_depth=3) == first
    # ...unless it was measured on another device.
    cache.write_text(json.dumps(dict(record, device=record["device"] + 1)))
    monkeypatch.setattr(disk, "_memo", {})
    with pytest.raises(AssertionError, match="measured again"):
        disk_model(path, queue_depth=3)


def _refuse(*args, **kwargs):
    raise AssertionError("measured again")


def cached_models(model: DiskModel, entry: str, **values) -> dict:
    """A ``<file>.disk.json`` record holding ``model`` (with ``values``
    written over its fields) under ``entry``."""
    return {"version": disk._MODEL_VERSION, "device": model.device,
            "models": {entry: dict(model.as_dict(), **values)}}


def test_disk_model_chooses_the_depth_where_reads_stop_growing(disk_dir):
    assert choose_depth({1: 10.0, 4: 30.0, 16: 95.0, 64: 100.0}) == 16
    assert choose_depth({1: 10.0, 2: 9.0}) == 1
    path = disk_dir / "feat.bin"
    write_feature_file(path, make_rows((5000, 100), np.float32))
    model = measure_disk(path, seconds=0.4)
    depths = [depth for depth, _ in model.sweep]
    assert depths == list(DEPTHS)
    assert model.queue_depth == choose_depth(dict(model.sweep))
    assert model.iops == dict(model.sweep)[model.queue_depth]
    # Sequential reads at every depth, of every size: each depth's
    # fastest size kept, the fastest of all is the model's.
    assert [depth for depth, _, _ in model.run_sweep] == list(DEPTHS)
    assert all(size in RUN_SIZES for _, size, _ in model.run_sweep)
    best = max(model.run_sweep, key=lambda cell: cell[2])
    assert model.run_bytes == best[1]
    # A byte read through priced at every depth, by random reads: the
    # chosen depth's is the model's bandwidth, and the break-even gap's.
    assert [depth for depth, _ in model.through_sweep] == list(DEPTHS)
    through = dict(model.through_sweep)
    assert model.bandwidth == through[model.queue_depth] > 0
    assert all(rate <= sequential for (_, rate), (_, _, sequential) in
               zip(model.through_sweep, model.run_sweep, strict=True))
    assert model.gap_bytes == int(model.bandwidth / model.iops)
    assert "read through" in model.describe()
    assert "read-through GB/s per depth" in model.describe_sweep()
    # The storage tier keeps that many requests in flight by default, in
    # runs of that size, two to a piece.
    with StorageFeature(path, disk=model) as feature:
        assert feature.num_threads == model.queue_depth
        assert feature._max_run_blocks * feature.block_bytes \
            == model.run_bytes
        assert feature._chunk_blocks == 2 * feature._max_run_blocks
        ids = torch.tensor([4999, 0, 2500, 17])
        assert feature.read(ids).numpy().tobytes() == make_rows(
            (5000, 100), np.float32)[ids.numpy()].tobytes()


def test_each_read_goes_at_the_depth_that_serves_it_soonest():
    model = DiskModel(512, 400_000.0, 2e9, 64, sweep=(
        (4, 100_000.0), (16, 300_000.0), (64, 400_000.0)), run_sweep=(
        (4, 1 << 20, 1.5e9), (16, 1 << 18, 2e9), (64, 1 << 18, 1.6e9)))
    assert model.depth_for(10_000, 4096 * 10_000) == 64  # small reads
    assert model.depth_for(100, 80 << 20) == 16  # bytes dominate
    assert model.depth_for(0, 0) == 4  # the shallowest of equals
    assert model.seconds(100, 80 << 20) == pytest.approx(
        100 / 300_000 + (80 << 20) / 2e9)
    # No deeper than the model's depth; one depth measured: that one.
    assert dataclasses.replace(model, queue_depth=4).depth_for(
        10_000, 0) == 4
    alone = DiskModel(512, 1000.0, 1e9, 8)
    assert alone.depth_for(1, 1 << 30) == 8
    assert alone.seconds(10, 1e9) == pytest.approx(1.01)


def test_a_byte_read_through_is_priced_by_random_reads_not_sequential():
    # 4 KiB random reads in 12.5 us, 256 KiB ones in 170 us: a byte more
    # costs (170 - 12.5) us / 252 KiB, 1.64 GB/s, not the 2.1 GB/s of a
    # sequential stream.
    rate = through_rate(80_000.0, 1e6 / 170, 256 << 10, 2.1e9)
    assert rate == pytest.approx((256 - 4) * 1024 / 157.5e-6)
    # Never above the same depth's sequential rate (long runs pay that).
    assert through_rate(80_000.0, 1e6 / 170, 256 << 10, 1.2e9) == 1.2e9
    # Large reads no slower than small ones: nothing to tell, sequential.
    assert through_rate(1000.0, 1000.0, 256 << 10, 2.1e9) == 2.1e9
    assert through_rate(1000.0, 10.0, 4096, 2.1e9) == 2.1e9
    # Per depth, the rate read through replaces the sequential one.
    model = DiskModel(512, 400_000.0, 1e9, 64, sweep=(
        (4, 100_000.0), (64, 400_000.0)), run_sweep=(
        (4, 1 << 20, 3e9), (64, 1 << 18, 3e9)), through_sweep=(
        (4, 0.5e9), (64, 1e9)))
    assert model.seconds(100, 80 << 20) == pytest.approx(
        100 / 400_000 + (80 << 20) / 1e9)
    assert model.depth_for(0, 1) == 64
    assert model.gap_bytes == 2500
    assert model.describe().startswith(
        "400,000 random 4 KiB reads/s at queue depth 64, 1.00 GB/s read "
        "through, 3.00 GB/s sequential at depth 4")


def test_disk_model_rejects_bad_values():
    with pytest.raises(ValueError, match="block_bytes must divide 4096"):
        DiskModel(3000, 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="must be positive"):
        DiskModel(512, 0.0, 1.0, 1)
    with pytest.raises(ValueError, match="run_bytes must be a positive "
                       "multiple of 4096 .bytes per request., got 1000"):
        DiskModel(512, 1.0, 1.0, 1, run_bytes=1000)


#: Values a hand-edited or damaged ``<file>.disk.json`` may hold, and the
#: key and valid range the warning names.
BAD_DISK_VALUES = {
    "nan-iops": ("iops", float("nan"), r"iops must be positive and finite"),
    "infinite-bandwidth": ("bandwidth", float("inf"),
                           r"bandwidth must be positive and finite"),
    "block-of-8": ("block_bytes", 8, r"block_bytes must divide 4096 and be "
                   r"an integer of at least 512 \(512, 1024, 2048, 4096\)"),
    "block-of-512.0": ("block_bytes", 512.0, r"block_bytes .* got 512\.0"),
    "iops-text": ("iops", "fast", r"iops .* got 'fast'"),
    "run-of-1000": ("run_bytes", 1000, r"run_bytes must be a positive "
                    r"multiple of 4096 \(bytes per request\), got 1000"),
    "zero-bandwidth-at-a-depth": (
        "run_sweep", [[3, 1 << 20, 0.0]],
        r"run_sweep rates must be positive and finite \(per second\), "
        r"got 0\.0"),
    "negative-read-through": (
        "through_sweep", [[3, -1.0]],
        r"through_sweep rates must be positive and finite \(per second\), "
        r"got -1\.0"),
}


@pytest.mark.parametrize("key,value,match", BAD_DISK_VALUES.values(),
                         ids=BAD_DISK_VALUES.keys())
def test_bad_cached_disk_model_is_measured_again_and_rewritten(
        tmp_path, monkeypatch, caplog, key, value, match):
    path = tmp_path / "feat.bin"
    write_feature_file(path, make_rows((100, 8), np.float32))
    cache = tmp_path / "feat.bin.disk.json"
    device = path.stat().st_dev
    fresh = DiskModel(1024, 20_000.0, 1e9, 3, device)
    cache.write_text(json.dumps(cached_models(fresh, "3", **{key: value})))
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", lambda *args: fresh)
    with caplog.at_level("WARNING", logger="hmgraph.cache.disk"):
        assert disk_model(path, queue_depth=3) == fresh
    warning = caplog.records[0].getMessage()
    assert re.search(match, warning), warning
    assert warning.startswith(f"{cache}: ")
    assert warning.endswith("; measuring the disk again")
    # Rewritten: the next process reads the new values without measuring.
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", _refuse)
    assert disk_model(path, queue_depth=3) == fresh


def test_unreadable_cached_disk_model_is_measured_again(tmp_path,
                                                        monkeypatch, caplog):
    path = tmp_path / "feat.bin"
    write_feature_file(path, make_rows((100, 8), np.float32))
    cache = tmp_path / "feat.bin.disk.json"
    cache.write_text('{"iops": ')
    fresh = DiskModel(512, 20_000.0, 1e9, 3, path.stat().st_dev)
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", lambda *args: fresh)
    with caplog.at_level("WARNING", logger="hmgraph.cache.disk"):
        assert disk_model(path, queue_depth=3) == fresh
    assert caplog.records[0].getMessage().startswith(
        f"{cache} is unreadable (")


def test_disk_model_drifting_from_the_reads_is_measured_again(
        disk_dir, monkeypatch, caplog):
    path = disk_dir / "feat.bin"
    rows = make_rows((4000, 100), np.float32)
    write_feature_file(path, rows)
    device = path.stat().st_dev
    # A cached model that prices a read at nothing: the epoch's reads take
    # far more than 1.5x what it says.
    wrong = DiskModel(512, 1e12, 1e15, 2, device)
    (disk_dir / "feat.bin.disk.json").write_text(
        json.dumps(cached_models(wrong, "2")))
    right = DiskModel(512, 20_000.0, 1e9, 2, device)
    calls = []
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk",
                        lambda *args: calls.append(args) or right)
    with StorageFeature(path, num_threads=2) as feature:
        assert feature.disk == wrong
        feature.drift_min_seconds = 0.0
        feature.busy_load = math.inf  # quiet, whatever else runs here
        ids = torch.arange(0, 4000, 7)
        assert feature.read(ids).numpy().tobytes() == \
            rows[ids.numpy()].tobytes()
        with caplog.at_level("WARNING", logger="hmgraph.cache.storage"):
            feature.release_buffers()  # an epoch's end
        assert len(calls) == 1 and feature.disk == right
        assert feature.max_gap_bytes == right.gap_bytes
        assert "measuring the disk again" in caplog.text
        # Rewritten beside the file; and measured once per feature.
        cached = json.loads((disk_dir / "feat.bin.disk.json").read_text())
        assert cached["models"]["2"]["iops"] == right.iops
        feature.read(ids)
        feature.release_buffers()
        assert len(calls) == 1
        assert feature._epoch_mark[1] > 0
        assert feature.read(ids).numpy().tobytes() == \
            rows[ids.numpy()].tobytes()


def test_a_disk_measured_again_on_a_busy_machine_is_not_kept(
        disk_dir, monkeypatch, caplog):
    """Slow reads while the CPUs are busy say as much of the CPUs as of
    the disk: the tier prices the rest of the run with the new model, and
    the file beside the feature keeps the model later runs start from."""
    path = disk_dir / "feat.bin"
    rows = make_rows((4000, 100), np.float32)
    write_feature_file(path, rows)
    device = path.stat().st_dev
    quiet = DiskModel(512, 1e12, 1e15, 2, device)
    cache = disk_dir / "feat.bin.disk.json"
    cache.write_text(json.dumps(cached_models(quiet, "2")))
    before = cache.read_text()
    busy = DiskModel(512, 20_000.0, 1e9, 2, device)
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", lambda *args: busy)
    with StorageFeature(path, num_threads=2) as feature:
        feature.drift_min_seconds = 0.0
        feature.busy_load = 0.0  # any load is over it
        ids = torch.arange(0, 4000, 7)
        feature.read(ids)
        with caplog.at_level("WARNING", logger="hmgraph.cache.storage"):
            feature.release_buffers()
        assert feature.disk == busy
        assert feature.max_gap_bytes == busy.gap_bytes
        assert "for this run only (load " in caplog.text
        assert feature.read(ids).numpy().tobytes() == \
            rows[ids.numpy()].tobytes()
    assert cache.read_text() == before
    assert disk_model(path, queue_depth=2) == busy  # this process's
    monkeypatch.setattr(disk, "_memo", {})
    monkeypatch.setattr(disk, "measure_disk", _refuse)
    assert disk_model(path, queue_depth=2) == quiet  # a later run's


@pytest.mark.parametrize("depth", [1, 3, 64, 128])
@pytest.mark.parametrize("chunk", [None, PAGE_BYTES], ids=["default-chunk",
                                                           "page-chunks"])
def test_rows_are_bit_exact_at_every_queue_depth(disk_dir, depth, chunk):
    """However many requests are in flight (one compiled ``pread`` loop
    per thread) and however finely a read is cut into tasks, every row is
    the file's: unique ids straight to their places, repeated ids, and
    rows brought along."""
    rows = make_rows((6000, 37), np.float32)  # rows straddle blocks
    path = disk_dir / "feat.bin"
    write_feature_file(path, rows)
    model = DiskModel(512, 50_000.0, 1e9, depth, path.stat().st_dev)
    rng = np.random.default_rng(depth)
    with StorageFeature(path, num_threads=depth, disk=model,
                        chunk_bytes=chunk) as feature:
        assert feature.num_threads == depth
        unique = torch.from_numpy(rng.permutation(6000)[:2500])
        repeated = torch.from_numpy(rng.integers(0, 6000, 4000))
        for ids in (unique, repeated, torch.tensor([5999, 0, 5999])):
            assert feature.read(ids).numpy().tobytes() == \
                rows[ids.numpy()].tobytes()
        candidates = torch.arange(1, 6000, 2)
        got, taken, brought = feature.read_along(
            torch.arange(0, 6000, 10), candidates)
        assert got.numpy().tobytes() == rows[0:6000:10].tobytes()
        assert brought.numpy().tobytes() == rows[taken.numpy()].tobytes()
        assert feature.stats.io_requests >= 1


def test_disk_model_in_step_with_the_reads_is_kept_across_a_reset(
        disk_dir, monkeypatch):
    """A model that priced exactly what the reads took is kept; counters
    reset between epochs (a loader's ``stats.reset()``) start the next
    epoch's window afresh: no negative seconds, no false drift."""
    path = disk_dir / "feat.bin"
    write_feature_file(path, make_rows((4000, 100), np.float32))
    monkeypatch.setattr(disk, "_memo", {})
    with StorageFeature(path, num_threads=2) as feature:
        feature.drift_min_seconds = 0.0
        # The model priced exactly what the reads took.
        feature.read(torch.arange(0, 4000, 3))
        feature.stats.model_seconds = feature.stats.seconds
        monkeypatch.setattr(disk, "measure_disk", _refuse)
        feature.release_buffers()
        feature.stats.reset()
        feature.read(torch.arange(0, 400, 3))
        feature.stats.model_seconds = feature.stats.seconds
        feature.release_buffers()  # in step: no measurement
        assert feature._epoch_mark == (feature.stats.seconds,
                                       feature.stats.model_seconds)

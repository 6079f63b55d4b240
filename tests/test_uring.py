"""Reads through io_uring rings (`hmgraph.cache.uring`) and the storage
tier's engines: the same rows and counters as its threads, every depth."""

from __future__ import annotations

import mmap
import os
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_storage import MODEL, make_rows

from hmgraph.cache import storage_reads, uring
from hmgraph.cache.disk import DiskModel
from hmgraph.cache.diskio import IOV_MAX, address
from hmgraph.cache.format import write_feature_file
from hmgraph.cache.storage import StorageFeature

pytestmark = pytest.mark.skipif(not uring.available(),
                                reason="this kernel refuses io_uring")


def _file(folder, rows):
    path = folder / "feat.bin"
    write_feature_file(path, rows)
    return path


def test_a_ring_reads_every_run_at_every_depth(disk_dir):
    """`ring_direct` straight: runs of rows and gaps, targets in any
    order, one to more reads in flight than the ring has runs."""
    rows = make_rows((2048, 128), np.float32)  # 512 B: one block a row
    path = _file(disk_dir, rows)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        offset = os.path.getsize(path) - rows.nbytes
        ids = np.arange(0, 2048, 3)
        # Runs of 8 rows (wanted ones and the gaps between), in order.
        runs = np.arange(0, 2048, 8)
        out = mmap.mmap(-1, len(ids) * 512)
        view, base = address(out)
        sink_map = mmap.mmap(-1, 4096)
        _, sink = address(sink_map)
        where = np.random.default_rng(0).permutation(len(ids))
        ring = uring.Ring(8)
        for depth in (1, 2, 8):
            view[:] = 0
            counts = np.zeros(2, dtype=np.int64)
            failed = uring.ring_direct(
                ring.sq, ring.cq, ring.sqes, ring.layout, ring.iov,
                ring.slots, depth, fd, offset + runs * 512,
                np.full(len(runs), 8 * 512), 0, len(runs),
                offset + ids * 512, 0, len(ids), 512,
                np.array([base], np.int64), np.zeros(len(ids), np.int64),
                where, sink, 4096, counts)
            assert failed == -1
            got = view.reshape(len(ids), 512)[where]
            assert got.tobytes() == rows[ids].tobytes()
            assert counts.tolist() == [2048 * 512, len(runs)]
        ring.close()
        ring.close()  # idempotent
    finally:
        os.close(fd)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_engines_read_the_same_rows_and_count_the_same(disk_dir, data):
    """The storage tier through rings and through threads: identical
    rows, requests and bytes, whatever the ids, gap, run size and depth;
    rows of whole blocks read straight into place, others (400 B)
    through piece buffers."""
    width = data.draw(st.sampled_from([256, 100]))  # 1 KiB, 400 B
    rows = make_rows((3000, width), np.float32)
    path = disk_dir / f"engines-{width}.bin"
    if not path.exists():
        write_feature_file(path, rows)
    ids = torch.tensor(data.draw(st.lists(
        st.integers(0, 2999), min_size=1, max_size=600)))
    sizes = {"max_gap_bytes": data.draw(st.sampled_from([0, 512, 8192])),
             "max_run_bytes": data.draw(st.sampled_from([4096, 1 << 20])),
             "chunk_bytes": data.draw(st.sampled_from([None, 1 << 21])),
             "num_threads": data.draw(st.integers(1, 9))}
    stats = {}
    for engine in ("threads", "uring"):
        with StorageFeature(path, disk=MODEL, engine=engine,
                            **sizes) as feature:
            assert feature.engine == engine
            assert feature.read(ids).numpy().tobytes() == \
                rows[ids.numpy()].tobytes()
            s = feature.stats
            stats[engine] = (s.io_requests, s.bytes_read, s.blocks_read)
    assert stats["uring"] == stats["threads"]


def test_a_run_of_more_rows_than_iovecs_takes_several_reads(disk_dir):
    """Every row of a 1 MiB run is its own iovec: a run of more than
    `IOV_MAX` rows is read in several reads, each exact."""
    rows = make_rows((3000, 128), np.float32)
    path = _file(disk_dir, rows)
    ids = torch.arange(0, 3000, 2)  # gaps of one block between rows
    with StorageFeature(path, disk=MODEL, max_gap_bytes=512,
                        max_run_bytes=1 << 20, engine="uring") as feature:
        assert feature.read(ids).numpy().tobytes() == \
            rows[ids.numpy()].tobytes()
        pieces = 2 * len(ids) - 1
        assert feature.stats.io_requests >= -(-pieces // IOV_MAX) > 1


@pytest.mark.parametrize("width", [128, 100], ids=["direct", "pieces"])
def test_a_file_cut_short_is_read_again_and_refused(disk_dir, monkeypatch,
                                                    width):
    """A ring's read that comes back short leaves no row half-read: the
    task is read again through a buffer, which names the file cut."""
    rows = make_rows((4000, width), np.float32)
    path = _file(disk_dir, rows)
    name = "ring_direct" if width == 128 else "ring_pieces"
    calls, real = [], getattr(uring, name)

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(uring, name, spy)
    with StorageFeature(path, disk=MODEL, engine="uring") as feature:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 100 * width * 4)
        check = torch.arange(0, 3000, 7)
        assert feature.read(check).numpy().tobytes() == \
            rows[check.numpy()].tobytes()
        assert calls and set(calls) == {-1}
        with pytest.raises(ValueError,
                           match=re.escape(f"{path} is truncated")):
            feature.read(torch.tensor([0, 3999]))
        assert max(calls) >= 0  # the short read was reported


def test_pieces_through_the_ring_at_every_depth(disk_dir, monkeypatch):
    """Rows not of whole blocks: runs read into piece buffers, each
    piece's rows copied out once its runs land, one to many runs in
    flight; every row exact, the same requests as the threads."""
    rows = make_rows((5000, 100), np.float32)  # 400 B
    path = _file(disk_dir, rows)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 5000, 2000))
    deep = DiskModel(block_bytes=512, iops=100_000.0, bandwidth=500e6,
                     queue_depth=64)
    sizes = {"disk": deep, "max_gap_bytes": 0, "max_run_bytes": 4096,
             "chunk_bytes": 8192}
    with StorageFeature(path, engine="threads", **sizes) as threads:
        threads.read(ids)
        requests = threads.stats.io_requests
    depths = []
    real = uring.ring_pieces

    def spy(*args):
        depths.append(args[5])
        return real(*args)

    monkeypatch.setattr(uring, "ring_pieces", spy)
    for num_threads in (1, 3, 64):
        with StorageFeature(path, engine="uring", num_threads=num_threads,
                            **sizes) as feature:
            assert feature.read(ids).numpy().tobytes() == \
                rows[ids.numpy()].tobytes()
            assert feature.stats.io_requests == requests
    assert min(depths) == 1 and max(depths) >= 16


def test_engine_choice_and_refusals(disk_dir, monkeypatch):
    rows = make_rows((100, 128), np.float32)
    path = _file(disk_dir, rows)
    with pytest.raises(ValueError, match="unknown storage engine 'aio'; "
                       "available: auto, threads, uring"):
        StorageFeature(path, disk=MODEL, engine="aio")
    with StorageFeature(path, disk=MODEL) as auto, \
            StorageFeature(path, disk=MODEL, engine="threads") as threads, \
            StorageFeature(path, disk=MODEL, direct=False) as buffered:
        assert auto.engine == "uring" and threads.engine == "threads"
        assert buffered.engine == "threads"  # rings read direct only
    # A kernel (or seccomp policy) without io_uring: auto keeps the
    # threads, "uring" says why it cannot.

    def refuse(entries):
        raise OSError(1, "io_uring_setup(2): Operation not permitted")

    monkeypatch.setattr(uring, "available", lambda: False)
    monkeypatch.setattr(uring, "Ring", refuse)
    with StorageFeature(path, disk=MODEL) as feature:
        assert feature.engine == "threads"
        assert feature.read(torch.tensor([5, 1])).numpy().tobytes() == \
            rows[[5, 1]].tobytes()
    with pytest.raises(OSError, match="Operation not permitted"):
        StorageFeature(path, disk=MODEL, engine="uring")
    assert storage_reads.ENGINES == ("auto", "threads", "uring")

"""The feature file: round trip, alignment, and refusal of bad files."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from hmgraph.cache.format import (
    DATA_OFFSET,
    PAGE_BYTES,
    FeatureFileError,
    atomic_path,
    open_feature_file,
    read_manifest,
    verify_feature_file,
    write_feature_file,
)

SHAPES = {
    "rows-of-7": ((1000, 7), np.float32),
    "one-row": ((1, 100), np.float32),
    "3d-float16": ((33, 4, 5), np.float16),
    "int64": ((17, 3), np.int64),
    "empty": ((0, 8), np.float32),
}


@pytest.mark.parametrize("shape,dtype", SHAPES.values(), ids=SHAPES.keys())
def test_round_trip(tmp_path, shape, dtype):
    rows = (np.random.default_rng(0).standard_normal(shape) * 100).astype(
        dtype)
    path = tmp_path / "feat.bin"
    manifest = write_feature_file(path, rows)
    assert manifest.shape == shape
    assert manifest.data_offset % PAGE_BYTES == 0
    assert os.path.getsize(path) % PAGE_BYTES == 0
    assert os.path.getsize(path) == manifest.file_bytes
    back_manifest, back = open_feature_file(path, verify=True)
    assert back_manifest == manifest
    assert back.dtype == dtype
    np.testing.assert_array_equal(back, rows)
    # The rows sit at DATA_OFFSET, raw and row-major.
    raw = np.fromfile(path, dtype=dtype, offset=DATA_OFFSET,
                      count=rows.size).reshape(shape)
    np.testing.assert_array_equal(raw, rows)


def test_truncated_file_is_refused(tmp_path):
    path = tmp_path / "feat.bin"
    write_feature_file(path, np.ones((5000, 10), np.float32))
    with open(path, "r+b") as f:
        f.truncate(DATA_OFFSET + 1000)
    with pytest.raises(FeatureFileError, match="truncated: 5096 bytes"):
        read_manifest(path)


def test_checksum_mismatch_is_refused(tmp_path):
    path = tmp_path / "feat.bin"
    write_feature_file(path, np.arange(400, dtype=np.float32).reshape(40, 10))
    read_manifest(path)
    with open(path, "r+b") as f:  # flip one byte of one row
        f.seek(DATA_OFFSET + 123)
        byte = f.read(1)
        f.seek(DATA_OFFSET + 123)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(FeatureFileError, match="fails its checksum"):
        verify_feature_file(path)


def test_edited_manifest_checksum_is_refused(tmp_path):
    path = tmp_path / "feat.bin"
    write_feature_file(path, np.ones((10, 3), np.float32))
    with open(path, "r+b") as f:
        f.seek(8)
        (length,) = struct.unpack("<I", f.read(4))
        record = json.loads(f.read(length))
        record["checksum"] = "crc32:00000000"
        header = json.dumps(record).encode()
        f.seek(8)
        f.write(struct.pack("<I", len(header)) + header)
    with pytest.raises(FeatureFileError, match="manifest says crc32:0000"):
        open_feature_file(path, verify=True)


def test_not_a_feature_file(tmp_path):
    path = tmp_path / "feat.bin"
    path.write_bytes(b"hello world" * 100)
    with pytest.raises(FeatureFileError, match="bad magic"):
        read_manifest(path)
    with pytest.raises(FeatureFileError, match="does not exist"):
        read_manifest(tmp_path / "missing.bin")


@pytest.mark.parametrize("rows,match", [
    (np.ones(10, np.float32), "at least 2-D"),
    (np.ones((2, 2), np.complex64), "unsupported feature dtype complex64"),
], ids=["1d", "complex"])
def test_bad_rows_are_refused(tmp_path, rows, match):
    with pytest.raises(FeatureFileError, match=match):
        write_feature_file(tmp_path / "feat.bin", rows)


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "feat.bin"
    write_feature_file(path, np.zeros((4, 4), np.float32))

    class Boom(Exception):
        pass

    with pytest.raises(Boom), atomic_path(path) as tmp:
        tmp.write_bytes(b"half a file")
        raise Boom
    assert [p.name for p in tmp_path.iterdir()] == ["feat.bin"]
    _, rows = open_feature_file(path, verify=True)
    np.testing.assert_array_equal(rows, np.zeros((4, 4), np.float32))


def test_killed_writer_leaves_no_trusted_file(tmp_path):
    """A writer killed before its rename leaves only a hidden temporary."""
    import subprocess
    import sys

    path = tmp_path / "feat.bin"
    script = (
        "import os, signal, numpy as np\n"
        "from hmgraph.cache import format as fmt\n"
        "fmt.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"fmt.write_feature_file({str(path)!r}, np.ones((9999, 4), 'f4'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -9
    assert not path.exists()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".feat.bin.tmp")
    with pytest.raises(FeatureFileError, match="does not exist"):
        read_manifest(path)
    # The next writer of that file removes the dead writer's temporary.
    write_feature_file(path, np.ones((3, 4), "f4"))
    assert [p.name for p in tmp_path.iterdir()] == ["feat.bin"]


def _loop(path):
    path.symlink_to(path.with_name("other"))
    path.with_name("other").symlink_to(path)


#: Paths that are not regular files, and what read_manifest says they are.
NOT_FILES = {
    "directory": (lambda p: p.mkdir(), "is a directory, not a feature file"),
    "fifo": (os.mkfifo, "is a FIFO, not a feature file"),
    "symlink-loop": (_loop, "is a symlink loop, not a feature file"),
    "dangling-symlink": (lambda p: p.symlink_to(p.with_name("gone")),
                         "is a symlink to .*gone, which does not exist"),
}


@pytest.mark.parametrize("make,match", NOT_FILES.values(),
                         ids=NOT_FILES.keys())
def test_a_path_that_is_no_file_is_named_for_what_it_is(tmp_path, make,
                                                         match):
    path = tmp_path / "feat.bin"
    make(path)
    with pytest.raises(FeatureFileError, match=match) as info:
        read_manifest(path)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


def test_disk_command_never_advises_deleting_a_foreign_file(tmp_path,
                                                            capsys):
    from hmgraph.cli import main

    path = tmp_path / "afile"
    path.write_text("someone's notes")
    assert main(["disk", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"hmgraph disk: error: {path} is not an hmgraph feature file (bad "
        f"magic: it does not begin with HMGFEAT1); give a feature file "
        f"hmgraph wrote, such as a dataset's hmgraph/node-feat.bin"]
    assert path.read_text() == "someone's notes"

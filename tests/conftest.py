"""Shared fixtures: a generated synth-tiny root and the shared data."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# As hmgraph.openmp does, before anything imports torch or dgl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OUTDATED_IGNORE", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]
_PAGE = 4096  # hmgraph.cache.format.PAGE_BYTES


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep hmgraph's cache of read-only datasets inside the test run."""
    os.environ["HMGRAPH_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A dataset root in which synth-tiny has been generated once."""
    from hmgraph.datasets.synthetic import make_synthetic

    root = tmp_path_factory.mktemp("data")
    make_synthetic("synth-tiny", root)
    return root


@pytest.fixture(scope="session")
def tiny(data_root):
    """synth-tiny, loaded."""
    from hmgraph import datasets

    return datasets.load("synth-tiny", data_root)


@pytest.fixture(scope="module")
def rows():
    """The cache tests' reference rows (`test_cache.reference_rows`)."""
    from test_cache import reference_rows  # a test module: not at the top

    return reference_rows()


@pytest.fixture(scope="module")
def feature_path(tmp_path_factory, rows):
    """``rows`` as a feature file, one per test module."""
    from hmgraph.cache.format import write_feature_file

    path = tmp_path_factory.mktemp("rows") / "feat.bin"
    write_feature_file(path, rows)
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that use it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA


def accepts_o_direct(folder: Path) -> bool:
    """Whether files in ``folder`` can be opened and read with O_DIRECT."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = folder / f".odirect-probe-{os.getpid()}"
    probe.write_bytes(b"\0" * _PAGE)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            os.preadv(fd, [memoryview(mmap.mmap(-1, _PAGE))], 0)
        finally:
            os.close(fd)
        return True
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        return False
    finally:
        probe.unlink()


@pytest.fixture
def disk_dir(tmp_path):
    """A folder on a filesystem that accepts O_DIRECT.

    pytest's ``tmp_path`` where it does (ext4 /tmp), else a folder beside
    the checkout; skips when neither does.
    """
    if accepts_o_direct(tmp_path):
        yield tmp_path
        return
    (REPO / ".pytest_cache").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=REPO / ".pytest_cache"))
    try:
        if not accepts_o_direct(folder):
            pytest.skip("neither /tmp nor the checkout accepts O_DIRECT")
        yield folder
    finally:
        shutil.rmtree(folder)

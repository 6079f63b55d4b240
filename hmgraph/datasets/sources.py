"""What a dataset's own files hold, as one digest: keys for derived files.

hmgraph derives files from a dataset's source files (the feature file of a
Planetoid or OGB set, the graph it builds, renumbered copies) and keeps them
beside the data or, for a folder it must not write into, under
``$HMGRAPH_CACHE``. `source_digest` names the source's content, so two
copies that differ (Cora with its feature columns permuted) never share
derived files, and a copy changed in place is seen as changed.

A file of at most `FULL_HASH_BYTES` is hashed whole. A larger one (OGB's
raw archives run to tens of GB) is named by its size, its modification
time and the SHA-256 of `SAMPLE_BYTES` at its start, middle and end: a
copy made with another modification time is a new source (its derived
files are made again), and an edit that keeps size, time and the three
samples goes unseen.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FULL_HASH_BYTES", "SAMPLE_BYTES", "source_digest",
           "source_files"]

FULL_HASH_BYTES = 64 << 20
SAMPLE_BYTES = 1 << 20
#: Sub-folders of a dataset that hold hmgraph's files, not the source's.
DERIVED_FOLDERS = ("hmgraph",)


def source_files(folder: str | os.PathLike,
                 pattern: str = "**/*") -> list[Path]:
    """The regular files of ``folder`` matching ``pattern``, sorted.

    Files under hmgraph's own sub-folder (``hmgraph/``) are left out:
    they are derived, not source.
    """
    folder = Path(folder)
    return sorted(
        path for path in folder.glob(pattern)
        if path.is_file() and not set(
            path.relative_to(folder).parts[:-1]) & set(DERIVED_FOLDERS))


def source_digest(files: Iterable[str | os.PathLike],
                  folder: str | os.PathLike) -> str:
    """SHA-256 (hex) of what ``files`` hold, named relative to ``folder``.

    Parameters
    ----------
    files : iterable of path
        The source files (e.g. `source_files` of the dataset's folder).
    folder : str or os.PathLike
        Names are taken relative to it, so a copy elsewhere with the same
        files has the same digest.

    Returns
    -------
    str
        64 hex digits; the same for the same names and contents.
    """
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(Path(p) for p in files):
        info = path.stat()
        name = path.relative_to(folder).as_posix()
        digest.update(f"{name}\0{info.st_size}\0".encode())
        if info.st_size > FULL_HASH_BYTES:
            digest.update(f"{info.st_mtime_ns}\0".encode())
        digest.update(_content_hash(path, info.st_size))
    return digest.hexdigest()


def _content_hash(path: Path, size: int) -> bytes:
    """SHA-256 of the whole file, or of three samples of a large one."""
    content = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(SAMPLE_BYTES):
                content.update(chunk)
        else:
            for offset in (0, (size - SAMPLE_BYTES) // 2,
                           size - SAMPLE_BYTES):
                f.seek(offset)
                content.update(f.read(SAMPLE_BYTES))
    return content.digest()

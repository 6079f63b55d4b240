"""Read-only copies of shared datasets, made by the tests themselves.

Tests of how hmgraph treats a dataset folder it must not write into copy
the folder under ``tmp_path`` and take the write bits off the copy, so the
outcome does not depend on the permissions of ``../shared``.

As root (``os.geteuid() == 0``) the kernel ignores permission bits, so a
write into the copy would succeed instead of failing; hmgraph decides from
the mode bits, which root sees like anyone. `tree_state` records every
entry of the copy (mode, size, mtime, contents) so that a test can assert
nothing was written, whoever runs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["read_only_copy", "tree_state"]

FILE_MODE, DIR_MODE = 0o444, 0o555


@contextlib.contextmanager
def read_only_copy(source: Path, target: Path) -> Iterator[Path]:
    """Copy ``source`` to ``target``, files 0o444 and folders 0o555.

    Write permission is given back on exit (pytest must delete the copy).
    """
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    entries = sorted(target.rglob("*"), key=lambda p: len(p.parts),
                     reverse=True)  # the deepest first, the top last
    try:
        for path in [*entries, target]:
            path.chmod(DIR_MODE if path.is_dir() else FILE_MODE)
        yield target
    finally:
        for path in [target, *reversed(entries)]:
            if path.exists() and not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (itself included): mode, size, mtime and
    the SHA-256 of a file's bytes."""
    state = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        digest = None
        if stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        state[os.path.relpath(path, root)] = (
            stat.filemode(info.st_mode), info.st_size, info.st_mtime_ns,
            digest)
    return state

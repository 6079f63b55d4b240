"""One writer per derived file: an exclusive lock that others wait on.

Runs that share a dataset root (two trainings started together) may both
find a file missing that hmgraph derives (a renumbered feature file, a
synthetic set's features, the cached copy of a read-only dataset).
`exclusive_lock` lets one of them write it while the others wait, then
find it written and reuse it. What is written is still renamed into place
whole (`hmgraph.cache.format.atomic_path`), so a reader that takes no
lock never sees a file half-written.

Locks are ``fcntl.flock`` locks on a small file that is never deleted
(deleting it would let a second writer lock a new file of the same name);
the kernel drops a lock when its holder exits, killed or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["exclusive_lock"]


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike,
                   what: str = "") -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` for the block.

    Blocks while another process holds it. ``path`` (and its folder) is
    created if missing and left in place afterwards.

    Parameters
    ----------
    path : str or os.PathLike
        The lock file, e.g. ``folder / ".lock"``.
    what : str
        What the holder writes, for the log line while waiting.

    Examples
    --------
    >>> with exclusive_lock(folder / ".lock"):  # doctest: +SKIP
    ...     if not complete(folder):
    ...         write(folder)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another run writing %s", what or path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock

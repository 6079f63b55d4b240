"""The on-disk node-feature file: one row-major binary file with a manifest.

Layout of a feature file (all integers little-endian)::

    offset 0      magic  b"HMGFEAT1"                      (8 bytes)
    offset 8      manifest length in bytes (uint32)       (4 bytes)
    offset 12     manifest, UTF-8 JSON                    (< 4084 bytes)
    ...           zero padding up to ``DATA_OFFSET``
    offset 4096   rows, row-major, ``shape[0] * row_bytes`` bytes
    ...           zero padding up to a multiple of ``PAGE_BYTES``

The manifest records ``shape``, ``dtype``, ``row_bytes``, ``data_offset``,
``data_bytes`` and a CRC-32 ``checksum`` of the row bytes. The data start
and the file end are aligned to 4096 bytes, so the storage tier can read any
page run with ``O_DIRECT``.

Files are written to a temporary name in the same folder, fsynced and
renamed, so a killed writer never leaves a file that a reader trusts.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil

__all__ = [
    "DATA_OFFSET",
    "PAGE_BYTES",
    "FeatureFileError",
    "FeatureFileWriter",
    "FeatureManifest",
    "REBUILD",
    "atomic_path",
    "open_feature_file",
    "read_manifest",
    "verify_feature_file",
    "with_remedy",
    "write_feature_file",
]

MAGIC = b"HMGFEAT1"
PAGE_BYTES = 4096
DATA_OFFSET = 4096
FORMAT_VERSION = 1
_CHUNK_BYTES = 64 << 20
_SUPPORTED_DTYPES = ("float16", "float32", "float64", "int8", "uint8",
                     "int32", "int64")


class FeatureFileError(ValueError):
    """A feature file is missing, truncated, corrupt or of the wrong kind."""


#: The way out that the message of a damaged feature file names. True of
#: the files hmgraph makes: a dataset's feature file, renumbered copies
#: and a synthetic set's rows are made again by the next load once
#: deleted. Where a file comes from elsewhere (the user's own, a
#: partition's), the reader names its own way out with `with_remedy`.
REBUILD = "delete it to rebuild it"


def with_remedy(error: FeatureFileError, remedy: str) -> FeatureFileError:
    """``error`` with `REBUILD` in its message replaced by ``remedy``.

    Examples
    --------
    >>> try:  # doctest: +SKIP
    ...     read_manifest(path)
    ... except FeatureFileError as err:
    ...     raise with_remedy(err, "partition again") from None
    """
    return FeatureFileError(str(error).replace(REBUILD, remedy))



@dataclass(frozen=True)
class FeatureManifest:
    """What a feature file holds.

    Attributes
    ----------
    shape : tuple of int
        ``(num_rows, *row_shape)``.
    dtype : str
        NumPy dtype name of the rows, e.g. ``"float32"``.
    checksum : str
        ``"crc32:xxxxxxxx"`` over the row bytes.
    data_offset : int
        Byte offset of the first row; a multiple of ``PAGE_BYTES``.
    version : int
        Format version.
    """

    shape: tuple[int, ...]
    dtype: str
    checksum: str
    data_offset: int = DATA_OFFSET
    version: int = FORMAT_VERSION

    @property
    def num_rows(self) -> int:
        """Number of rows."""
        return self.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of one row."""
        return tuple(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(
            self.dtype
        ).itemsize

    @property
    def data_bytes(self) -> int:
        """Bytes of all rows, without padding."""
        return self.num_rows * self.row_bytes

    @property
    def file_bytes(self) -> int:
        """Size of the whole file, padding included."""
        return self.data_offset + _round_up(self.data_bytes, PAGE_BYTES)

    def to_json(self) -> str:
        """The manifest as JSON, with the derived sizes for readers."""
        record = asdict(self)
        record["shape"] = list(self.shape)
        record["row_bytes"] = self.row_bytes
        record["data_bytes"] = self.data_bytes
        return json.dumps(record, sort_keys=True)


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _bytes_of(rows: np.ndarray) -> np.ndarray:
    """The rows as a flat uint8 view (no copy for contiguous rows)."""
    return np.ascontiguousarray(rows).reshape(-1).view(np.uint8)


class atomic_path:
    """Context manager yielding a temporary path renamed onto ``path``.

    The temporary file sits in the same folder (so the rename is atomic),
    is fsynced before the rename and removed if the block raises.

    Examples
    --------
    >>> with atomic_path("graph.bin") as tmp:  # doctest: +SKIP
    ...     write_everything(tmp)
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tmp = self.path.with_name(
            f".{self.path.name}.tmp-{os.getpid()}"
        )

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temporaries(self.path)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _remove_dead_temporaries(path: Path) -> None:
    """Delete ``.<name>.tmp-<pid>`` files of writers that were killed."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            stale.unlink(missing_ok=True)


class FeatureFileWriter:
    """Write a feature file chunk by chunk, never holding all rows.

    Rows are appended in order with `write`; the CRC-32 is computed on the
    way and the manifest is written into the header when the last row has
    arrived. The file is built under a temporary name in the destination's
    folder and renamed only by a successful `close` (or a ``with`` block
    that ends without error), so a killed or failed writer leaves nothing
    that `read_manifest` accepts under ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination. An existing file is replaced only once the new one is
        complete and fsynced.
    shape : tuple of int
        ``(num_rows, *row_shape)`` of the whole matrix.
    dtype : str or numpy.dtype
        Element type, one of the supported dtypes.

    Examples
    --------
    >>> with FeatureFileWriter("feat.bin", (n, 128), "float32") as out:
    ...     for start in range(0, n, 65536):   # doctest: +SKIP
    ...         out.write(make_rows(start, min(start + 65536, n)))
    """

    def __init__(self, path: str | os.PathLike, shape, dtype):
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        if len(shape) < 2 or min(shape) < 0:
            raise FeatureFileError(
                f"feature rows must be at least 2-D (rows, features) with "
                f"sizes >= 0; got shape {shape}"
            )
        if dtype.name not in _SUPPORTED_DTYPES:
            raise FeatureFileError(
                f"unsupported feature dtype {dtype.name}; "
                f"supported: {', '.join(_SUPPORTED_DTYPES)}"
            )
        self.shape = shape
        self.dtype = dtype
        self.rows_written = 0
        #: The manifest, once `close` has written it.
        self.manifest: FeatureManifest | None = None
        self._crc = 0
        self._atomic = atomic_path(path)
        self._file = open(self._atomic.__enter__(), "wb")
        self._file.seek(DATA_OFFSET)

    def write(self, rows: np.ndarray) -> None:
        """Append ``rows`` (shape ``(k, *row_shape)``, the file's dtype)."""
        if hasattr(rows, "numpy"):
            rows = rows.detach().cpu().numpy()
        rows = np.asarray(rows)
        if rows.dtype != self.dtype or tuple(rows.shape[1:]) != \
                self.shape[1:] or rows.ndim != len(self.shape):
            raise FeatureFileError(
                f"chunk of {rows.dtype.name} rows of shape "
                f"{tuple(rows.shape)} does not fit a file of "
                f"{self.dtype.name} rows of shape {self.shape}"
            )
        if self.rows_written + len(rows) > self.shape[0]:
            raise FeatureFileError(
                f"{self.rows_written + len(rows)} rows written to a file "
                f"of {self.shape[0]} rows"
            )
        view = _bytes_of(rows)
        for start in range(0, len(view), _CHUNK_BYTES):
            part = view[start:start + _CHUNK_BYTES]
            self._crc = zlib.crc32(part, self._crc)
            self._file.write(part)
        self.rows_written += len(rows)

    def close(self) -> FeatureManifest:
        """Write the manifest, fsync and rename into place.

        Raises
        ------
        FeatureFileError
            If fewer rows than ``shape[0]`` were written (the temporary file
            is removed).
        """
        if self.rows_written != self.shape[0]:
            self.abort()
            raise FeatureFileError(
                f"feature file {self._atomic.path} got {self.rows_written} "
                f"of its {self.shape[0]} rows"
            )
        manifest = FeatureManifest(
            shape=self.shape, dtype=self.dtype.name,
            checksum=f"crc32:{self._crc:08x}",
        )
        header = manifest.to_json().encode()
        if len(MAGIC) + 4 + len(header) > DATA_OFFSET:
            self.abort()
            raise FeatureFileError(f"manifest too long: {len(header)} bytes")
        self._file.truncate(manifest.file_bytes)
        self._file.seek(0)
        self._file.write(MAGIC + struct.pack("<I", len(header)) + header)
        self._file.close()
        self._atomic.__exit__(None, None, None)
        self.manifest = manifest
        return manifest

    def abort(self) -> None:
        """Drop the temporary file; ``path`` is left as it was."""
        if not self._file.closed:
            self._file.close()
        self._atomic.tmp.unlink(missing_ok=True)

    def __enter__(self) -> FeatureFileWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_feature_file(
    path: str | os.PathLike, rows: np.ndarray
) -> FeatureManifest:
    """Write ``rows`` as a feature file, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination. An existing file is replaced only once the new one is
        complete and fsynced.
    rows : numpy.ndarray
        At least 2-D; the first axis indexes rows. A torch tensor is
        accepted through ``numpy()``. See `FeatureFileWriter` to write a
        matrix that does not fit in memory.

    Returns
    -------
    FeatureManifest
        The manifest written into the header.
    """
    if hasattr(rows, "numpy"):
        rows = rows.detach().cpu().numpy()
    rows = np.asarray(rows)
    if rows.ndim < 2:
        raise FeatureFileError(
            f"feature rows must be at least 2-D (rows, features); "
            f"got shape {tuple(rows.shape)}"
        )
    with FeatureFileWriter(path, rows.shape, rows.dtype) as out:
        out.write(rows)
    return out.manifest


def read_manifest(path: str | os.PathLike) -> FeatureManifest:
    """Read and check the header of a feature file.

    Checks the magic, the manifest and the file size (a truncated file is
    refused). Does not read the rows; see `verify_feature_file`.

    Raises
    ------
    FeatureFileError
        One line naming the file and what is wrong with it.
    """
    path = Path(path)
    if not path.is_file():
        raise FeatureFileError(_not_a_file(path))
    with open(path, "rb") as f:
        head = f.read(DATA_OFFSET)
    if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
        # Not a file hmgraph wrote (it writes the magic first, atomically):
        # someone's own file, so never advise deleting it.
        raise FeatureFileError(
            f"{path} is not an hmgraph feature file (bad magic: it does "
            f"not begin with {MAGIC.decode()}); give a feature file hmgraph "
            f"wrote, such as a dataset's hmgraph/node-feat.bin"
        )
    (length,) = struct.unpack("<I", head[len(MAGIC):len(MAGIC) + 4])
    try:
        record = json.loads(head[len(MAGIC) + 4:len(MAGIC) + 4 + length])
        manifest = FeatureManifest(
            shape=tuple(int(s) for s in record["shape"]),
            dtype=str(record["dtype"]),
            checksum=str(record["checksum"]),
            data_offset=int(record["data_offset"]),
            version=int(record["version"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise FeatureFileError(
            f"{path} has an unreadable manifest ({err}); {REBUILD}"
        ) from None
    if manifest.version != FORMAT_VERSION:
        raise FeatureFileError(
            f"{path} has format version {manifest.version}; this hmgraph "
            f"reads version {FORMAT_VERSION}"
        )
    size = path.stat().st_size
    if size < manifest.file_bytes:
        raise FeatureFileError(
            f"feature file {path} is truncated: {size} bytes, its manifest "
            f"needs {manifest.file_bytes}; {REBUILD}"
        )
    return manifest


def _not_a_file(path: Path) -> str:
    """Why ``path``, not a regular file, cannot be a feature file."""
    try:
        mode = path.stat().st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return f"{path} is a symlink loop, not a feature file"
        if path.is_symlink():
            return (f"{path} is a symlink to {os.readlink(path)}, which "
                    f"does not exist")
        return f"feature file {path} does not exist"
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO",
             stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device"}
    kind = next((what for test, what in kinds.items() if test(mode)),
                "a special file")
    return f"{path} is {kind}, not a feature file"


def open_feature_file(
    path: str | os.PathLike, verify: bool = False
) -> tuple[FeatureManifest, np.memmap]:
    """Map a feature file read-only.

    Parameters
    ----------
    path : str or os.PathLike
        The feature file.
    verify : bool
        Also recompute the checksum of all rows (reads the whole file).

    Returns
    -------
    (FeatureManifest, numpy.memmap)
        The manifest and a read-only row-major view of the rows (CPU).
    """
    manifest = verify_feature_file(path) if verify else read_manifest(path)
    if manifest.data_bytes == 0:  # mmap cannot map zero bytes
        return manifest, np.empty(manifest.shape, np.dtype(manifest.dtype))
    rows = np.memmap(
        path,
        dtype=np.dtype(manifest.dtype),
        mode="r",
        offset=manifest.data_offset,
        shape=manifest.shape,
    )
    return manifest, rows


def verify_feature_file(path: str | os.PathLike) -> FeatureManifest:
    """Check header, size and checksum of a feature file.

    Raises
    ------
    FeatureFileError
        When the rows do not match the manifest's checksum.
    """
    manifest = read_manifest(path)
    # Plain reads into one reused buffer: a memmap would leave the whole
    # file mapped into this process (and counted in its RSS).
    crc, left = 0, manifest.data_bytes
    buffer = bytearray(min(_CHUNK_BYTES, max(left, 1)))
    with open(path, "rb", buffering=0) as f:
        f.seek(manifest.data_offset)
        while left:
            view = memoryview(buffer)[:min(left, len(buffer))]
            got = f.readinto(view)
            if not got:
                break
            crc = zlib.crc32(view[:got], crc)
            left -= got
    actual = f"crc32:{crc:08x}"
    if actual != manifest.checksum:
        raise FeatureFileError(
            f"feature file {path} fails its checksum: manifest says "
            f"{manifest.checksum}, rows give {actual}; {REBUILD}"
        )
    return manifest

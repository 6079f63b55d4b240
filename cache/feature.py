"""The feature contract: rows addressed by node id.

Every tier (storage, host, device) and every cache built from them is a
`Feature`. Public methods validate their arguments and call the protected
``_read`` that does the work, as PyG's ``FeatureStore`` does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from hmgraph.cache.buffers import BufferPool

__all__ = ["Feature", "TensorFeature", "check_ids", "request_rows",
           "torch_dtype", "unique_sorted"]


def unique_sorted(ids: torch.Tensor):
    """Sorted unique ids and where each request finds its row.

    Cheaper than ``torch.unique(return_inverse=True)`` for what loaders
    pass most: ids that are already unique (DGL's input nodes), or
    already sorted and unique (nothing to do).

    Returns
    -------
    (torch.Tensor, torch.Tensor or None)
        ``unique`` and ``inverse`` with ``unique[inverse] == ids``;
        ``inverse`` is None when ``ids`` already was ``unique``.
    """
    if ids.numel() < 2 or bool((ids[1:] > ids[:-1]).all()):
        return ids, None
    # Stable: torch's default CPU sort of 160,000 int64 ids took 97 ms,
    # its stable one 14 ms.
    values, order = ids.sort(stable=True)
    if bool((values[1:] != values[:-1]).all()):
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        return values, inverse
    return torch.unique(ids, return_inverse=True)


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype (or name)."""
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


def check_ids(ids, num_rows: int) -> torch.Tensor:
    """Validate row ids; return them as a 1-D int64 CPU tensor.

    Raises
    ------
    TypeError
        If ``ids`` is not an integer tensor or array.
    ValueError
        If ``ids`` is not 1-D, or an id is outside ``[0, num_rows)``: the
        message names the largest bad id and the row count.
    """
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids)
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a tensor, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"ids must be int64 or int32, got {ids.dtype}")
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    ids = ids.to("cpu", torch.int64)
    if ids.numel():
        # NumPy's reductions: torch's min and max of a batch's 200,000
        # ids took 12-13 ms each on 2 busy cores (its thread pool wakes),
        # NumPy's 0.04 ms.
        values = ids.numpy()
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= num_rows:
            bad = ids[(ids < 0) | (ids >= num_rows)]
            worst = int(bad.max()) if int(bad.max()) >= num_rows else int(
                bad.min())
            raise ValueError(
                f"id {worst} out of range: {bad.numel()} ids outside "
                f"[0, {num_rows}) for {num_rows} rows"
            )
    return ids


class Feature(ABC):
    """Rows of a feature matrix, read by id.

    Attributes
    ----------
    num_rows : int
        Number of rows.
    row_shape : tuple of int
        Shape of one row.
    dtype : torch.dtype
        Element type.
    device : torch.device
        Where `read` returns rows.
    """

    num_rows: int
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * \
            torch.empty(0, dtype=self.dtype).element_size()

    @property
    def shape(self) -> tuple[int, ...]:
        """``(num_rows, *row_shape)``."""
        return (self.num_rows, *self.row_shape)

    def __len__(self) -> int:
        return self.num_rows

    def read(self, ids) -> torch.Tensor:
        """Rows of ``ids``, in request order.

        Parameters
        ----------
        ids : torch.Tensor or numpy.ndarray
            1-D int64 or int32 ids; duplicates and any order allowed.

        Returns
        -------
        torch.Tensor
            Shape ``(len(ids), *row_shape)``, on `device`.
        """
        return self._read(check_ids(ids, self.num_rows))

    @abstractmethod
    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of validated int64 CPU ``ids``."""

    def close(self) -> None:  # noqa: B027 - most tiers hold nothing
        """Release files and threads; reading afterwards is an error."""

    def release_buffers(self) -> None:  # noqa: B027 - most keep none
        """Let go of batch buffers kept for reuse (an epoch's end): only
        the bounded working set of batches in flight is kept, never
        between epochs."""

    def keep_buffers(self, batches: int) -> None:  # noqa: B027 - most keep none
        """Keep at most ``batches`` batch buffers for reuse: the batches
        whose rows the loader may hold at once (its prefetch depth plus
        the one training and the one being read)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_rows={self.num_rows}, "
                f"row_shape={self.row_shape}, dtype={self.dtype})")


class TensorFeature(Feature):
    """Rows held in one tensor (in memory, on any device).

    On the CPU a read gathers with ``index_select`` into a buffer that is
    reused once nobody holds it (`keep_buffers`, which the loader sizes
    to its batches in flight): a fresh tensor of a batch's rows costs a
    page fault per 4 KiB written. On synth-products (543,000 rows of
    400 B a batch, one thread) ``rows[ids]`` (advanced indexing into a
    fresh tensor) took 255 ms, ``index_select`` into a fresh tensor
    155 ms, and ``index_select`` into a reused buffer 47 ms.

    Parameters
    ----------
    rows : torch.Tensor or numpy.ndarray
        At least 2-D; the first axis indexes rows.
    """

    def __init__(self, rows):
        if isinstance(rows, np.ndarray):
            rows = torch.from_numpy(np.ascontiguousarray(rows))
        if rows.dim() < 2:
            raise ValueError(
                f"rows must be at least 2-D, got shape {tuple(rows.shape)}"
            )
        self.rows = rows
        self.num_rows = rows.shape[0]
        self.row_shape = tuple(rows.shape[1:])
        self.dtype = rows.dtype
        self.device = rows.device
        self._pool = BufferPool(self.row_shape, self.dtype, size=0) \
            if self.device.type == "cpu" else None

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        if self._pool is None:
            return self.rows[ids.to(self.device)]
        out = self._pool.empty(ids.numel()) if self._pool.size else None
        return torch.index_select(self.rows, 0, ids, out=out)

    def keep_buffers(self, batches: int) -> None:
        if self._pool is not None:
            self._pool.resize(batches)

    def release_buffers(self) -> None:
        if self._pool is not None:
            self._pool.clear()


def request_rows(ids: torch.Tensor, feature: Feature):
    """Sorted unique ids, the output buffer, and where rows go in it.

    When the ids have no duplicates (DGL's input nodes), ``out`` is in
    request order and rows are written straight to their place, with no
    reordering copy at the end (``inverse`` is None); otherwise ``out``
    follows ``unique`` and the caller returns ``out[inverse]``.

    Parameters
    ----------
    ids : torch.Tensor
        1-D int64 ids of a read, checked (`check_ids`), on the CPU.
    feature : Feature
        What is read: its rows' shape, dtype and device.

    Returns
    -------
    tuple
        ``(unique, out, where, inverse)``: ``out`` is an empty tensor of
        ``len(unique)`` rows on the feature's device; ``where(positions)``
        maps positions in ``unique`` to rows of ``out`` (on that device).
    """
    unique, inverse = unique_sorted(ids)
    out = torch.empty((unique.numel(), *feature.row_shape),
                      dtype=feature.dtype, device=feature.device)
    device = feature.device
    if inverse is not None and inverse.numel() == unique.numel():
        order = torch.empty_like(inverse)
        order[inverse] = torch.arange(inverse.numel(),
                                      device=inverse.device)
        return unique, out, lambda pos: order[pos].to(device), None
    return unique, out, lambda pos: pos.to(device), inverse

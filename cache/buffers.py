"""Batch buffers that are reused once nobody holds them.

A batch's rows land in a fresh tensor of tens or hundreds of MB. glibc
serves such a request with a new memory mapping and returns it to the
system when the tensor is freed, so every batch pays a page fault per
4 KiB it writes: on synth-small (64 MB of input rows a batch) some
25-30 ms of kernel time, as much as the gather itself.

`BufferPool` keeps a few buffers and hands out views of them. A buffer is
handed out again only when no tensor but the pool's own refers to its
memory any more (the storage's use count, which counts every view, every
tensor made from it and every NumPy array over it): rows a caller keeps
are never overwritten. When every buffer is still held, a fresh one is
made, and kept only while the pool has room. Buffers start on a page
boundary (`aligned_empty`), so the storage tier can read whole rows of a
block-multiple size straight into them (``O_DIRECT`` wants aligned
memory).
"""

from __future__ import annotations

import threading
import time

import torch

__all__ = ["ALIGNMENT", "BufferPool", "aligned_empty"]

#: Bytes a buffer's start is aligned to: a page, a multiple of every
#: logical block size ``O_DIRECT`` asks for.
ALIGNMENT = 4096

_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _holders(tensor: torch.Tensor) -> int:
    return _use_count(tensor.untyped_storage()._cdata)


def aligned_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose first byte is `ALIGNMENT`-aligned
    (torch's allocator aligns to 64 bytes): a view into a slightly larger
    byte buffer, which only the view keeps alive."""
    shape = tuple(shape)
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    raw = torch.empty(nbytes + ALIGNMENT, dtype=torch.uint8)
    skip = -raw.data_ptr() % ALIGNMENT
    return raw[skip:skip + nbytes].view(dtype).view(shape)


class BufferPool:
    """Up to ``size`` reusable CPU buffers of rows.

    Parameters
    ----------
    row_shape : tuple of int
        Shape of one row.
    dtype : torch.dtype
        Element type.
    size : int
        Buffers kept: the batches whose rows may be alive at once (the one
        being trained on, those prefetched, the one being read); the
        loader sets it (`resize`) to its prefetch depth plus two.
    """

    #: Seconds to wait for a buffer to come free when all ``size`` are
    #: held, before making one more: the consumer lets go of its last
    #: batch a moment after it takes the next, and a reader that does not
    #: wait for that moment holds one batch more than the bound.
    wait_seconds = 0.005

    def __init__(self, row_shape, dtype, size: int = 4):
        self.row_shape = tuple(row_shape)
        self.dtype = dtype
        self.size = size if _use_count is not None else 0
        self._buffers: list[tuple[torch.Tensor, int]] = []
        self._lock = threading.Lock()
        #: Buffers made because every kept one was still held: batches in
        #: flight beyond the pool's size (each pays its page faults).
        self.overflows = 0
        #: Idle buffers remade larger because a batch outgrew them.
        self.regrown = 0
        self._largest = 0

    def resize(self, size: int) -> None:
        """Keep at most ``size`` buffers from now on."""
        with self._lock:
            self.size = size if _use_count is not None else 0
            del self._buffers[self.size:]

    def empty(self, rows: int) -> torch.Tensor:
        """An uninitialised ``(rows, *row_shape)`` tensor (CPU)."""
        deadline = time.perf_counter() + self.wait_seconds
        while True:
            with self._lock:
                free = self._idle(rows)
                if free is not None:
                    return free[:rows]
                full = len(self._buffers) >= self.size and all(
                    _holders(base) > idle for base, idle in self._buffers)
                if not full or time.perf_counter() >= deadline:
                    self.overflows += full
                    return self._fresh(rows)
            time.sleep(self.wait_seconds / 5)

    def _idle(self, rows: int) -> torch.Tensor | None:
        for base, idle in self._buffers:
            if base.shape[0] >= rows and _holders(base) == idle:
                return base
        return None

    def _fresh(self, rows: int) -> torch.Tensor:
        # Sized for the largest batch asked for so far, with a little room
        # (the next batches' row counts differ by a few %), so that a
        # buffer outgrown once is not outgrown again and again.
        self._largest = max(self._largest, rows)
        fresh = aligned_empty(
            (self._largest + self._largest // 32, *self.row_shape),
            self.dtype)
        if len(self._buffers) < self.size:
            self._buffers.append((fresh, _holders(fresh)))
        else:  # replace a smaller buffer nobody holds
            for index, (base, idle) in enumerate(self._buffers):
                if _holders(base) == idle:
                    self._buffers[index] = (fresh, _holders(fresh))
                    self.regrown += 1
                    break
        return fresh[:rows]

    def clear(self) -> None:
        """Let go of every buffer (those still held live on with their
        holders): at an epoch's end, and when the owner closes."""
        with self._lock:
            self._buffers.clear()

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers kept."""
        return sum(base.numel() * base.element_size()
                   for base, _ in self._buffers)

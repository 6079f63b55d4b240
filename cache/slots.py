"""Fixed memory for cached rows: a slot buffer, a slot table, a free list.

A `SlotStore` holds up to ``capacity`` rows in one preallocated buffer on
its device (host memory, pinned when a GPU is present, or the training
device). Which id sits in which slot is kept in two tables (id -> slot,
slot -> id) and the free slots in a stack. Inserting and removing rows are
vectorised tensor operations in O(rows touched): no per-id Python work, no
fragmentation, no reallocation while training.

Stores that never hold the same id (the tiers of one exclusive cache
layer) can share one id -> slot table (`SlotTable`): each owns a range of
its slot numbers, so the per-node cost is 4 bytes for all of them instead
of 4 bytes each.
"""

from __future__ import annotations

import torch

from . import uva
from .buffers import aligned_empty

__all__ = ["SLOT_BYTES", "SlotStore", "SlotTable"]

#: Host bytes per slot of a store's tables besides the id -> slot table:
#: slot -> id and the free stack (int64 each), the read stamp (int32).
SLOT_BYTES = 8 + 8 + 4


class SlotTable:
    """One id -> slot table for stores that never hold the same id.

    Parameters
    ----------
    num_rows : int
        Rows of the feature matrix.
    slots : int
        Slots of all the stores together; each store is given its
        ``offset`` (the first of its numbers) by `share`.
    """

    def __init__(self, num_rows: int, slots: int):
        dtype = torch.int32 if slots < 2**31 else torch.int64
        self.table = torch.full((num_rows,), -1, dtype=dtype)
        self._next = 0
        self.slots = slots

    def share(self, capacity: int) -> tuple[torch.Tensor, int]:
        """The table and the offset of a store of ``capacity`` slots."""
        offset = self._next
        self._next += capacity
        if self._next > self.slots:
            raise ValueError(f"the table's {self.slots} slots are taken; "
                             f"cannot give {capacity} more")
        return self.table, offset


class SlotStore:
    """Rows of some ids in a buffer of ``capacity`` slots.

    Parameters
    ----------
    name : str
        Tier name for statistics, e.g. ``"device"`` or ``"host"``.
    num_rows : int
        Rows of the feature matrix (ids are ``0 .. num_rows - 1``).
    row_shape : tuple of int
        Shape of one row.
    dtype : torch.dtype
        Element type.
    capacity : int
        Slots; the buffer holds ``capacity * row_bytes`` bytes.
    device : torch.device or str
        Where the buffer lives.
    pin : bool
        Pin the buffer (host memory feeding a GPU).
    table : SlotTable, optional
        An id -> slot table shared with stores that never hold the same
        ids; by default the store has its own.
    """

    def __init__(self, name, num_rows, row_shape, dtype, capacity,
                 device="cpu", pin=False, table=None):
        if capacity < 0:
            raise ValueError(f"{name} capacity {capacity} is negative")
        self.name = name
        self.capacity = capacity
        self.device = torch.device(device)
        # Host rows page-aligned: the storage tier reads rows brought along
        # straight into them where their size allows (`aligned_empty`).
        self.buffer = aligned_empty((capacity, *row_shape), dtype) \
            if self.device.type == "cpu" and not pin else torch.empty(
                (capacity, *row_shape), dtype=dtype, device=self.device,
                pin_memory=pin and capacity > 0)
        if table is None:
            table = SlotTable(num_rows, capacity)
        # This store's numbers in the table: offset .. offset + capacity - 1.
        self.slot_of, self.offset = table.share(capacity)
        # Holding every number of the table (its own, or a shared one with
        # no other store), a lookup needs no range check.
        self._alone = self.offset == 0 and capacity == table.slots
        self.id_of = torch.full((capacity,), -1, dtype=torch.int64)
        # The read that last found each slot: the compiled engine's check
        # for ids asked twice in one request (`hmgraph.cache.engine`).
        self.seen = torch.zeros(capacity, dtype=torch.int32)
        # Free slots as a stack: the top is free[num_free - 1].
        self.free = torch.arange(capacity - 1, -1, -1, dtype=torch.int64)
        self.num_free = capacity
        #: What gathers and inserts index: the buffer, or a view of it on
        #: the device the tables moved to (`move_tables`).
        self.rows = self.buffer

    @property
    def nbytes(self) -> int:
        """Bytes held by the row buffer."""
        return self.buffer.numel() * self.buffer.element_size()

    @property
    def size(self) -> int:
        """Rows held."""
        return self.capacity - self.num_free

    def slots(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of each id (int64, -1 where absent), CPU."""
        numbers = self.slot_of[ids].long()
        if self._alone:
            return numbers
        local = numbers - self.offset
        mine = (numbers >= self.offset) & (local < self.capacity)
        return torch.where(mine, local, -1)

    def move_tables(self, device, slot_of: torch.Tensor) -> None:
        """Keep the tables on ``device`` and reach the rows from there.

        ``slot_of`` is the id -> slot table already moved (stores that
        share one share the moved one). Pinned host rows are then read
        and written in place by the device (`hmgraph.cache.uva`); rows in
        unpinned memory are copied across as before.
        """
        device = torch.device(device)
        self.slot_of = slot_of
        self.id_of = self.id_of.to(device)
        self.seen = self.seen.to(device)
        self.free = self.free.to(device)
        if self.buffer.device != device and self.buffer.is_pinned():
            view = uva.device_view(self.buffer, device)
            self.rows = self.buffer if view is None else view

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows in ``slots`` (on this store's device, or the device its
        tables moved to where it reads the rows in place).

        ``index_select``: on the CPU it copies rows whole, 1.6x faster than
        advanced indexing (325,000 rows of 400 B: 131 against 215 ms).
        """
        return self.rows.index_select(0, slots.to(self.rows.device))

    def insert(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Put rows of absent ``ids`` into free slots.

        Raises
        ------
        ValueError
            If there are fewer free slots than ids.
        """
        count = ids.numel()
        if count == 0:
            return
        if count > self.num_free:
            raise ValueError(
                f"{self.name} tier has {self.num_free} free slots, asked "
                f"to insert {count} rows"
            )
        slots = self.free[self.num_free - count:self.num_free]
        self.num_free -= count
        self.rows[slots.to(self.rows.device)] = rows.to(self.rows.device)
        self.slot_of[ids] = (slots + self.offset).to(self.slot_of.dtype)
        self.id_of[slots] = ids

    def remove(self, ids: torch.Tensor) -> torch.Tensor:
        """Free the slots of those ``ids`` held here; return the ids freed."""
        slots = self.slots(ids)
        held = slots >= 0
        slots, ids = slots[held], ids[held]
        count = slots.numel()
        self.free[self.num_free:self.num_free + count] = slots
        self.num_free += count
        self.slot_of[ids] = -1
        self.id_of[slots] = -1
        return ids

    def __repr__(self) -> str:
        return (f"SlotStore({self.name!r}, {self.size}/{self.capacity} rows,"
                f" {self.nbytes} bytes on {self.device})")

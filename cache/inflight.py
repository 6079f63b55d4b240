"""A batch between the phases of a compiled cache read.

`hmgraph.cache.compiled.CompiledRead` reads a batch in phases (see there):
looked up, its reads started, the policy's choice applied to the tables,
the reads waited for, the admitted rows copied. `InFlight` is what one
batch carries between them. The choice is applied to the tables before
the reads end (so the next batch can be looked up meanwhile) and the rows
follow once they are read; `undo` puts the tables back as they were when a
read fails, so a failed read still leaves no trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hmgraph.cache import engine
from hmgraph.cache.policies import ClockPolicy, LRUPolicy

__all__ = ["STEPPED", "InFlight", "PendingRead", "apply_tables",
           "dynamic_choice", "place", "stepped_choice", "undo"]

_EMPTY = np.zeros(0, dtype=np.int64)
#: Policies whose choice is their own `Policy.step` (torch code, in
#: proportion to the batch), taken once the batch's reads succeeded
#: (`stepped_choice`): nothing of theirs to undo.
STEPPED = (LRUPolicy, ClockPolicy)


def _nothing() -> None:
    """Nothing to wait for."""


@dataclass(eq=False)
class InFlight:
    """One batch's state between the phases of its read.

    Attributes
    ----------
    ids : numpy.ndarray
        The batch's unique ids, in request order.
    store, slot : numpy.ndarray
        Each id's store (-1: none) and slot at lookup.
    missing, missed : numpy.ndarray
        Positions of the misses in the request, and their ids, in file
        order.
    out : torch.Tensor
        The rows' tensor; ``out_rows`` its bytes, ``at`` the row of each
        id in it (None: row ``i``).
    ahead, bounds : numpy.ndarray
        The window's ids back to back and each batch's bounds.
    """

    ids: np.ndarray
    store: np.ndarray
    slot: np.ndarray
    missing: np.ndarray
    missed: np.ndarray
    out: torch.Tensor
    out_rows: np.ndarray
    at: np.ndarray | None
    ahead: np.ndarray
    bounds: np.ndarray
    found: np.ndarray
    #: Window rows brought along into staging, and their slots.
    taken: np.ndarray = field(default_factory=lambda: _EMPTY)
    slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: Waits for the reads (raises what they raised).
    wait: Callable[[], None] = _nothing
    #: The policy's choice has been applied to the tables.
    decided: bool = False
    #: Rows evicted and admitted per store (counters).
    freed: np.ndarray | None = None
    inserted: np.ndarray | None = None
    #: Admitted rows: positions in ``out_rows``, their store and slot.
    admit_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    admit_store: np.ndarray = field(default_factory=lambda: _EMPTY)
    admit_slot: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: What `undo` needs to put the tables back.
    before: dict = field(default_factory=dict)
    seconds: float = 0.0


class PendingRead:
    """Rows `FeatureCache.submit` started to read.

    Parameters
    ----------
    cache : FeatureCache
        The cache read through.
    batch : InFlight or None
        The compiled engine's batch; None when ``rows`` were read at once.
    rows : torch.Tensor, optional
        The rows, read already.
    """

    def __init__(self, cache, batch: InFlight | None, rows=None):
        self.cache = cache
        self._batch = batch
        self._rows = rows

    def result(self) -> torch.Tensor:
        """The rows, in request order (finishing the read if no later
        `submit` did)."""
        if self._rows is None:
            with self.cache._lock:
                self._rows = self.cache._compiled.result(self._batch)
            self._batch = None
        return self._rows


def dynamic_choice(reader, batch: InFlight):
    """The hmgraph policy's choice for ``batch`` (nothing applied): evict
    ids, admit positions, the held ids after the step."""
    policy = reader.policy
    hit = (batch.store >= 0) & (batch.store < len(reader.stores))
    return engine.choose_dynamic(
        batch.ids, hit, policy._held.numpy(), batch.ahead, batch.bounds,
        policy.window, policy.next_use.numpy(), policy.cold_rank.numpy(),
        np.iinfo(np.int32).max, policy.capacity - policy.static_rows,
        policy.num_rows)


def stepped_choice(reader, batch: InFlight) -> None:
    """A `STEPPED` policy's choice, once ``batch``'s reads succeeded,
    taken as the reference takes it (the unique ids in id order), then
    applied to the tables (`place`)."""
    ids = batch.ids
    order = engine.argsort(ids, reader.cache.num_rows)
    asked = ids[order]
    step = reader.policy.step(torch.from_numpy(asked))
    served = ((batch.store >= 0) & (batch.store < len(reader.stores)))[order]
    if not np.array_equal(served, step.hit.numpy()):
        raise RuntimeError(
            f"cache corrupt: the {reader.policy.name} policy and its stores "
            f"disagree on {int((served != step.hit.numpy()).sum())} rows")
    admit = order[np.searchsorted(asked, step.admit.numpy())]
    place(reader, batch, step.evict.numpy(), admit)


def apply_tables(reader, batch: InFlight, decided) -> None:
    """Apply the hmgraph policy's choice (evict ids, admit positions, the
    held ids after the step) to ``reader``'s tables: evictions, then the
    admitted rows' slots; the rows themselves are copied once read
    (`engine.copy_admitted`). What it changes is kept in
    ``batch.before`` for `undo`."""
    policy = reader.policy
    evict, admit, held = decided
    num_free = np.array([s.num_free for s in reader.stores], np.int64)
    batch.before = {
        "num_free": num_free.copy(),
        "pushed": [free[n:n + len(evict)].copy()
                   for free, n in zip(reader.free, num_free, strict=True)],
        "evict": evict, "evict_slot": reader.table[evict].copy(),
        "evict_resident": reader.resident[evict].copy()
        if reader.layered else None,
        "held": policy._held, "size": policy._size}
    place(reader, batch, evict, admit)
    policy._held = torch.from_numpy(held)
    policy._size += len(admit) - len(evict)


def place(reader, batch: InFlight, evict, admit) -> None:
    """The tables' part of a choice: ``evict`` (ids) out of their slots,
    then the ids at positions ``admit`` of the batch into free ones, in
    order (`engine.evict_ids`, `engine.insert_slots`); the slots go to
    ``batch`` for `engine.copy_admitted`. With ``batch.before`` set, the
    admitted ids and their residency are kept there for `undo`."""
    ids = batch.ids
    if batch.at is not None:  # ids and positions of the output's rows
        by_row = np.zeros(len(batch.out_rows), dtype=np.int64)
        by_row[batch.at] = ids
        ids, admit = by_row, batch.at[admit]
    num_free = np.array([s.num_free for s in reader.stores], np.int64)
    batch.freed = engine.evict_ids(evict, reader.table, reader.low,
                                   reader.high, reader.id_of, reader.free,
                                   num_free, reader.resident)
    batch.admit_store = np.empty(len(admit), dtype=np.int64)
    batch.admit_slot = np.empty(len(admit), dtype=np.int64)
    admitted = ids[admit]
    if batch.before:
        batch.before["admit_resident"] = reader.resident[admitted].copy() \
            if reader.layered else None
    batch.inserted = engine.insert_slots(
        ids, admit, reader.table, reader.low, reader.id_of, reader.free,
        num_free, reader.resident, batch.admit_store, batch.admit_slot)
    taken = int(batch.inserted.sum())
    batch.admit_rows = admit[:taken]
    batch.admit_store = batch.admit_store[:taken]
    batch.admit_slot = batch.admit_slot[:taken]
    if batch.before:
        batch.before["admitted"] = admitted[:taken]
    for number, store_ in enumerate(reader.stores):
        store_.num_free = int(num_free[number])


def undo(reader, batch: InFlight) -> None:
    """Put the tables back as they were before ``batch`` applied its
    choice and took its staging slots (its reads failed)."""
    staging = reader.cache.staging
    if len(batch.taken):
        staging.slot_of[torch.from_numpy(batch.taken)] = -1
        staging.id_of[torch.from_numpy(batch.slots)] = -1
        staging.num_free += len(batch.taken)
    if not batch.decided or not batch.before:
        return
    before = batch.before
    admitted = before["admitted"]
    reader.table[admitted] = -1
    for number, id_of in enumerate(reader.id_of):
        mine = batch.admit_store == number
        id_of[batch.admit_slot[mine]] = -1
    evict, slots = before["evict"], before["evict_slot"]
    if reader.layered:
        reader.resident[admitted] = before["admit_resident"]
        reader.resident[evict] = before["evict_resident"]
    reader.table[evict] = slots
    for number, (id_of, free) in enumerate(
            zip(reader.id_of, reader.free, strict=True)):
        inside = (slots >= reader.low[number]) & \
            (slots < reader.high[number])
        id_of[slots[inside] - reader.low[number]] = evict[inside]
        start = int(before["num_free"][number])
        pushed = before["pushed"][number]
        free[start:start + len(pushed)] = pushed
        reader.stores[number].num_free = start
    reader.policy._held = before["held"]
    reader.policy._size = before["size"]

"""A `FeatureCache` read through the compiled engine (`engine.py`).

`CompiledRead` takes the same decisions as `FeatureCache`'s reference read
(``engine="torch"``) and returns the same rows and counters, with each
pass one compiled loop over the batch in request order. A batch is read
in five phases (the state between them: `hmgraph.cache.inflight.InFlight`):

1. look up: every id's store and slot (the layer's table, then
   staging's), the misses sorted into file order, the window marked;
2. start: the staged hits copied into the output, staged rows no longer
   needed let go, the window's rows that lie on the blocks read anyway
   chosen; the misses' reads (into their places in the output:
   `CompiledRead.read_into` writes rows of the caller's tensor, batch
   reuse's batch) and those rows' (into staging) started in one plan of
   the storage tier, on its threads;
3. apply, beside the reads: the hits copied into the output, the policy's
   choice (the hmgraph policy's dynamic region; static policies hold
   still) applied to the tables;
4. wait for the reads; a failed read puts the tables back and raises;
5. finish: the admitted rows copied into their slots, counters.

`read` runs them one after the other. `submit` interleaves two batches
(see there): the disk reads one batch while the CPU looks up the next and
copies the last one's admitted rows, with the same rows, decisions and
counters.

It serves caches on the CPU with at most one layer whose stores share one
id -> slot table (``hmgraph`` and the static policies, or no layer), and
one layer of ``lru`` or ``clock`` (`inflight.STEPPED`: their own torch
step once the reads succeed, a batch at a time; the engine does the
rest); on a GPU see `hmgraph.cache.ondevice`, the others read through
the reference.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hmgraph.cache import engine, reuse_engine
from hmgraph.cache.buffers import BufferPool
from hmgraph.cache.disk import read_plan
from hmgraph.cache.inflight import (
    STEPPED,
    InFlight,
    apply_tables,
    dynamic_choice,
    stepped_choice,
    undo,
)
from hmgraph.cache.policies import HMGraphPolicy, StaticPolicy

__all__ = ["CompiledRead", "each_once", "supports"]

_EMPTY = np.zeros(0, dtype=np.int64)
_TICK_WRAP = 2**31 - 2


def supports(cache) -> bool:
    """Whether ``cache`` (a `FeatureCache`) can read through the engine."""
    if cache.device.type != "cpu" or len(cache.layers) > 1:
        return False
    if cache.layers:
        layer = cache.layers[0]
        policy = layer.policy
        if not isinstance(policy, STEPPED + (StaticPolicy,)) and \
                type(policy) is not HMGraphPolicy:
            return False
        tables = {store.slot_of.data_ptr() for store in layer.stores}
        if len(tables) != 1 or any(s.device.type != "cpu"
                                   for s in layer.stores):
            return False
    if cache.staging is not None and \
            not hasattr(cache.source, "read_into_later"):
        return False
    return True


def each_once(read, ids: torch.Tensor) -> torch.Tensor:
    """``read(ids)``; where it answers None (an id is asked twice), the
    rows of the unique ids, read once each, repeated into request
    order."""
    out = read(ids)
    if out is not None:
        return out
    unique, inverse = np.unique(ids.numpy(), return_inverse=True)
    return read(torch.from_numpy(unique)).index_select(
        0, torch.from_numpy(inverse))


class CompiledRead:
    """The compiled engine's view of one `FeatureCache` (see module)."""

    def __init__(self, cache):
        self.cache = cache
        layer = cache.layers[0] if cache.layers else None
        self.policy = layer.policy if layer is not None else None
        self.stores = list(layer.stores) if layer is not None else []
        stores = self.stores
        self.table = stores[0].slot_of.numpy() if stores else \
            np.zeros(0, dtype=np.int32)
        self.low = np.array([s.offset for s in stores], dtype=np.int64)
        self.high = self.low + np.array([s.capacity for s in stores],
                                        dtype=np.int64)
        self.buffers = tuple(engine.byte_rows(s.buffer) for s in stores)
        self.id_of = tuple(s.id_of.numpy() for s in stores)
        self.free = tuple(s.free.numpy() for s in stores)
        staging = cache.staging
        seen = [s.seen.numpy() for s in stores]
        everything = list(self.buffers)
        if staging is not None:
            seen.append(staging.seen.numpy())
            everything.append(engine.byte_rows(staging.buffer))
        self.seen = tuple(seen)
        self.all_buffers = tuple(everything)
        self.resident = self.policy.resident.numpy() \
            if self.policy is not None and self.policy.resident.numel() \
            else np.zeros(1, dtype=np.bool_)
        self.layered = self.policy is not None and \
            self.policy.resident.numel() > 0
        self.stepped = isinstance(self.policy, STEPPED)
        self.marked = _EMPTY
        self.tick = 0
        #: The batch `submit` started and no later call finished.
        self.inflight: InFlight | None = None
        self.pool = BufferPool(cache.row_shape, cache.dtype)
        self._warm()

    def _warm(self) -> None:
        """Load (or compile, the first time on a machine) every kernel for
        this cache's types now, at construction, not in the first batch:
        an empty read through each of them, with nothing counted."""
        none = np.zeros(0, dtype=np.int64)
        nothing = engine.byte_rows(torch.empty(
            (0, *self.cache.row_shape), dtype=self.cache.dtype))
        store, slot, _ = self._find(none)
        if self.all_buffers:
            engine.gather(store, slot, self.all_buffers, nothing)
            engine.gather(store, slot, self.all_buffers, nothing, 0,
                          len(self.all_buffers))
            reuse_engine.gather_at(store, slot, self.all_buffers, nothing,
                                   none, 0, len(self.all_buffers))
        engine.argsort(none, self.cache.num_rows)
        staging = self.cache.staging
        if staging is not None:
            engine.mark_window(self.cache._marks.numpy(), none, none,
                               np.zeros(1, np.int64))
        if self.stepped or type(self.policy) is HMGraphPolicy:
            counts = np.array([s.num_free for s in self.stores], np.int64)
            engine.evict_ids(none, self.table, self.low, self.high,
                             self.id_of, self.free, counts, self.resident)
            engine.insert_slots(none, none, self.table, self.low,
                                self.id_of, self.free, counts, self.resident,
                                none, none)
            engine.copy_admitted(nothing, none, self.buffers, none, none)
        if type(self.policy) is HMGraphPolicy:
            policy = self.policy
            engine.choose_dynamic(
                none, np.zeros(0, np.bool_), none, none,
                np.zeros(1, np.int64), policy.window,
                policy.next_use.numpy(), policy.cold_rank.numpy(),
                np.iinfo(np.int32).max, 0, policy.num_rows)

    def _stamp(self) -> int:
        self.tick += 1
        if self.tick >= _TICK_WRAP:
            for seen in self.seen:
                seen.fill(0)
            self.tick = 1
        return self.tick

    def _find(self, ids: np.ndarray, staged: bool = True):
        """Store (-1: none; staging after the layer's stores, unless not
        ``staged``) and slot of every id, and the repeats per store."""
        store = np.full(len(ids), -1, dtype=np.int8)
        slot = np.empty(len(ids), dtype=np.int64)
        if self.stores:
            engine.lookup(ids, self.table, self.low, self.high, 0, store,
                          slot)
        staging = self.cache.staging if staged else None
        if staging is not None:
            engine.lookup(ids, staging.slot_of.numpy(),
                          np.zeros(1, np.int64),
                          np.array([staging.capacity], np.int64),
                          len(self.stores), store, slot)
        seen = self.seen if staged else self.seen[:len(self.stores)]
        repeats = engine.count_repeats(store, slot, seen, self._stamp()) \
            if seen else np.zeros(0, dtype=np.int64)
        return store, slot, repeats

    def _misses(self, ids: np.ndarray, store: np.ndarray):
        """Positions of the ids no store holds and those ids, in file
        order; None when one of them is asked twice."""
        missing = np.flatnonzero(store < 0)
        missing = missing[engine.argsort(ids[missing], self.cache.num_rows)]
        missed = ids[missing]
        if len(missed) > 1 and bool((missed[1:] == missed[:-1]).any()):
            return None
        return missing, missed

    def gather_held(self, ids: torch.Tensor, stats) -> torch.Tensor:
        """`FeatureCache._gather_held`: a complete cache's rows, in request
        order, repeats gathered twice but counted once."""
        cache = self.cache
        self.drain()
        start = time.perf_counter()
        ids_np = ids.numpy()
        store, slot, repeats = self._find(ids_np)
        out = self.pool.empty(len(ids_np))
        counts = engine.gather(store, slot, self.all_buffers,
                               engine.byte_rows(out)) - repeats
        asked = int(counts.sum())  # each row counted once
        for store_, rows in zip(self.stores, counts, strict=False):
            cache._count_hits(store_.name, int(rows), stats)
        cache._count_hits("source", 0, stats)
        _add(stats.bytes, "storage->host", 0)
        stats.requests += 1
        stats.rows_requested += asked
        stats.seconds += time.perf_counter() - start
        return out

    def frozen_read(self, ids: torch.Tensor, stats) -> torch.Tensor | None:
        """`FrozenView`'s read: rows of unique ``ids`` from the layer's
        stores (not staging) and the source, nothing decided or moved,
        counted in ``stats``; None when an id repeats."""
        cache = self.cache
        self.drain()
        start = time.perf_counter()
        ids_np = ids.numpy()
        store, slot, repeats = self._find(ids_np, staged=False)
        misses = None if repeats.any() else self._misses(ids_np, store)
        if misses is None:
            return None
        missing, missed = misses
        out = self.pool.empty(len(ids_np))
        out_rows = engine.byte_rows(out)
        found = engine.gather(store, slot, self.buffers, out_rows) \
            if self.buffers else np.zeros(0, dtype=np.int64)
        if len(missed):
            self._start_source(missed, missing, out, out_rows, _EMPTY)[0]()
            _add(stats.bytes, "storage->host", cache.row_bytes * len(missed))
        for number, store_ in enumerate(self.stores):
            if found[number]:
                _add(stats.hits, store_.name, int(found[number]))
        _add(stats.hits, "source", len(missed))
        stats.requests += 1
        stats.rows_requested += len(ids_np)
        stats.seconds += time.perf_counter() - start
        return out

    def read(self, ids: torch.Tensor, future) -> torch.Tensor | None:
        """Rows of unique ``ids`` through the cache; None when an id
        repeats (the caller then reads the unique ids)."""
        return self._read_to(ids, future, None, None)

    def read_into(self, ids: torch.Tensor, future, out: torch.Tensor,
                  at: np.ndarray) -> bool:
        """`read`, the rows written into rows ``at`` (int64, one per id,
        in range: not checked here) of ``out`` instead of a buffer of
        their own; the same decisions and counters. False when an id
        repeats (nothing read, moved or counted)."""
        return self._read_to(ids, future, out, at) is not None

    def _read_to(self, ids, future, out, at):
        """`read` (``out`` None: into a buffer of the pool) or `read_into`
        (row ``i`` into ``out[at[i]]``); the rows' tensor, or None when an
        id repeats. Every phase of one batch, one after the other."""
        self.drain()
        batch = self._look_up(ids.numpy(), future, out, at)
        if batch is None:
            return None
        self._start(batch)
        self._apply(batch)
        self._wait(batch)
        self._finish(batch)
        return batch.out

    def submit(self, ids: torch.Tensor, future) -> InFlight | None:
        """Start reading the rows of unique ``ids`` and finish the batch
        submitted before (see `result`); None when an id repeats (the
        batch before is finished, nothing of this one is read).

        The phases interleave so that the disk works while the CPU does:
        this batch is looked up while the previous batch's reads run
        (the previous one's choice is already in the tables); once those
        reads end, this batch's reads start, and the previous batch's
        admitted rows are copied into the stores beside them. Every
        phase sees the state it would see if the batches were read one
        after the other: the same rows, decisions and counters.
        """
        if self.stepped:  # its choice follows the reads: none overlap
            self.drain()
        previous = self.inflight
        if previous is not None and not previous.decided:
            self._apply(previous)
        batch = self._look_up(ids.numpy(), future, None, None)
        if batch is None:
            self.drain()
            return None
        if previous is not None:
            self.inflight = None
            self._wait(previous)
        try:
            self._start(batch)
        finally:
            if previous is not None:
                self._finish(previous)
        self.inflight = batch
        return batch

    def result(self, batch: InFlight) -> torch.Tensor:
        """The rows of a batch `submit` started (finishing it now if no
        later batch did)."""
        if batch is self.inflight:
            self.drain()
        return batch.out

    def drain(self) -> None:
        """Finish the batch in flight, if any."""
        batch, self.inflight = self.inflight, None
        if batch is None:
            return
        if not batch.decided:
            self._apply(batch)
        self._wait(batch)
        self._finish(batch)

    def _look_up(self, ids, future, out, at) -> InFlight | None:
        """Phase 1: every id's store and slot, the misses in file order,
        the window's marks; None when an id repeats."""
        start = time.perf_counter()
        store, slot, repeats = self._find(ids)
        misses = None if repeats.any() else self._misses(ids, store)
        if misses is None:
            return None
        if out is None:
            out = self.pool.empty(len(ids))
        ahead, bounds = engine.back_to_back(future)
        staging = self.cache.staging
        if staging is not None:
            engine.mark_window(self.cache._marks.numpy(), self.marked,
                               ahead, bounds)
            self.marked = ahead
        return InFlight(ids, store, slot, *misses, out,
                        engine.byte_rows(out), at, ahead, bounds,
                        np.zeros(len(self.all_buffers), dtype=np.int64),
                        seconds=time.perf_counter() - start)

    def _start(self, batch: InFlight) -> None:
        """Phase 2: the staged hits copied (their slots may be let go and
        refilled now), staged rows no longer needed let go, rows brought
        along chosen; the misses' reads started (into the output) with
        those rows' (into staging slots, which are taken now)."""
        begin = time.perf_counter()
        cache, layered = self.cache, len(self.stores)
        staging = cache.staging
        if staging is not None:
            batch.found += self._gather(batch, layered, layered + 1)
            if staging.size:
                freed, staging.num_free = engine.unstage(
                    staging.id_of.numpy(), staging.slot_of.numpy(),
                    staging.free.numpy(), staging.num_free,
                    cache._marks.numpy(), self.resident, self.layered)
                _add(cache.stats.evicted, "staged", freed)
            if len(batch.missed) and len(batch.bounds) > 1 and \
                    staging.num_free:
                batch.taken = self._along(batch.missed, batch.ahead,
                                          batch.bounds, staging.num_free)
        missing = batch.missing if batch.at is None else \
            batch.at[batch.missing]
        batch.wait, batch.slots = self._start_source(
            batch.missed, missing, batch.out, batch.out_rows, batch.taken)
        if len(batch.taken):
            staging.num_free -= len(batch.taken)
            staging.slot_of[torch.from_numpy(batch.taken)] = \
                torch.from_numpy(batch.slots + staging.offset).to(
                    staging.slot_of.dtype)
            staging.id_of[torch.from_numpy(batch.slots)] = \
                torch.from_numpy(batch.taken)
        batch.seconds += time.perf_counter() - begin

    def _apply(self, batch: InFlight) -> None:
        """Phase 3, beside the reads: the hits copied into the output, the
        policy's choice taken and applied to the tables (the admitted
        rows follow in `_finish`, once read)."""
        begin = time.perf_counter()
        if self.stores:
            batch.found += self._gather(batch, 0, len(self.stores))
        if type(self.policy) is HMGraphPolicy:
            apply_tables(self, batch, dynamic_choice(self, batch))
        batch.decided = True
        batch.seconds += time.perf_counter() - begin

    def _wait(self, batch: InFlight) -> None:
        """Phase 4: wait for the reads; if they failed, put the tables
        back (`inflight.undo`) and raise."""
        begin = time.perf_counter()
        try:
            batch.wait()
        except BaseException:
            undo(self, batch)
            raise
        batch.seconds += time.perf_counter() - begin

    def _finish(self, batch: InFlight) -> None:
        """Phase 5: the admitted rows into their slots; counters."""
        begin = time.perf_counter()
        cache = self.cache
        if self.stepped:
            stepped_choice(self, batch)
        if len(batch.admit_rows):
            engine.copy_admitted(batch.out_rows, batch.admit_rows,
                                 self.buffers, batch.admit_store,
                                 batch.admit_slot)
        for number, store_ in enumerate(self.stores):
            freed = 0 if batch.freed is None else int(batch.freed[number])
            _add(cache.stats.evicted, store_.name, freed)
            if batch.inserted is not None and batch.inserted[number]:
                _add(cache.stats.admitted, store_.name,
                     int(batch.inserted[number]))
        if len(batch.taken):
            _add(cache.stats.admitted, "staged", len(batch.taken))
            _add(cache.stats.bytes, "storage->host",
                 cache.row_bytes * len(batch.taken))
        found = batch.found
        for number, store_ in enumerate(self.stores):
            if found[number]:
                cache._count_hits(store_.name, int(found[number]))
        if cache.staging is not None and found[-1]:
            cache._count_hits("staged", int(found[-1]))
        cache._count_hits("source", len(batch.missed))
        _add(cache.stats.bytes, "storage->host",
             cache.row_bytes * len(batch.missed))
        cache.stats.requests += 1
        cache.stats.rows_requested += len(batch.ids)
        cache.stats.seconds += batch.seconds + time.perf_counter() - begin

    def _gather(self, batch: InFlight, first: int, stop: int):
        """`engine.gather` of the stores ``first`` to ``stop`` into the
        batch's output (into its rows ``at`` where given)."""
        if batch.at is None:
            return engine.gather(batch.store, batch.slot, self.all_buffers,
                                 batch.out_rows, first, stop)
        return reuse_engine.gather_at(batch.store, batch.slot,
                                      self.all_buffers, batch.out_rows,
                                      batch.at, first, stop)

    def _along(self, missed, ahead, bounds, limit) -> np.ndarray:
        """Window rows on the blocks the misses' reads cover."""
        source = self.cache.source
        row_bytes, offset, block = source.geometry
        plan = read_plan(missed, row_bytes, offset, block,
                         source.max_gap_blocks)
        return engine.select_along(
            ahead, bounds, self.cache._marks.numpy(), self.resident,
            self.layered, self.cache.staging.slot_of.numpy(), missed,
            plan.run_first, plan.run_last, row_bytes, offset, block, limit,
            self.cache.num_rows)

    def _start_source(self, missed, missing, out, out_rows, taken):
        """Start reading the misses into rows ``missing`` of the output
        (and rows brought along, into the staging slots
        `SlotStore.insert` would give them: the top of the free stack);
        return the function that waits, and those slots."""
        cache = self.cache
        source = cache.source
        if not len(missed):
            return _nothing, _EMPTY
        if not hasattr(source, "read_into_later"):  # rows in memory
            rows = source.read(torch.from_numpy(missed))
            out[torch.from_numpy(missing)] = rows.to(out.device)
            return _nothing, _EMPTY
        if not len(taken):
            return source.read_into_later(
                missed, (out_rows,), np.zeros(len(missed), np.int64),
                missing), _EMPTY
        staging = cache.staging
        slots = staging.free[staging.num_free - len(taken):
                             staging.num_free].numpy().copy()
        union = np.concatenate([missed, taken])
        order = engine.argsort(union, cache.num_rows)
        which = np.concatenate([np.zeros(len(missed), np.int64),
                                np.ones(len(taken), np.int64)])[order]
        where = np.concatenate([missing, slots])[order]
        return source.read_into_later(
            union[order], (out_rows, engine.byte_rows(staging.buffer)),
            which, where), slots


def _nothing() -> None:
    """Nothing to wait for."""


def _add(counter: dict, key: str, value: int) -> None:
    counter[key] = counter.get(key, 0) + int(value)

"""A `FeatureCache` read through the compiled engine (`engine.py`).

`CompiledRead` takes the same decisions as `FeatureCache`'s reference read
(``engine="torch"``) and returns the same rows and counters, with each
pass one compiled loop over the batch in request order:

1. find every id's store and slot (the layer's table, then staging's) and
   copy the rows held straight into the output;
2. sort the misses (file order), mark the window, drop staged rows no
   longer needed, choose the window's rows that lie on the blocks read
   anyway;
3. read misses into their places in the output (`CompiledRead.read_into`:
   rows of the caller's tensor, batch reuse's batch), and rows brought along
   into their staging slots, in one plan of the storage tier, on its
   threads; meanwhile copy the hits into the output and let the policy
   decide (the hmgraph policy's dynamic region; static policies hold
   still);
4. once the reads succeeded, apply evictions then admissions.

It serves caches on the CPU with at most one layer whose stores share one
id -> slot table (``hmgraph`` and the static policies, or no layer); the
others (``lru``, ``clock``, stores on a GPU) read through the reference.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hmgraph.cache import engine, reuse_engine
from hmgraph.cache.buffers import BufferPool
from hmgraph.cache.disk import read_plan
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
        if not isinstance(policy, StaticPolicy) and \
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


def _future(future) -> tuple[np.ndarray, np.ndarray]:
    """The window's ids back to back, and each batch's bounds."""
    parts = [f.numpy() for f in future]
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    bounds[1:] = np.cumsum([len(p) for p in parts])
    ids = np.concatenate(parts) if parts else _EMPTY
    return ids.astype(np.int64, copy=False), bounds


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
        self.marked = _EMPTY
        self.tick = 0
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
        if type(self.policy) is HMGraphPolicy:
            policy = self.policy
            engine.choose_dynamic(
                none, np.zeros(0, np.bool_), none, none,
                np.zeros(1, np.int64), policy.window,
                policy.next_use.numpy(), policy.cold_rank.numpy(),
                np.iinfo(np.int32).max, 0, policy.num_rows)
            counts = np.array([s.num_free for s in self.stores], np.int64)
            engine.evict_ids(none, self.table, self.low, self.high,
                             self.id_of, self.free, counts, self.resident)
            engine.insert_rows(none, none, nothing, self.table, self.low,
                               self.id_of, self.free, counts, self.buffers,
                               self.resident)

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

    def _gather(self, store, slot, out_rows, at, first, stop):
        """`engine.gather` of the stores ``first`` to ``stop``, into rows
        ``at`` of ``out_rows`` where ``at`` is given."""
        if at is None:
            return engine.gather(store, slot, self.all_buffers, out_rows,
                                 first, stop)
        return reuse_engine.gather_at(store, slot, self.all_buffers,
                                      out_rows, at, first, stop)

    def _read_to(self, ids, future, out, at):
        """`read` (``out`` None: into a buffer of the pool) or `read_into`
        (row ``i`` into ``out[at[i]]``); the rows' tensor, or None when an
        id repeats."""
        cache = self.cache
        start = time.perf_counter()
        ids_np = ids.numpy()
        count = len(ids_np)
        # (1) Where each id is held; the misses in file order.
        store, slot, repeats = self._find(ids_np)
        misses = None if repeats.any() else self._misses(ids_np, store)
        if misses is None:
            return None
        missing, missed = misses
        if out is None:
            out = self.pool.empty(count)
        out_rows = engine.byte_rows(out)
        layered = len(self.stores)
        found = np.zeros(len(self.all_buffers), dtype=np.int64)
        # (2) The window: the staged hits copied (their slots may be let
        # go and refilled now), marks, staged rows let go, rows brought
        # along.
        ahead, bounds = _future(future)
        taken = _EMPTY
        staging = cache.staging
        if staging is not None:
            found += self._gather(store, slot, out_rows, at, layered,
                                  layered + 1)
            engine.mark_window(cache._marks.numpy(), self.marked, ahead,
                               bounds)
            self.marked = ahead
            if staging.size:
                freed, staging.num_free = engine.unstage(
                    staging.id_of.numpy(), staging.slot_of.numpy(),
                    staging.free.numpy(), staging.num_free,
                    cache._marks.numpy(), self.resident, self.layered)
                _add(cache.stats.evicted, "staged", freed)
            if len(missed) and len(future) and staging.num_free:
                taken = self._along(missed, ahead, bounds, staging.num_free)
        # (3) Misses into the output and rows brought along into staging,
        # on the storage tier's threads; meanwhile the hits are copied
        # (other rows of the output) and the policy decides. Nothing is
        # applied before the reads succeed: a failed read leaves no trace.
        wait, slots = self._start_source(
            missed, missing if at is None else at[missing], out, out_rows,
            taken)
        try:
            if layered:
                found += self._gather(store, slot, out_rows, at, 0, layered)
            decided = self._decide(ids_np, store, ahead, bounds)
        finally:
            wait()
        if len(taken):
            self._stage(taken, slots)
        # (4) Evictions, then admissions; counters.
        if self.policy is not None:
            self._apply(ids_np, decided, out_rows, at)
        for number, store_ in enumerate(self.stores):
            if found[number]:
                cache._count_hits(store_.name, int(found[number]))
        if staging is not None and found[-1]:
            cache._count_hits("staged", int(found[-1]))
        cache._count_hits("source", len(missed))
        _add(cache.stats.bytes, "storage->host",
             cache.row_bytes * len(missed))
        cache.stats.requests += 1
        cache.stats.rows_requested += count
        cache.stats.seconds += time.perf_counter() - start
        return out

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

    def _stage(self, taken, slots) -> None:
        """The rows brought along now sit in their staging slots."""
        cache = self.cache
        staging = cache.staging
        staging.num_free -= len(taken)
        staging.slot_of[torch.from_numpy(taken)] = torch.from_numpy(
            slots + staging.offset).to(staging.slot_of.dtype)
        staging.id_of[torch.from_numpy(slots)] = torch.from_numpy(taken)
        _add(cache.stats.admitted, "staged", len(taken))
        _add(cache.stats.bytes, "storage->host", cache.row_bytes * len(taken))

    def _decide(self, ids, store, ahead, bounds):
        """The hmgraph policy's choice for this batch (nothing applied);
        None for static policies, which hold still."""
        policy = self.policy
        if type(policy) is not HMGraphPolicy:
            return None
        hit = (store >= 0) & (store < len(self.stores))
        return engine.choose_dynamic(
            ids, hit, policy._held.numpy(), ahead, bounds, policy.window,
            policy.next_use.numpy(), policy.cold_rank.numpy(),
            np.iinfo(np.int32).max, policy.capacity - policy.static_rows,
            policy.num_rows)

    def _apply(self, ids, decided, out_rows, at=None) -> None:
        """Apply the policy's choice to the stores: evictions, then
        admissions (rows from the output, id ``i``'s at row ``at[i]``
        where ``at`` is given); counters."""
        cache, policy = self.cache, self.policy
        if decided is None:  # static: nothing moves
            for store_ in self.stores:
                _add(cache.stats.evicted, store_.name, 0)
            return
        evict, admit, held = decided
        if at is not None:  # ids and positions of the output's rows
            by_row = np.zeros(len(out_rows), dtype=np.int64)
            by_row[at] = ids
            ids, admit = by_row, at[admit]
        num_free = np.array([s.num_free for s in self.stores], np.int64)
        freed = engine.evict_ids(evict, self.table, self.low, self.high,
                                 self.id_of, self.free, num_free,
                                 self.resident)
        inserted = engine.insert_rows(
            ids, admit, out_rows, self.table, self.low, self.id_of,
            self.free, num_free, self.buffers, self.resident)
        for number, store_ in enumerate(self.stores):
            store_.num_free = int(num_free[number])
            _add(cache.stats.evicted, store_.name, int(freed[number]))
            if inserted[number]:
                _add(cache.stats.admitted, store_.name, int(inserted[number]))
        policy._held = torch.from_numpy(held)
        policy._size += len(admit) - len(evict)


def _nothing() -> None:
    """Nothing to wait for."""


def _add(counter: dict, key: str, value: int) -> None:
    counter[key] = counter.get(key, 0) + int(value)

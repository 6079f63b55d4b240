"""Feature caches: policies applied to slot stores over a source tier.

A `FeatureCache` is a `Feature` that answers reads from cache layers before
its source (the storage tier, or rows in memory). Each `Layer` pairs one
policy with one or more slot stores:

* the coordinated HMGraph cache is **one** layer whose policy spans the
  device and the host store together, so a row lives in at most one of
  them (exclusive); static rows go to the device first, admitted rows to
  whichever store has a free slot, device first;
* the static peers (``degree``, ``presample``) are one layer too: the top
  rows, the very top on the device;
* the dynamic peers (``lru``, ``clock``) are a device layer stacked over a
  host layer, each with its own policy, as systems without coordination
  run them.

Lookups resolve layer by layer in vectorised steps; misses of the last
layer are read from the source in one call. A cache whose policies pin
every row (a host budget as large as the file) is **complete**: nothing
can miss or move, so reads gather rows straight into request order, one
copy per store, with no policy step (`FeatureCache.complete`).

**Window read planning.** Over a storage tier, the lookahead window also
plans reads: the disk reads whole blocks (and short gaps), so rows the
next batches need often sit on blocks this batch reads anyway. The cache
asks the tier for them too (`StorageFeature.read_along`) and keeps them in
a host **staging** store, charged to the host budget, until the batch that
needs them; a block is then read once per window instead of once per
batch. Staged rows never enter the policy's tiers: they serve one window
and are dropped when no batch in the window needs them any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from hmgraph.cache import compiled, ondevice
from hmgraph.cache.counters import CacheStats, add_count
from hmgraph.cache.feature import (
    Feature,
    check_ids,
    request_rows,
    unique_sorted,
)
from hmgraph.cache.frozen import FrozenView
from hmgraph.cache.inflight import PendingRead
from hmgraph.cache.layer import Layer
from hmgraph.cache.policy_base import storage_bytes
from hmgraph.cache.slots import SlotStore

__all__ = ["ENGINES", "MARK_BYTES", "CacheStats", "FeatureCache",
           "FrozenView", "Layer", "PendingRead"]

#: How a cache reads a batch: the compiled engine, the tensor code run by
#: the training device, or the tensor code run on the host (reference).
ENGINES = ("compiled", "device", "torch")

#: Host bytes per node of window read planning's marks (int8).
MARK_BYTES = 1


class FeatureCache(Feature):
    """Rows served from cache layers, misses read from ``source``.

    Parameters
    ----------
    source : Feature
        Where misses come from (e.g. the storage tier); rows on the CPU.
    layers : list of Layer
        Consulted in order; an id missed by one layer goes to the next.
    device : torch.device or str
        Where `read` returns rows (the training device).
    staging_rows : int
        Host rows for window read planning (0: off). Used when the source
        has ``read_along`` (the storage tier) and reads get ``future``.
    engine : str
        ``"compiled"`` (default): the compiled engine
        (`hmgraph.cache.compiled`) where it serves the layout (CPU
        stores, one layer of the ``hmgraph``, a static, the ``lru`` or
        the ``clock`` policy, or none), on a GPU the ``"device"`` engine
        (the tensor code below, run by the GPU: `hmgraph.cache.ondevice`)
        where it serves it;
        ``"torch"``: the tensor code, bookkeeping in host memory, the
        reference both are tested against. `engine` says which reads.

    Notes
    -----
    Static policies are filled at construction (rows read from the source
    in chunks). See `Feature.read`; `read` also takes ``future``, the
    unique ids of the batches ahead, for policies that look ahead.

    When the policies pin every row (`complete`), a read is one gather
    per store in request order: no policy steps (none could change
    anything), no reordering copy.
    """

    def __init__(self, source: Feature, layers: Sequence[Layer],
                 device="cpu", staging_rows: int = 0,
                 engine: str = "compiled"):
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; available: "
                             f"{', '.join(ENGINES)}")
        self.source = source
        self.layers = list(layers)
        self.num_rows = source.num_rows
        self.row_shape = source.row_shape
        self.dtype = source.dtype
        self.device = torch.device(device)
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self.staging = None
        if staging_rows and hasattr(source, "read_along"):
            self.staging = SlotStore(
                "staged", self.num_rows, self.row_shape, self.dtype,
                min(staging_rows, self.num_rows), "cpu",
                pin=self.device.type == "cuda")
            # Per row, batches until its next use in the window (or 0).
            self._marks = torch.zeros(self.num_rows, dtype=torch.int8)
            self._marked = None  # ids marked by the last window
        for layer in self.layers:
            layer.warm(source)
        self._complete = self._pinning_stores()
        #: ``"compiled"``, ``"device"`` or ``"torch"`` (see ``engine``).
        self.engine = ondevice.choose(self, engine)
        self._on_device = ondevice.OnDevice(self) \
            if self.engine == "device" else None
        # Misses from the source (the device engine reads them in place).
        self._read_source = self.source.read if self._on_device is None \
            else self._on_device.source_rows
        self.stats.metadata_bytes = self.metadata_nbytes()
        self._compiled = compiled.CompiledRead(self) \
            if self.engine == "compiled" else None

    @property
    def reads_source_in_place(self) -> bool:
        """Whether the GPU reads misses from the source's pinned rows."""
        return getattr(self._on_device, "source_view", None) is not None

    @property
    def complete(self) -> bool:
        """Whether the policies pin every row in a store: reads then
        never miss, and are served without the policies (`Notes`)."""
        return self._complete is not None

    def _pinning_stores(self) -> list[SlotStore] | None:
        """The stores, when together they hold every row for good."""
        if self.staging is not None or not self.layers:
            return None
        held = torch.zeros(self.num_rows, dtype=torch.bool)
        for layer in self.layers:
            pinned = layer.policy.pinned()
            for store in layer.stores:
                held[pinned[store.slots(pinned) >= 0]] = True
        return self.stores if bool(held.all()) else None

    def _gather_held(self, ids: torch.Tensor, stats: CacheStats
                     ) -> torch.Tensor:
        """Rows of ``ids`` from a complete cache's stores, counted in
        ``stats``: one gather per store, straight into request order
        unless an id repeats (each row is then gathered once)."""
        if self._compiled is not None:
            with self._lock:
                return self._compiled.gather_held(ids, stats)
        start = time.perf_counter()
        unique, inverse = unique_sorted(ids)
        repeats = inverse is not None and inverse.numel() > unique.numel()
        asked = unique if repeats else ids
        stores = self._complete
        if len(stores) == 1:
            store = stores[0]
            out = store.gather(store.slots(asked)).to(self.device)
            found = {store.name: asked.numel()}
        else:
            out = torch.empty((asked.numel(), *self.row_shape),
                              dtype=self.dtype, device=self.device)
            pending = torch.arange(asked.numel(), device=asked.device)
            found = {}
            for store in stores:
                slots = store.slots(asked[pending])
                held = slots >= 0
                out[pending[held].to(self.device)] = store.gather(
                    slots[held]).to(self.device)
                add_count(found, store.name, int(held.sum()))
                pending = pending[~held]
        for tier, rows in found.items():
            self._count_hits(tier, rows, stats)
        self._count_hits("source", 0, stats)
        add_count(stats.bytes, "storage->host", 0)
        stats.requests += 1
        stats.rows_requested += asked.numel()
        stats.seconds += time.perf_counter() - start
        return out.index_select(0, inverse.to(self.device)) if repeats \
            else out

    @property
    def stores(self) -> list[SlotStore]:
        """Every slot store, layer by layer."""
        return [store for layer in self.layers for store in layer.stores]

    def metadata_nbytes(self) -> dict[str, int]:
        """Bytes of bookkeeping allocated now, measured, per memory: every
        policy's state, every store's tables and the window's marks; what
        `hmgraph.cache.plan.metadata_bytes` charges to the host budget for
        the same layout (LRU's groups grow up to their charge as batches
        run). The ``device`` engine keeps it on a GPU."""
        stores = self.stores + [s for s in [self.staging] if s is not None]
        tables = [table for s in stores
                  for table in (s.slot_of, s.id_of, s.free, s.seen)]
        if self.staging is not None:
            tables.append(self._marks)
        total = storage_bytes(tables) + sum(
            layer.policy.metadata_nbytes() for layer in self.layers)
        where = "device" if self._on_device is not None and \
            self.device.type != "cpu" else "host"
        return {"host": 0, "device": 0, where: total}

    def held_bytes(self) -> dict[str, int]:
        """Bytes of row memory held per store name."""
        held: dict[str, int] = {}
        for store in self.stores:
            add_count(held, store.name, store.nbytes)
        if self.staging is not None:
            add_count(held, "staged", self.staging.nbytes)
        return held

    def static_on_device(self) -> torch.Tensor | None:
        """Which rows this cache serves from its device tier for good:
        the rows each layer's policy pins (`Policy.pinned`) held in a
        ``"device"`` store (on a CPU-only run the host tier shares the
        memory, but stays the host tier). A bool per row on ``device``,
        or None where there are none."""
        held = []
        for layer in self.layers:
            pinned = layer.policy.pinned()
            held += [pinned[store.slots(pinned) >= 0]
                     for store in layer.stores
                     if store.name == "device" and pinned.numel()]
        if not sum(ids.numel() for ids in held):
            return None
        mask = held[0].new_zeros(self.num_rows, dtype=torch.bool)
        mask[torch.cat(held)] = True
        return mask.to(self.device)

    def read(self, ids, future: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """See `Feature.read`.

        Parameters
        ----------
        future : sequence of torch.Tensor
            Unique ids of the next batches, nearest first; used by
            lookahead policies and ignored by the others.
        """
        return self._read(check_ids(ids, self.num_rows), future)

    def submit(self, ids, future: Sequence[torch.Tensor] = ()
               ) -> PendingRead:
        """Start reading the rows of ``ids``; `PendingRead.result` gives
        them: the same rows, decisions and counters as `read`.

        Through the compiled engine the read finishes when its result is
        asked or at the next `submit`, whichever comes first, so one
        batch's reads run while the next batch is looked up (see
        `hmgraph.cache.compiled.CompiledRead.submit`); elsewhere the rows
        are read now. Any other read finishes the batch in flight first.
        """
        ids = check_ids(ids, self.num_rows)
        if self.interleaves:
            with self._lock:
                batch = self._compiled.submit(ids, future)
            if batch is not None:
                return PendingRead(self, batch)
        return PendingRead(self, None, self._read(ids, future))

    @property
    def interleaves(self) -> bool:
        """Whether `submit` leaves a batch's read in flight (the compiled
        engine, unless the cache is `complete`)."""
        return self._compiled is not None and self._complete is None

    def _drain(self) -> None:
        """Finish the batch `submit` left in flight, if any."""
        if self._compiled is not None:
            with self._lock:
                self._compiled.drain()

    @property
    def reads_in_place(self) -> bool:
        """Whether `read_into` writes rows straight into the caller's
        tensor (the compiled engine, unless the cache is `complete`);
        else it reads them as `read` does and copies them there."""
        return self._compiled is not None and self._complete is None

    def read_into(self, ids, out: torch.Tensor, positions,
                  future: Sequence[torch.Tensor] = ()) -> None:
        """Rows of ``ids`` written into rows ``positions`` of ``out``.

        See `read`: the same rows, decisions and counters; the rows go
        to the caller's tensor instead of one of their own (where
        `reads_in_place`, with no copy of them).

        Parameters
        ----------
        ids : torch.Tensor or numpy.ndarray
            1-D ids, as `read` takes them.
        out : torch.Tensor
            CPU rows of this cache's row shape and dtype.
        positions : torch.Tensor or numpy.ndarray
            1-D int64: row ``positions[i]`` of ``out`` gets the row of
            ``ids[i]``; each in ``[0, len(out))``.
        future : sequence of torch.Tensor
            As `read`.
        """
        ids = check_ids(ids, self.num_rows)
        if not isinstance(out, torch.Tensor) or out.device.type != "cpu" \
                or out.dtype != self.dtype or \
                tuple(out.shape[1:]) != tuple(self.row_shape):
            raise ValueError(
                f"out must be a CPU tensor of {self.dtype} rows of shape "
                f"{tuple(self.row_shape)}, got {getattr(out, 'dtype', out)}"
                f" {tuple(getattr(out, 'shape', ()))}")
        at = np.asarray(positions)
        if at.dtype != np.int64 or at.shape != (ids.numel(),):
            raise ValueError(f"positions must be {ids.numel()} int64, got "
                             f"{at.dtype} {at.shape}")
        if at.size and (int(at.min()) < 0 or int(at.max()) >= len(out)):
            raise ValueError(f"positions must lie in [0, {len(out)}), got "
                             f"{int(at.min())}..{int(at.max())}")
        self._read_into(ids, out, at, future)

    def _read_into(self, ids, out, at, future) -> None:
        if self.reads_in_place:
            with self._lock:
                if self._compiled.read_into(ids, future, out, at):
                    return
        out[torch.from_numpy(at)] = self._read(ids, future).cpu()

    def _read(self, ids, future=()) -> torch.Tensor:
        if self._on_device is not None:
            ids, future = ids.to(self.device), self._on_device.window(future)
        if self._complete is not None:
            return self._gather_held(ids, self.stats)
        with self._lock:  # one read at a time: iterators may overlap
            if self._compiled is None:
                return self._read_locked(ids, future)
            return compiled.each_once(
                lambda asked: self._compiled.read(asked, future), ids)

    def _read_locked(self, ids, future) -> torch.Tensor:
        start = time.perf_counter()
        unique, out, where, inverse = request_rows(ids, self)
        pending = torch.arange(unique.numel(), device=unique.device)
        asked_per_layer, hits = [], {}
        # (1) Each layer serves what its stores hold. Nothing is decided
        # or counted yet: a failed source read must leave no trace.
        for layer in self.layers:
            asked = unique[pending]
            served = torch.zeros_like(asked, dtype=torch.bool)
            for store in layer.stores:
                slots = store.slots(asked)
                found = slots >= 0
                if found.any():
                    out[where(pending[found])] = store.gather(
                        slots[found]).to(self.device)
                    add_count(hits, store.name, int(found.sum()))
                    served |= found
            asked_per_layer.append((layer, asked, served))
            pending = pending[~served]
        # (2) Rows staged by earlier reads, then the source.
        if self.staging is not None and pending.numel():
            slots = self.staging.slots(unique[pending])
            found = slots >= 0
            if found.any():
                out[where(pending[found])] = self.staging.gather(
                    slots[found]).to(self.device)
                add_count(hits, "staged", int(found.sum()))
                pending = pending[~found]
        missed = unique[pending]
        along = None
        if self.staging is not None:
            self._mark_window(future)
            self._unstage()
        if missed.numel():
            if self.staging is not None and future and self.staging.num_free:
                candidates = self._candidates(unique, future)
                rows, *along = self.source.read_along(
                    missed, candidates, limit=self.staging.num_free,
                    rank=self._marks[candidates])
            else:
                rows = self._read_source(missed)
            out[where(pending)] = rows.to(self.device)
            del rows
        # (3) The read succeeded: the policies decide, evictions then
        # admissions are applied (rows are all in `out`), counters move.
        for layer, asked, served in asked_per_layer:
            step = layer.policy.step(asked, future)
            if not torch.equal(served, step.hit):
                raise RuntimeError(
                    f"cache corrupt: the {layer.policy.name} policy and "
                    f"its stores disagree on {int((served != step.hit).sum())}"
                    f" rows")
            self._apply(layer, step, unique, out, where)
        if along is not None and along[0].numel():
            self._stage(*along)
        for tier, rows in hits.items():
            self._count_hits(tier, rows)
        self._count_hits("source", missed.numel())
        add_count(self.stats.bytes, "storage->host",
             self.row_bytes * missed.numel())
        self.stats.requests += 1
        self.stats.rows_requested += unique.numel()
        self.stats.seconds += time.perf_counter() - start
        return out if inverse is None else out.index_select(
            0, inverse.to(self.device))

    def _mark_window(self, future) -> None:
        """Per row: batches until its first use in the window (1: the next
        batch), else 0. Work proportional to the window, not the graph."""
        marks = self._marks
        if self._marked is not None:
            marks[self._marked] = 0
        for distance in range(len(future), 0, -1):
            marks[future[distance - 1]] = min(distance, 127)
        self._marked = torch.cat(list(future)) if future else None

    def _candidates(self, unique: torch.Tensor, future) -> torch.Tensor:
        """Sorted ids the window needs that are not cached, not staged and
        not in this batch: worth bringing along."""
        wanted = torch.unique(torch.cat(list(future)))
        keep = ~torch.isin(wanted, unique, assume_unique=True)
        for layer in self.layers:
            keep &= ~layer.policy.resident[wanted]
        keep &= self.staging.slot_of[wanted] < 0
        return wanted[keep]

    def _unstage(self) -> None:
        """Drop staged rows the window no longer needs or a tier holds."""
        staging = self.staging
        held = staging.id_of[staging.id_of >= 0]
        if held.numel():
            needed = self._marks[held] > 0
            for layer in self.layers:
                needed &= ~layer.policy.resident[held]
            freed = staging.remove(held[~needed])
            add_count(self.stats.evicted, "staged", freed.numel())

    def _stage(self, ids, rows) -> None:
        """Keep rows brought along (the storage tier took what fits)."""
        self.staging.insert(ids, rows)
        add_count(self.stats.admitted, "staged", ids.numel())
        add_count(self.stats.bytes, "storage->host",
                  self.row_bytes * ids.numel())

    def _count_hits(self, tier: str, rows: int, stats=None) -> None:
        """Rows served by ``tier``; all but the device's cross to it."""
        stats = self.stats if stats is None else stats
        add_count(stats.hits, tier, rows)
        if tier != "device":
            add_count(stats.bytes, "host->device", rows * self.row_bytes)

    def _apply(self, layer: Layer, step, unique, out, where) -> None:
        for store in layer.stores:
            freed = store.remove(step.evict)
            add_count(self.stats.evicted, store.name, freed.numel())
        admit = step.admit
        if admit.numel() == 0:
            return
        positions = torch.searchsorted(unique, admit)
        for store in layer.stores:
            take = min(store.num_free, admit.numel())
            if take:
                store.insert(admit[:take], out[where(positions[:take])])
                add_count(self.stats.admitted, store.name, take)
                admit, positions = admit[take:], positions[take:]
        assert admit.numel() == 0, "policy admitted more than it can hold"

    def release_buffers(self) -> None:
        """See `Feature.release_buffers` (the source's are its own)."""
        if self._compiled is not None:
            self._drain()
            self._compiled.pool.clear()

    def keep_buffers(self, batches: int) -> None:
        """See `Feature.keep_buffers` (the source's are its own)."""
        if self._compiled is not None:
            self._drain()
            self._compiled.pool.resize(batches)

    def close(self) -> None:
        """Close the source; let go of the batch buffers."""
        self.release_buffers()
        self.source.close()

    def __repr__(self) -> str:
        stores = ", ".join(repr(s) for s in self.stores)
        return f"FeatureCache([{stores}] over {self.source!r})"

"""A frozen view of a feature cache: reads that leave it as it was.

An evaluation pass reads through the training cache without disturbing
it: `FrozenView` serves hits from the cache's stores and misses from its
source, with no policy step, and counts in a `CacheStats` of its own.
"""

from __future__ import annotations

import time

import torch

from hmgraph.cache import compiled
from hmgraph.cache.counters import CacheStats, add_count
from hmgraph.cache.feature import Feature, request_rows

__all__ = ["FrozenView"]


class FrozenView(Feature):
    """Reads through a `FeatureCache` that leave it exactly as it was.

    Hits are served from the stores, misses read from the cache's source;
    no policy sees the ids and nothing is admitted or evicted, so an
    evaluation pass does not disturb what training has cached. Counters
    go to this view's own `CacheStats`.

    Parameters
    ----------
    cache : hmgraph.cache.coordinated.FeatureCache
        The cache to read through; rows come back on its device.
    """

    def __init__(self, cache):
        self.cache = cache
        self.num_rows = cache.num_rows
        self.row_shape = cache.row_shape
        self.dtype = cache.dtype
        self.device = cache.device
        self.stats = CacheStats()

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        if self.cache._on_device is not None:  # its tables are there
            ids = ids.to(self.device)
        if self.cache.complete:
            return self.cache._gather_held(ids, self.stats)
        reader = self.cache._compiled
        if reader is not None:
            with self.cache._lock:  # the stamps and buffers are shared
                return compiled.each_once(
                    lambda asked: reader.frozen_read(asked, self.stats), ids)
        start = time.perf_counter()
        unique, out, where, inverse = request_rows(ids, self)
        pending = torch.arange(unique.numel(), device=unique.device)
        for store in self.cache.stores:
            slots = store.slots(unique[pending])
            found = slots >= 0
            if found.any():
                out[where(pending[found])] = store.gather(
                    slots[found]).to(self.device)
                add_count(self.stats.hits, store.name, int(found.sum()))
                pending = pending[~found]
        if pending.numel():
            out[where(pending)] = self.cache._read_source(
                unique[pending]).to(self.device)
            add_count(self.stats.bytes, "storage->host",
                 self.row_bytes * pending.numel())
        add_count(self.stats.hits, "source", pending.numel())
        self.stats.requests += 1
        self.stats.rows_requested += unique.numel()
        self.stats.seconds += time.perf_counter() - start
        return out if inverse is None else out.index_select(
            0, inverse.to(self.device))

"""`LoaderStats`: the counters of one `hmgraph.DataLoader`."""

from __future__ import annotations

from dataclasses import dataclass, field

from hmgraph.cache.coordinated import CacheStats
from hmgraph.cache.reuse import BatchReuse

__all__ = ["LoaderStats", "loader_stats"]


@dataclass
class LoaderStats:
    """Counters of one loader; `reset` zeroes them all.

    Attributes
    ----------
    batches : int
        Mini-batches produced.
    rows_requested : int
        Rows of the cached feature read by all batches.
    seconds : dict of str to float
        Per stage: ``sample`` and ``fetch`` (in their threads when
        prefetching), ``wait`` (training waiting for a batch).
    cpu_seconds : dict of str to float
        CPU time of the ``sample`` and ``fetch`` stages' threads while in
        them (the storage tier's threads: ``storage.cpu_seconds``).
    cache : CacheStats, dict or None
        Hits per tier, admissions, bytes per link (per node type on
        heterographs).
    storage : object or None
        The storage tier's counters (requests and bytes read), if any.
    reuse : ReuseStats or None
        Rows reused per level, bytes saved, seconds finding duplicates.
    """

    batches: int = 0
    rows_requested: int = 0
    seconds: dict = field(default_factory=lambda: {
        "sample": 0.0, "fetch": 0.0, "wait": 0.0})
    cpu_seconds: dict = field(default_factory=lambda: {
        "sample": 0.0, "fetch": 0.0})
    cache: CacheStats | dict | None = None
    storage: object = None
    reuse: object = None

    def _parts(self) -> list:
        return [s for s in (self.cache, self.storage, self.reuse)
                if s is not None]

    def reset(self) -> None:
        """Zero every counter, the cache's and storage's included."""
        self.batches = 0
        self.rows_requested = 0
        self.seconds = {key: 0.0 for key in self.seconds}
        self.cpu_seconds = {key: 0.0 for key in self.cpu_seconds}
        for part in self._parts():
            for stats in (part.values() if isinstance(part, dict)
                          else [part]):
                stats.reset()

    def hit_rate(self, tier: str) -> float:
        """Share of input rows served by ``tier`` (0.0 before any)."""
        caches = self.cache.values() if isinstance(self.cache, dict) \
            else [self.cache] if self.cache is not None else []
        hits = sum(c.hits.get(tier, 0) for c in caches)
        asked = sum(c.rows_requested for c in caches)
        return hits / asked if asked else 0.0

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        record = {"batches": self.batches,
                  "rows_requested": self.rows_requested,
                  "seconds": dict(self.seconds),
                  "cpu_seconds": dict(self.cpu_seconds)}
        for name in ("cache", "storage", "reuse"):
            part = getattr(self, name)
            if isinstance(part, dict):
                record[name] = {k: v.as_dict() for k, v in part.items()}
            elif part is not None:
                record[name] = part.as_dict()
        return record


def loader_stats(sources: dict, caches: dict, features: dict,
                 homogeneous: bool) -> LoaderStats:
    """Zeroed counters over the built features' own.

    Parameters
    ----------
    sources, caches, features : dict
        Per node type: the feature's source, its cache, and what the
        loader reads (the source itself where caching is off).
    homogeneous : bool
        Whether the graph has one node type: then each part is that
        type's counters, else a dict by node type.
    """
    def by_type(get):
        values = {n: get(n) for n in sources}
        values = {n: v for n, v in values.items() if v is not None}
        if homogeneous:
            return next(iter(values.values()), None)
        return values or None

    return LoaderStats(
        cache=by_type(lambda n: caches[n].stats
                      if features[n] is not sources[n] else None),
        storage=by_type(lambda n: getattr(sources[n], "stats", None)),
        reuse=by_type(lambda n: features[n].stats
                      if isinstance(features[n], BatchReuse) else None))

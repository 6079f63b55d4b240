"""Counters of the caches: requests, hits per tier, bytes per link.

`CacheStats` is what every `hmgraph.cache.coordinated.FeatureCache` (and
each `hmgraph.cache.frozen.FrozenView` over one) counts its reads in;
`ReuseStats` what `hmgraph.cache.reuse.BatchReuse` counts its batches in;
`StorageStats` what `hmgraph.cache.storage.StorageFeature` counts its reads
in, in the disk's units. Rates are 0.0 before the first request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from hmgraph.cache.format import PAGE_BYTES

__all__ = ["CacheStats", "ReuseStats", "StorageStats", "add_count"]


@dataclass
class CacheStats:
    """Counters of a feature cache; rates are 0.0 before any request.

    Attributes
    ----------
    requests : int
        Read calls.
    rows_requested : int
        Unique ids asked, summed over reads.
    hits : dict of str to int
        Rows served per store name (``device``, ``host``, ``staged``: rows
        brought along by an earlier batch's reads) and ``source``.
    admitted, evicted : dict of str to int
        Rows inserted into / removed from each store while reading.
    bytes : dict of str to int
        Bytes per link: ``storage->host`` (rows from the source, staged
        rows included) and ``host->device`` (rows that crossed to the
        training device).
    seconds : float
        Wall time spent in reads.
    metadata_bytes : dict of str to int
        Bytes of bookkeeping (slot tables, policy state, window marks) the
        cache allocated when built, per memory (``host``, ``device``);
        kept by `reset`.
    """

    requests: int = 0
    rows_requested: int = 0
    hits: dict = field(default_factory=dict)
    admitted: dict = field(default_factory=dict)
    evicted: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=lambda: {
        "storage->host": 0, "host->device": 0})
    seconds: float = 0.0
    metadata_bytes: dict = field(default_factory=dict)

    def hit_rate(self, tier: str) -> float:
        """Share of requested rows served by ``tier``."""
        if self.rows_requested == 0:
            return 0.0
        return self.hits.get(tier, 0) / self.rows_requested

    @property
    def miss_rate(self) -> float:
        """Share of requested rows read from the source."""
        return self.hit_rate("source")

    def reset(self) -> None:
        """Zero every counter (the metadata bytes are no counter)."""
        metadata = self.metadata_bytes
        self.__init__()
        self.metadata_bytes = metadata

    def as_dict(self) -> dict:
        """Counters and per-tier hit rates as a JSON-ready dict."""
        return {
            "requests": self.requests,
            "rows_requested": self.rows_requested,
            "hits": dict(self.hits),
            "hit_rate": {k: self.hit_rate(k) for k in self.hits},
            "admitted": dict(self.admitted),
            "evicted": dict(self.evicted),
            "bytes": dict(self.bytes),
            "seconds": self.seconds,
            "metadata_bytes": dict(self.metadata_bytes),
        }


def add_count(counter: dict, key: str, value: int) -> None:
    """Add ``value`` to ``counter[key]`` (0 when absent), as an int.

    Parameters
    ----------
    counter : dict of str to int
        A counter of `CacheStats` (``hits``, ``bytes``, ...).
    key : str
        The tier or link counted.
    value : int
        What to add (a tensor's count is converted).
    """
    counter[key] = counter.get(key, 0) + int(value)


@dataclass
class ReuseStats:
    """Counters of batch reuse; 0 before the first batch.

    Attributes
    ----------
    rows_requested : int
        Input rows asked (DGL's input nodes are unique).
    reused : dict of str to int
        Rows copied on the device from each level (``level1``, ``level2``).
    bytes_saved : int
        Bytes that did not cross to the device (or come from storage).
    seconds : float
        Time batch reuse spent, all but the reads of the cache below:
        looking ids up in the table, copying reused rows, keeping the
        batch (a copy of its rows, its ids in the table) and moving the
        ids of the rest to the host (a sync on CUDA).
    cpu_seconds : float
        The CPU time of the reading thread over that same work: beside
        a model training on the same cores, ``seconds`` also counts the
        time the thread waited for a core.
    copy_seconds : float
        The part of ``seconds`` spent copying rows on the device: reused
        rows into the batch, the batch's rows into the buffer.
    peak_bytes : int
        Most device bytes the buffers and the id table held after a read.
    staging_bytes : int
        Device bytes of the staging the rows asked of the cache below pass
        through (as many as the most one batch asked, grown by a quarter
        when short; without reuse the batch's own rows). The compiled
        engine keeps no staging of its own: the rows pass through the
        cache below's own tensor, at most this size.
    """

    rows_requested: int = 0
    reused: dict = field(default_factory=lambda: {"level1": 0,
                                                  "level2": 0})
    bytes_saved: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    copy_seconds: float = 0.0
    peak_bytes: int = 0
    staging_bytes: int = 0

    def reuse_rate(self) -> float:
        """Share of requested rows reused (0.0 before any)."""
        if self.rows_requested == 0:
            return 0.0
        return sum(self.reused.values()) / self.rows_requested

    def reset(self) -> None:
        """Zero every counter."""
        self.__init__()

    def as_dict(self) -> dict:
        """Counters as a JSON-ready dict."""
        return {"rows_requested": self.rows_requested,
                "reused": dict(self.reused),
                "reuse_rate": self.reuse_rate(),
                "bytes_saved": self.bytes_saved,
                "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds,
                "copy_seconds": self.copy_seconds,
                "peak_bytes": self.peak_bytes,
                "staging_bytes": self.staging_bytes}


@dataclass
class StorageStats:
    """Counters of a `StorageFeature`, in the disk's units; exact sums.

    Attributes
    ----------
    calls : int
        Calls of ``read``.
    rows_requested : int
        Ids asked for, duplicates included.
    rows_read : int
        Unique rows read from the file.
    blocks_read : int
        Blocks of ``block_bytes`` read (gaps read through included).
    block_bytes : int
        The read unit: the disk's logical block size, or the page size.
    bytes_read : int
        Bytes transferred from the file (``blocks_read * block_bytes``
        unless a read stopped short).
    useful_bytes : int
        Bytes of the rows read (``rows_read * row_bytes``).
    io_requests : int
        ``pread`` calls: the requests the disk served.
    seconds : float
        Seconds the reads took: planning, then from the first task's
        start to the last one's end (not the caller's work beside them).
    model_seconds : float
        What the disk model prices the same requests and bytes at
        (``io_requests / iops + bytes_read / bandwidth``).
    cpu_seconds : float
        CPU time of the tier's threads (the reads' system calls and the
        copies of rows out of the read buffers), summed over threads.
    """

    calls: int = 0
    rows_requested: int = 0
    rows_read: int = 0
    blocks_read: int = 0
    block_bytes: int = PAGE_BYTES
    bytes_read: int = 0
    useful_bytes: int = 0
    io_requests: int = 0
    seconds: float = 0.0
    model_seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def amplification(self) -> float:
        """Bytes read per byte of row served (0.0 before any read)."""
        return self.bytes_read / self.useful_bytes if self.useful_bytes \
            else 0.0

    def reset(self) -> None:
        """Set every counter back to zero (the block size stays)."""
        for counter in fields(self):
            if counter.name != "block_bytes":
                setattr(self, counter.name, counter.default)

    def as_dict(self) -> dict:
        """The counters as a plain dict, amplification included."""
        record = asdict(self)
        record["amplification"] = self.amplification
        record["seconds_vs_model"] = (self.seconds / self.model_seconds
                                      if self.model_seconds else None)
        return record

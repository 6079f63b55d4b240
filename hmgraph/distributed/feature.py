"""What a distributed trainer reads: its part's rows locally, the rest remotely.

`PartitionFeature` is the bottom tier of a trainer's coordinated cache. Rows
its part stores (owned and replicated, ``partP/feat.bin`` written by
`hmgraph.partition.write_partitions`) come from the local disk through the
O_DIRECT storage tier; every other row is pulled from its owner's server
through DGL's `DistTensor` (the KVStore), and counted as remote traffic.

DGL's RPC client is not thread-safe, and hmgraph's loader samples and
fetches in two threads, so every call into it (pulls here, sampling in
`LockedNeighborSampler`) holds one shared lock.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.feature import Feature
from hmgraph.cache.format import FeatureFileError, with_remedy
from hmgraph.cache.storage import StorageFeature

__all__ = ["PartitionFeature", "PartLabels", "RemoteStats"]

#: What works for a part's damaged ``feat.bin``: nothing makes one part's
#: file again, partitioning writes the whole output folder anew.
PARTITION_REMEDY = "partition again (hmgraph partition) to rewrite it"


@dataclass
class RemoteStats:
    """Counters of a trainer's feature reads."""

    local_rows: int = 0
    remote_rows: int = 0
    remote_bytes: int = 0
    remote_requests: int = 0

    def reset(self) -> None:
        self.__init__()

    def as_dict(self) -> dict:
        return asdict(self)


class PartitionFeature(Feature):
    """Rows of all vertices, read from a part's store or from other parts.

    Parameters
    ----------
    part_dir : str or os.PathLike
        ``OUT/partP`` of a partition written by hmgraph.
    remote : dgl.distributed.DistTensor
        The graph's features (``dist_graph.ndata["feat"]``).
    lock : threading.Lock
        Held around every pull (shared with the sampler).
    """

    def __init__(self, part_dir, remote, lock: threading.Lock | None = None):
        part_dir = Path(part_dir)
        self.local_ids = torch.from_numpy(np.load(part_dir / "local_ids.npy"))
        try:
            self.local = StorageFeature(part_dir / "feat.bin")
        except FeatureFileError as err:
            raise with_remedy(err, PARTITION_REMEDY) from None
        self.local.remedy = PARTITION_REMEDY
        if self.local.num_rows != self.local_ids.numel():
            raise ValueError(
                f"{part_dir}/feat.bin has {self.local.num_rows} rows, "
                f"local_ids.npy lists {self.local_ids.numel()}; partition "
                "again"
            )
        self.remote = remote
        self.lock = lock or threading.Lock()
        self.num_rows = int(remote.shape[0])
        self.row_shape = tuple(self.local.row_shape)
        self.dtype = self.local.dtype
        self.stats = RemoteStats()

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty((ids.numel(), *self.row_shape), dtype=self.dtype)
        if ids.numel() == 0:
            return out
        where = torch.searchsorted(self.local_ids, ids)
        where.clamp_(max=max(0, self.local_ids.numel() - 1))
        is_local = (self.local_ids[where] == ids) if self.local_ids.numel() \
            else torch.zeros_like(ids, dtype=torch.bool)
        local = torch.nonzero(is_local).flatten()
        remote = torch.nonzero(~is_local).flatten()
        if local.numel():
            out[local] = self.local.read(where[local])
        if remote.numel():
            with self.lock:
                rows = self.remote[ids[remote]]
            out[remote] = rows.to(self.dtype)
            self.stats.remote_requests += 1
        self.stats.local_rows += local.numel()
        self.stats.remote_rows += remote.numel()
        self.stats.remote_bytes += remote.numel() * self.row_bytes
        return out

    def close(self) -> None:
        self.local.close()


class PartLabels:
    """Labels by (reshuffled) id: owned ones from memory, others pulled.

    Parameters
    ----------
    owned : torch.Tensor
        Labels of the part's own vertices, ids ``start`` onwards.
    start : int
        First id the part owns.
    remote : dgl.distributed.DistTensor
        All labels (``dist_graph.ndata["label"]``).
    lock : threading.Lock
        Held around pulls.
    """

    def __init__(self, owned: torch.Tensor, start: int, remote, lock):
        self.owned = owned
        self.start = start
        self.remote = remote
        self.lock = lock

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        offset = ids - self.start
        inside = (offset >= 0) & (offset < self.owned.numel())
        if bool(inside.all()):
            return self.owned[offset]
        out = torch.empty(ids.shape, dtype=self.owned.dtype)
        out[inside] = self.owned[offset[inside]]
        with self.lock:
            out[~inside] = self.remote[ids[~inside]].to(self.owned.dtype)
        return out

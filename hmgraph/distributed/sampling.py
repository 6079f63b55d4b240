"""DGL's neighbour sampler over a `DistGraph`, safe for hmgraph's threads."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import dgl
from dgl.dataloading import NeighborSampler

__all__ = ["LockedNeighborSampler", "SamplingStats"]


@dataclass
class SamplingStats:
    """Vertices whose neighbours were sampled, and how many remotely."""

    requests: int = 0
    remote_requests: int = 0

    def reset(self) -> None:
        self.__init__()

    def as_dict(self) -> dict:
        return asdict(self)


class LockedNeighborSampler(NeighborSampler):
    """`dgl.dataloading.NeighborSampler` holding a lock around DGL's RPC.

    Sampling a `DistGraph` sends each vertex's request to the server of
    its part; this counts those requests, and those that leave the
    trainer's own part.

    Parameters
    ----------
    fanouts : list of int
        As DGL's (``-1``: all neighbours).
    lock : threading.Lock
        Shared with every other user of DGL's RPC client in the process.
    partition_book : dgl.distributed.GraphPartitionBook, optional
        Owner of each vertex, for the remote count.
    part : int, optional
        The trainer's part.
    """

    def __init__(self, fanouts, lock: threading.Lock, partition_book=None,
                 part: int | None = None, **kwargs):
        kwargs.setdefault("fused", False)  # DistGraph has no fused kernel
        super().__init__(fanouts, **kwargs)
        self.lock = lock
        self.partition_book = partition_book
        self.part = part
        self.stats = SamplingStats()

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        with self.lock:
            result = super().sample_blocks(g, seed_nodes, exclude_eids)
        if self.partition_book is not None:
            for block in result[2]:
                dst = block.dstdata[dgl.NID]
                owner = self.partition_book.nid2partid(dst)
                self.stats.requests += dst.numel()
                self.stats.remote_requests += int((owner != self.part).sum())
        return result

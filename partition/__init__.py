"""Partitions for DGL's distributed engine.

`assign` chooses the owner part of every vertex (and, for the project's
methods, the vertices each part replicates); `write_partitions` writes the
result in DGL's partition format, loadable by
`dgl.distributed.load_partition` and `dgl.distributed.DistGraphServer`;
`partition_stats` counts edge cut, replication and the remote traffic of
one epoch per part; `assign_and_count` does both with the profile of
training.
"""

from hmgraph.partition.export import (
    CONFIG_NAME,
    read_partition_info,
    update_partition_info,
    write_partitions,
)
from hmgraph.partition.methods import METHODS, Assignment, assign
from hmgraph.partition.stats import (
    assign_and_count,
    edge_cut,
    partition_stats,
)

__all__ = [
    "CONFIG_NAME",
    "METHODS",
    "Assignment",
    "assign",
    "assign_and_count",
    "edge_cut",
    "partition_stats",
    "read_partition_info",
    "update_partition_info",
    "write_partitions",
]

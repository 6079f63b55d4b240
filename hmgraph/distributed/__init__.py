"""Distributed training on DGL's engine: launcher, workers, remote features.

`launch` starts one `DistGraphServer` per part and the trainers, on this
machine's loopback interface, and tears them down; the workers live in
`hmgraph.distributed.worker`.
"""

from hmgraph.distributed.launcher import LaunchError, free_port, launch

__all__ = ["LaunchError", "free_port", "launch"]

"""Several DGL "machines" on one host.

DGL's distributed engine assumes one machine per IP address: a client finds
its machine by matching the ip_config's addresses against its own
interfaces, and every server puts its part's tensors in POSIX shared
memory under names that are unique per machine only (``node~_N~feat`` and
the like). With every part's server on 127.0.0.1, all clients would claim
machine 0 and the servers would overwrite each other's shared memory.

`emulate_machine` fixes both for the current process, before
`dgl.distributed.initialize`: the client reports the machine it was given,
and every shared-memory name DGL creates or opens gets a per-machine
prefix (unique per launcher too, so two jobs on one host never meet).
Nothing else of DGL changes: servers, clients, partition books, KVStore
pulls and sampling requests run DGL's own code over loopback sockets, and
a trainer reads its own part's rows from its server's shared memory as it
would on a real machine.
"""

from __future__ import annotations

import importlib

import dgl.distributed.rpc_client as rpc_client
from dgl._ffi.ndarray import empty_shared_mem

__all__ = ["emulate_machine"]

_MODULES = (
    "dgl.distributed.kvstore",
    "dgl.distributed.dist_graph",
    "dgl.distributed.graph_partition_book",
    "dgl.distributed.shared_mem_utils",
)


def emulate_machine(machine_id: int, tag: str) -> None:
    """Make this process behave as if it ran on machine ``machine_id``.

    Parameters
    ----------
    machine_id : int
        The part (line of the ip_config) this process belongs to.
    tag : str
        Unique per job (e.g. the launcher's pid), prefixed to shared
        memory names with the machine id.
    """
    prefix = f"hmg{tag}m{machine_id}-"

    def named_shared_mem(name, is_create, shape, dtype):
        return empty_shared_mem(prefix + name, is_create, shape, dtype)

    for module in _MODULES:
        module = importlib.import_module(module)
        if hasattr(module, "empty_shared_mem"):
            module.empty_shared_mem = named_shared_mem
    rpc_client.get_local_machine_id = lambda server_namebook: machine_id

"""`DataLoader.enable_cpu_affinity`: DGL's CPU affinity, for hmgraph."""

from __future__ import annotations

import contextlib

import psutil
from dgl.utils import get_num_threads, get_numa_nodes_cores, set_num_threads

__all__ = ["cpu_affinity"]


@contextlib.contextmanager
def cpu_affinity(loader, loader_cores=None, compute_cores=None,
                 verbose: bool = True):
    """Worker processes on ``loader_cores``, training on ``compute_cores``.

    As ``dgl.dataloading.DataLoader.enable_cpu_affinity``: CPU devices
    only (elsewhere a no-op), ``num_workers > 0``; by default the workers
    take the first cores of NUMA node 0 and training the rest of them.
    DGL's thread count, the affinity and ``worker_init_fn`` are restored
    on exit.

    Raises
    ------
    ValueError
        No workers, a core list of the wrong length, or more workers than
        cores.
    """
    if loader.device.type != "cpu":
        yield
        return
    workers = loader.num_workers
    if workers <= 0:
        raise ValueError("enable_cpu_affinity needs num_workers > 0 (the "
                         "loader's workers get cores of their own)")
    if loader_cores and len(loader_cores) != workers:
        raise ValueError(f"loader_cores={loader_cores} has "
                         f"{len(loader_cores)} cores for num_workers="
                         f"{workers}")
    loader_cores = list(loader_cores or [])
    compute_cores = list(compute_cores or [])
    if not loader_cores or not compute_cores:
        numa = get_numa_nodes_cores()
        if numa and len(numa[0]) > workers:
            node0 = [cpus[0] for _, cpus in numa[0]]
        else:
            node0 = list(range(psutil.cpu_count(logical=False)))
        if len(node0) < workers:
            raise ValueError(f"num_workers={workers} is more than the "
                             f"{len(node0)} cores")
        loader_cores = loader_cores or node0[:workers]
        compute_cores = compute_cores or [
            cpu for cpu in node0 if cpu not in loader_cores]
    torch_loader = loader._batches
    old_init = torch_loader.worker_init_fn
    old_affinity = psutil.Process().cpu_affinity()
    old_threads = get_num_threads()

    def init(worker_id: int) -> None:
        psutil.Process().cpu_affinity([loader_cores[worker_id]])
        old_init(worker_id)

    try:
        psutil.Process().cpu_affinity(compute_cores)
        set_num_threads(len(compute_cores))
        torch_loader.worker_init_fn = init
        loader.cpu_affinity_enabled = True
        if verbose:
            print(f"{workers} DL workers are assigned to cpus "
                  f"{loader_cores}, main process will use cpus "
                  f"{compute_cores}")
        yield
    finally:
        psutil.Process().cpu_affinity(old_affinity)
        set_num_threads(old_threads)
        torch_loader.worker_init_fn = old_init
        loader.cpu_affinity_enabled = False

"""The memory a node classification run needs and promises.

Checked before anything large is allocated: the model's training state
(`check_model_memory`), the rows of the batches in flight, the per-node
state of profile and policies and the budgets of the cache tiers
(`size_memory`); the peak resident memory the run then promises
(`memory_promise`) is compared with what it used (`peak_rss_bytes`).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import resource

import torch

from hmgraph.cache.budget import (
    HOST_RESERVE_BYTES,
    auto_host_budget,
    available_bytes,
    check_available,
    format_bytes,
    parse_budget,
)
from hmgraph.cache.plan import metadata_bytes
from hmgraph.cache.policies import POLICIES

log = logging.getLogger(__name__)

__all__ = ["batch_input_bytes", "batches_in_flight", "check_model_memory",
           "in_flight", "layerwise_buffer_bytes", "layerwise_on_disk",
           "memory_promise", "peak_rss_bytes", "prefetch_depth",
           "release_freed_memory", "size_memory", "working_set_bytes"]

#: Copies of every parameter while training with Adam: the weights, their
#: gradients and Adam's two moment estimates.
_TRAINING_COPIES = 4


def check_model_memory(build, device, sizes: dict) -> int:
    """Refuse a model whose training state does not fit in ``device``'s
    free memory, before any of it is allocated.

    The model is built on PyTorch's ``meta`` device (shapes, no memory)
    to count its parameters; training holds `_TRAINING_COPIES` of them
    (weights, gradients, Adam's two moments) besides its buffers.

    Parameters
    ----------
    build : callable
        ``() -> torch.nn.Module``, the model as training builds it.
    device : torch.device or str
        Where it would train (``cpu``: host memory).
    sizes : dict of str to int
        The flags that size the model and their values, named in the
        error, e.g. ``{"--hidden": 100000000}``.

    Returns
    -------
    int
        Bytes of training state (0 where the model cannot be built on
        the meta device, and so is not checked).

    Raises
    ------
    ValueError
        ``--hidden 100000000: training the model needs 320000.4 TB
        (weights, gradients, Adam state), more than the 20.1 GB free on
        cpu; use a smaller --hidden``.
    """
    try:
        with torch.device("meta"):
            model = build()
    except (NotImplementedError, RuntimeError):  # an op with no meta kernel
        return 0
    need = sum(_TRAINING_COPIES * p.numel() * p.element_size()
               for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    free = available_bytes(device)
    if need > free:
        given = " ".join(f"{flag} {value}" for flag, value in sizes.items())
        raise ValueError(
            f"{given}: training the model needs {format_bytes(need)} "
            f"(weights, gradients, Adam state), more than the "
            f"{format_bytes(free)} free on {torch.device(device)}; use a "
            f"smaller {' or '.join(sizes)}")
    return need



def size_memory(config, dataset, sampler, device) -> dict:
    """The budgets of a run in bytes and the memory it was sized with.

    Parses the budgets (``host_budget="auto"``: what is free after the
    graph, the working set and the reserve, with features on disk; 0 in
    memory) and refuses budgets that do not fit.

    Returns
    -------
    dict
        ``graph_bytes``, ``feature_bytes``, ``working_set_bytes``,
        ``device_budget_bytes``, ``host_budget_bytes``,
        ``batch_input_bytes``, ``batches_in_flight`` and
        ``promise_bytes`` (`memory_promise`).

    Raises
    ------
    ValueError
        A budget over what is available.
    """
    if config.features_on not in ("memory", "disk"):
        raise ValueError(f"features_on must be 'memory' or 'disk', got "
                         f"{config.features_on!r}")
    disk = config.features_on == "disk"
    feature_bytes = dataset.feature_bytes
    device_budget = parse_budget(config.device_budget, feature_bytes)
    check_available("device", device_budget, device)
    batch_bytes = batch_input_bytes(config, dataset, sampler)
    working = working_set_bytes(config, dataset, sampler, device_budget,
                                device, batch_bytes)
    if str(config.host_budget).strip().lower() == "auto":
        # Up to every row with its bookkeeping: the file read once.
        policy = config.cache if config.cache in POLICIES else "none"
        whole = feature_bytes + metadata_bytes(
            policy, dataset.num_nodes, 0, dataset.num_nodes)
        host_budget = auto_host_budget(whole, working) if disk else 0
    else:
        host_budget = parse_budget(config.host_budget, feature_bytes)
        free = available_bytes("cpu")
        if disk and host_budget + working > free:
            raise ValueError(
                f"host budget {format_bytes(host_budget)} plus the run's "
                f"working set {format_bytes(working)} exceeds the "
                f"{format_bytes(free)} available; use at most "
                f"{format_bytes(max(0, free - working))} or --host-budget "
                f"auto"
            )
        check_available("host", host_budget, "cpu")
    memory = {"graph_bytes": dataset.graph_bytes,
              "feature_bytes": feature_bytes, "working_set_bytes": working,
              "device_budget_bytes": device_budget,
              "host_budget_bytes": host_budget,
              "batch_input_bytes": batch_bytes,
              "batches_in_flight": batches_in_flight(config)}
    memory["promise_bytes"] = memory_promise(memory, config.features_on)
    log.info("memory: graph %s, features %s (%s), working set %s, device "
             "budget %s, host budget %s", format_bytes(memory["graph_bytes"]),
             format_bytes(feature_bytes), config.features_on,
             format_bytes(working), format_bytes(device_budget),
             format_bytes(host_budget))
    return memory


_WORKING_SET_BATCHES = 4
# Per-node state of profile and policies (hop counts, trace, slot tables).
_BYTES_PER_NODE = 64


def prefetch_depth(config) -> int:
    """Batches fetched ahead: ``config.prefetch``, or by default 1 with
    features on disk (the rows of three batches in flight) and 2 in
    memory."""
    if config.prefetch is not None:
        return config.prefetch
    return 1 if config.features_on == "disk" else 2


def in_flight(prefetch: int, interleaves: bool = True) -> int:
    """Batches whose rows are alive at once, each in a buffer the loader
    keeps for reuse (`hmgraph.cache.feature.Feature.keep_buffers`): the
    one training, those prefetched and the one being read; ``prefetch +
    2``, and 3 at ``prefetch=0`` where the fetch ``interleaves`` (it reads
    the next batch while this one trains, and looks up the one after:
    sized for two, the buffers ran short every batch and a fresh 216 MB
    buffer paid its page faults on synth-products)."""
    return prefetch + 2 + (interleaves and not prefetch)


def batches_in_flight(config) -> int:
    """Batches whose input rows may be alive at once under ``config``
    (`in_flight`, counting on a cache that interleaves)."""
    return in_flight(prefetch_depth(config))


def batch_input_bytes(config, dataset, sampler) -> int:
    """Bytes of input rows of the largest of a few sampled batches."""
    seeds = dataset.split["train"]
    generator = torch.Generator().manual_seed(config.seed)
    order = seeds[torch.randperm(seeds.numel(), generator=generator)]
    most = 0
    for index in range(_WORKING_SET_BATCHES):
        batch = order[index * config.batch_size:
                      (index + 1) * config.batch_size]
        if batch.numel() == 0:
            break
        input_nodes, _, _ = sampler.sample(dataset.graph, batch)
        most = max(most, input_nodes.numel())
    return most * dataset.manifest.row_bytes


def working_set_bytes(config, dataset, sampler, device_budget: int,
                      device, batch_bytes: int | None = None) -> int:
    """Host memory a run needs besides the graph, the host tier and the
    2 GiB reserve (`hmgraph.cache.budget.HOST_RESERVE_BYTES`, which the
    model's step and the libraries live in).

    The rows of the batches in flight (`batch_input_bytes` times
    `batches_in_flight`: reused buffers, one per batch), 64 bytes per node
    of profile and policy state, with ``eval="layerwise"`` its buffers
    (`layerwise_buffer_bytes`; ``auto`` checks them when it resolves) and,
    on a CPU device, the device tier. ``batch_bytes``: the batch's input
    bytes where already known.
    """
    if batch_bytes is None:
        batch_bytes = batch_input_bytes(config, dataset, sampler)
    total = batch_bytes * batches_in_flight(config)
    total += _BYTES_PER_NODE * dataset.num_nodes
    if config.eval == "layerwise":
        total += dataset.num_nodes * dataset.num_classes * 4 \
            if layerwise_on_disk(config, dataset) \
            else layerwise_buffer_bytes(config, dataset)
    if torch.device(device).type == "cpu":
        total += device_budget
    return int(total)


def memory_promise(memory: dict, features_on: str) -> int:
    """The peak resident memory a run promises: graph + budgets (+ the
    rows, in memory) + the batches in flight + the 2 GiB reserve."""
    return int(memory["graph_bytes"] + memory["device_budget_bytes"]
               + memory["host_budget_bytes"]
               + (memory["feature_bytes"] if features_on == "memory" else 0)
               + memory["batch_input_bytes"] * memory["batches_in_flight"]
               + HOST_RESERVE_BYTES)


def layerwise_buffer_bytes(config, dataset) -> int:
    """Host memory of layer-wise inference: two layers' outputs per node."""
    width = max(config.hidden * config.num_heads, dataset.num_classes)
    return 2 * dataset.num_nodes * width * 4


def layerwise_on_disk(config, dataset) -> bool:
    """Whether layer-wise inference writes its hidden layers to the run's
    folder (`hmgraph.models.layerwise_inference`'s ``scratch``) and holds
    only the logits: where features are on disk and two layers' outputs
    do not fit in free memory beside the reserve."""
    return config.features_on == "disk" and layerwise_buffer_bytes(
        config, dataset) + HOST_RESERVE_BYTES > available_bytes("cpu")



def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes.

    The kernel's high-water mark of its memory (``VmHWM`` in
    ``/proc/self/status``): exact, and its own. ``ru_maxrss`` is neither
    where a process was started by another (`multiprocessing`'s
    ``spawn``, ``hmgraph bench``): it keeps the parent's peak across
    ``exec`` (a child using 37 MB of a 537 MB parent reported 537 MB). It
    is the fallback where ``/proc`` is missing.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def release_freed_memory() -> bool:
    """Hand memory freed by this process back to the system: at an
    epoch's end (or when it is left), and once a loader is built (its
    profiling batches' temporaries: 90 MB on synth-igb).

    Batches are freed by reference counting as soon as they are dropped
    (`tests/test_loader.py` checks it with the collector off), but two
    things keep memory: DGL's ctypes handles sit in small reference cycles
    that wait for the cycle collector; and glibc keeps freed tensors in
    its arenas (over 50 epochs on synth-small RSS grew by about 300 MB with
    no more bytes held, `bench/soak.py`). A collection of the young
    generations (where the last batches' cycles are), then glibc's
    ``malloc_trim``, hands both back. Not a full collection: that scans
    every object of the process (torch, DGL, the model) and took 0.25 s
    an epoch, 12 ms a batch on a 20-batch epoch, against DGL's 50 ms
    batches; older cycles go with Python's own full collections.

    Returns
    -------
    bool
        Whether memory was released (glibc's ``malloc_trim``; False where
        the C library has none).
    """
    gc.collect(1)
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    return bool(trim(0))

"""`hmgraph.DataLoader`'s argument checks, and the defaults its device
decides (as `dgl.dataloading.DataLoader` decides them)."""

from __future__ import annotations

import numpy as np
import torch

from hmgraph.cache.reuse import REUSE_LEVELS

__all__ = ["PLACEMENTS", "check_arguments", "default_labels", "gpu_options"]

#: How profiled rows rank for static placement.
PLACEMENTS = ("frequency", "layer-aware")


def check_arguments(batch_size, prefetch: int, placement: str,
                    reuse: str) -> None:
    """Refuse a bad value, naming it.

    Raises
    ------
    ValueError
        ``batch_size`` not an integer >= 1, ``prefetch`` < 0, or an
        unknown ``placement`` or ``reuse``.
    """
    if isinstance(batch_size, bool) or not isinstance(
            batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(
            f"batch_size must be an integer >= 1, got {batch_size!r}")
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; available: "
                         f"{', '.join(PLACEMENTS)}")
    if reuse not in REUSE_LEVELS and reuse != "auto":
        raise ValueError(f"unknown reuse {reuse!r}; available: "
                         f"{', '.join(REUSE_LEVELS)}, auto")


def gpu_options(device: torch.device, use_uva: bool, num_workers: int,
                use_prefetch_thread, use_alternate_streams,
                pin_prefetcher) -> tuple[bool, bool, bool]:
    """``(use_prefetch_thread, use_alternate_streams, pin_prefetcher)``:
    each as given, or DGL's default (on CUDA; pinning not with UVA).

    Raises
    ------
    ValueError
        Streams or pinning asked for off CUDA; UVA with worker processes.
    """
    cuda = device.type == "cuda"
    for name, value in (("use_alternate_streams", use_alternate_streams),
                        ("pin_prefetcher", pin_prefetcher)):
        if value and not cuda:
            raise ValueError(
                f"{name}=True needs a CUDA device; the loader's device "
                f"is {device}")
    if use_uva and num_workers > 0:
        raise ValueError("num_workers must be 0 if UVA sampling is "
                         "enabled (as in DGL)")
    return (bool(cuda if use_prefetch_thread is None
                 else use_prefetch_thread),
            bool(cuda if use_alternate_streams is None
                 else use_alternate_streams),
            bool(cuda and not use_uva if pin_prefetcher is None
                 else pin_prefetcher))


def default_labels(graph, labels):
    """``labels``, or ``graph.ndata["label"]`` of a homogeneous graph that
    has it (else None)."""
    if labels is None and len(graph.ntypes) == 1 \
            and "label" in graph.ndata:
        return graph.ndata["label"]
    return labels

"""METIS parts for the benches, computed in a child process and cached."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from hmgraph import datasets
from hmgraph.benchmark.process import (
    ConfigurationFailed,
    isolated,
    peak_rss_bytes,
)

__all__ = [
    "METIS_TIMEOUT_SECONDS",
    "metis_parts",
    "metis_text",
]


METIS_TIMEOUT_SECONDS = 1800


def metis_parts(dataset, root, num_parts: int,
                timeout: float = METIS_TIMEOUT_SECONDS) -> tuple:
    """METIS parts of ``dataset``'s graph, cached next to its feature file
    as ``metis-<num_parts>.npy``.

    Read from `metis_clusters`' cache where its key (graph and run) is
    this one; else `metis_clusters` runs in a child process (`isolated`:
    METIS's memory, several GB on synth-products, is never this
    process's, and a run past ``timeout`` seconds is killed).

    Returns
    -------
    (torch.Tensor or None, dict)
        The part of every node (None where METIS failed) and its record:
        ``path``, ``num_parts``, ``key``, ``status`` (``cached``,
        ``computed`` or ``failed``), ``seconds`` (wall time, the child's
        loading included), ``metis_seconds`` and ``child_peak_rss_mb``
        when computed, ``error`` when failed; with parts,
        ``nodes_per_part`` and ``train_seeds_per_part`` (min, mean, max),
        ``parts_with_train_seeds`` and ``edges_inside_share``.
    """
    # Lazy: loads DGL.
    from hmgraph.samplers.cluster import cached_clusters, metis_key

    graph = dataset.graph
    path = Path(dataset.feature_path).parent / f"metis-{num_parts}.npy"
    key = metis_key(graph, num_parts)
    info = {"path": str(path), "num_parts": num_parts, "key": key,
            "status": "cached", "timeout_seconds": timeout}
    began = time.perf_counter()
    parts = cached_clusters(path, key)
    if parts is None:
        print(f"METIS: {num_parts} parts of {graph.num_nodes():,} nodes in a"
              f" child process (timeout {timeout:.0f} s)", file=sys.stderr)
        try:
            info.update(isolated(_metis_child, dataset.name, str(root),
                                 num_parts, timeout=timeout),
                        status="computed")
            parts = cached_clusters(path, key)
        except ConfigurationFailed as err:
            info.update(status="failed", error=str(err))
    info["seconds"] = time.perf_counter() - began
    if parts is None:
        info.setdefault("error", "the child's assignment is not this graph's")
        info["status"] = "failed"
        return None, info
    train = torch.bincount(parts[dataset.split["train"]],
                           minlength=num_parts).double()
    nodes = torch.bincount(parts, minlength=num_parts).double()
    src, dst = graph.edges()
    return parts, dict(
        info, edges_inside_share=float((parts[src] == parts[dst]).double()
                                       .mean()),
        parts_with_train_seeds=int((train > 0).sum()),
        **{name: {"min": int(c.min()), "mean": float(c.mean()),
                  "max": int(c.max())}
           for name, c in (("nodes_per_part", nodes),
                           ("train_seeds_per_part", train))})


def _metis_child(name: str, root: str, num_parts: int) -> dict:
    """`metis_parts`' child: load the dataset, run `metis_clusters`."""
    from hmgraph.samplers.cluster import metis_clusters  # lazy: loads DGL

    dataset = datasets.load(name, root, verify=False)
    began = time.perf_counter()
    metis_clusters(dataset.graph, num_parts, Path(dataset.feature_path)
                   .parent / f"metis-{num_parts}.npy")
    return {"metis_seconds": time.perf_counter() - began,
            "child_peak_rss_mb": peak_rss_bytes() / 2**20}


def metis_text(info: dict) -> str:
    """One markdown sentence on `metis_parts`' record."""
    text = (f"METIS ({info['num_parts']} parts, one per batch, "
            f"`{info['path']}`): **{info['status']}** in "
            f"{info['seconds']:.1f} s")
    if "metis_seconds" in info:
        text += (f" (METIS {info['metis_seconds']:.1f} s, the child's peak "
                 f"RSS {info['child_peak_rss_mb']:,.0f} MB)")
    if "error" in info:
        return f"{text}: {info['error']}."
    seeds = info["train_seeds_per_part"]
    return (f"{text}; {100 * info['edges_inside_share']:.1f} % of edges "
            f"inside a part, {seeds['min']}-{seeds['max']} train seeds per "
            f"part ({info['parts_with_train_seeds']} parts hold any).")

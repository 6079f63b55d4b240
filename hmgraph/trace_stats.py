"""Describe an access trace: how skewed, how soon reused, how spread.

`trace_stats` summarises the unique input ids per batch of an epoch: the
share of rows that make 80% of accesses, the frequency CDF, the histogram
of reuse distances (batches until a row's next use), accesses per hop, the
Spearman correlation of in-degree and accesses, and the overlap of
adjacent batches. `hmgraph.analysis.analyze` reports it beside the hit
rates of every policy.
"""

from __future__ import annotations

import numpy as np
import torch

from hmgraph.cache.policies import next_use_trace
from hmgraph.cache.reuse import member

__all__ = ["trace_stats"]


def trace_stats(trace, hop_counts, degrees, num_rows: int) -> dict:
    """Describe an access trace.

    Returns
    -------
    dict
        ``rows_for_80pct`` (share of rows making 80% of accesses),
        ``frequency_cdf`` (x: share of rows, y: share of accesses),
        ``reuse_distance`` (histogram over batches until the next use),
        ``accesses_per_hop``, ``degree_correlation`` (Spearman, in-degree
        vs accesses), ``adjacent_overlap`` (mean share of a batch's rows
        also in the previous batch), batches and accesses.
    """
    counts = torch.zeros(num_rows, dtype=torch.int64)
    for ids in trace:
        counts[ids] += 1
    accesses = int(counts.sum())
    ordered = counts.sort(descending=True).values.double()
    cumulative = ordered.cumsum(0) / max(accesses, 1)
    rows_80 = int(torch.searchsorted(cumulative, 0.8)) + 1
    points = np.unique(np.linspace(0, num_rows - 1, 200).astype(np.int64))
    cdf = {"rows": (points + 1) / num_rows,
           "accesses": cumulative[points].numpy()}
    distances = torch.cat([
        (after[after != torch.iinfo(torch.int64).max] - index)
        for index, after in enumerate(next_use_trace(trace))
    ]) if trace else torch.zeros(0, dtype=torch.int64)
    edges = [1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 10**9]
    histogram = np.histogram(distances.numpy(), bins=edges)[0]
    overlaps = [float(member(ids, last)[0].double().mean())
                for last, ids in zip(trace, trace[1:], strict=False)
                if ids.numel()]
    used = counts > 0
    corr = 0.0
    if int(used.sum()) > 1:
        a, b = _ranks(degrees[used]), _ranks(counts[used])
        a, b = a - a.mean(), b - b.mean()
        corr = float((a * b).sum() / (a.norm() * b.norm()).clamp(min=1e-12))
    return {
        "batches": len(trace),
        "accesses": accesses,
        "rows_touched": int(used.sum()),
        "rows_for_80pct": rows_80 / num_rows,
        "frequency_cdf": {k: v.tolist() for k, v in cdf.items()},
        "reuse_distance": {"edges": edges[:-1],
                           "counts": histogram.tolist(),
                           "never": accesses - int(distances.numel())},
        "accesses_per_hop": hop_counts.sum(1).tolist(),
        "degree_correlation": corr,
        "adjacent_overlap": float(np.mean(overlaps)) if overlaps else 0.0,
    }


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks (0 = smallest) as float64, for a Spearman correlation."""
    return values.double().argsort().argsort().double()

"""What a partition costs a distributed epoch, counted on one machine.

`partition_stats` replays one training epoch of every part's trainer on the
whole graph with the sampler training uses (distributed sampling in DGL
returns the same neighbourhoods as sampling the whole graph, only from
several servers) and counts, per part:

* **remote feature rows / bytes**: input rows of its batches that the part
  neither owns nor replicates, so they cross the network;
* **remote sampling requests**: vertices whose neighbours a batch samples
  (the destination vertices of every block) owned by another part, which
  DGL sends to that part's server;
* **fast-tier hit rate**: the share of the part's row reads that a static
  cache of its machine's fast-tier budget (device + host), filled with the
  part's most-read rows from a profile with another seed, would serve;
* **hot fill**: the bytes of the job's hot rows (the most-read rows that
  all machines' fast tiers together can hold) that the part owns, over
  its machine's fast-tier budget: 1.0 means its fast tiers hold exactly
  its own hot rows, above 1.0 some of them do not fit.

and for the whole partition the **edge cut** (share of edges whose ends
have different owners) and the **replication factor** (feature rows stored
over all parts per vertex).

`assign_and_count` assigns with the profile of training and counts the
result, as ``hmgraph partition`` and bench/partition.py do.
"""

from __future__ import annotations

import time

import torch

from hmgraph.partition.methods import assign

__all__ = ["assign_and_count", "edge_cut", "partition_stats"]


def edge_cut(graph, parts: torch.Tensor) -> float:
    """Share of ``graph``'s edges whose ends are owned by different parts."""
    src, dst = graph.edges()
    if src.numel() == 0:
        return 0.0
    return float((parts[src] != parts[dst]).double().mean())


def partition_stats(graph, assignment, graph_sampler, train_ids: torch.Tensor,
                    batch_size: int, row_bytes: int, *, budgets=None,
                    profile=None, seed: int = 1, progress=None) -> dict:
    """Edge cut, replication and one epoch's remote traffic per part.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The whole graph.
    assignment : hmgraph.partition.Assignment
        Owners and replicas.
    graph_sampler : dgl.dataloading.BlockSampler
        The sampler of training.
    train_ids : torch.Tensor
        Training vertices; each part trains on those it owns.
    batch_size : int
        Seeds per batch.
    row_bytes : int
        Bytes of one feature row.
    budgets : sequence of int, optional
        Fast-tier bytes per part's machine, for the hit rates.
    profile : callable, optional
        ``profile(seeds) -> counts`` filling the fast tiers (a profile
        with another seed than ``seed``).
    seed : int
        Seed of the epoch's shuffle and of DGL's generator.
    progress : callable, optional
        Wraps each part's batch loop (e.g. ``tqdm``); called with the
        iterable and ``desc``.

    Returns
    -------
    dict
        ``edge_cut``, ``replication_factor`` and totals, plus ``parts``: a
        list of per-part dicts.
    """
    parts = assignment.parts
    counted = budgets is not None and profile is not None
    hot = _hot_rows(assignment.num_nodes, budgets, profile, train_ids,
                    row_bytes) if counted else None
    per_part = []
    for part in range(assignment.num_parts):
        seeds = train_ids[parts[train_ids] == part]
        generator = torch.Generator().manual_seed(seed + part)
        seeds = seeds[torch.randperm(seeds.numel(), generator=generator)]
        fast = None
        if counted and seeds.numel():
            fast = _hot_rows(assignment.num_nodes, [budgets[part]], profile,
                             seeds, row_bytes)
        batches = range(0, seeds.numel(), batch_size)
        if progress is not None:
            batches = progress(batches, desc=f"part {part}")
        counts = _count_epoch(graph, graph_sampler, assignment, part, seeds,
                              batches, batch_size, fast, seed)
        per_part.append(_part_record(
            assignment, part, seeds, counts, row_bytes, fast is not None,
            None if hot is None else int((hot & (parts == part)).sum())
            * row_bytes / max(1, int(budgets[part]))))
    total = {key: sum(p[key] for p in per_part)
             for key in ("rows_read", "remote_rows", "remote_bytes",
                         "sampling_requests", "remote_sampling_requests")}
    return {
        "method": assignment.method,
        "num_parts": assignment.num_parts,
        "edge_cut": edge_cut(graph, parts),
        "replication_factor": assignment.replication_factor(),
        **total,
        "parts": per_part,
    }


def _part_record(assignment, part: int, seeds: torch.Tensor, counts: dict,
                 row_bytes: int, cached: bool,
                 hot_fill: float | None) -> dict:
    """Part ``part``'s entry of `partition_stats`'s ``parts`` list.

    ``counts`` are `_count_epoch`'s; ``cached`` says whether the part's
    fast tiers were filled (else its ``fast_hit_rate`` is None).
    """
    reads, remote_rows = counts["rows_read"], counts["remote_rows"]
    return {
        "part": part,
        "owned": int((assignment.parts == part).sum()),
        "replicated": int(assignment.replicas[part].numel()),
        "train": int(seeds.numel()),
        "rows_read": reads,
        "remote_rows": remote_rows,
        "remote_bytes": remote_rows * row_bytes,
        "local_read_rate": 1.0 - remote_rows / reads if reads else 0.0,
        "sampling_requests": counts["sampling_requests"],
        "remote_sampling_requests": counts["remote_sampling_requests"],
        "fast_hit_rate": counts["hits"] / reads if cached and reads
        else None,
        "hot_fill": hot_fill,
    }


def _hot_rows(num_nodes: int, budgets, profile, seeds: torch.Tensor,
              row_bytes: int) -> torch.Tensor:
    """The rows ``budgets`` (bytes, summed) hold, most read first.

    Returns
    -------
    torch.Tensor
        bool (num_nodes,): the ``sum(budgets) // row_bytes`` rows that
        ``profile(seeds)`` counts most; none when that is 0 (the
        profile is then not run).
    """
    rows = min(num_nodes, sum(int(b) for b in budgets) // max(1, row_bytes))
    hot = torch.zeros(num_nodes, dtype=torch.bool)
    if rows:
        counts = profile(seeds)
        hot[torch.topk(counts, rows, sorted=False).indices] = True
    return hot


def _count_epoch(graph, graph_sampler, assignment, part: int,
                 seeds: torch.Tensor, batches, batch_size: int,
                 fast: torch.Tensor | None, seed: int) -> dict:
    """Replay part ``part``'s epoch over ``batches`` (starts in ``seeds``).

    Returns
    -------
    dict
        ``rows_read``, ``remote_rows`` (neither owned nor replicated),
        ``hits`` (rows in ``fast``; 0 without it), ``sampling_requests``
        and ``remote_sampling_requests`` (destinations another part owns).
    """
    # Lazy: DGL takes 4 s to import; reading METHODS needs none.
    import dgl

    parts = assignment.parts
    local = torch.zeros(assignment.num_nodes, dtype=torch.bool)
    local[assignment.local_ids(part)] = True
    dgl.seed(seed + part)
    reads = remote_rows = requests = remote_requests = hits = 0
    for start in batches:
        batch = seeds[start:start + batch_size]
        input_nodes, _, blocks = graph_sampler.sample(graph, batch)
        reads += input_nodes.numel()
        remote_rows += int((~local[input_nodes]).sum())
        if fast is not None:
            hits += int(fast[input_nodes].sum())
        for block in blocks:
            dst = block.dstdata[dgl.NID]
            requests += dst.numel()
            remote_requests += int((parts[dst] != part).sum())
    return {"rows_read": reads, "remote_rows": remote_rows, "hits": hits,
            "sampling_requests": requests,
            "remote_sampling_requests": remote_requests}


def assign_and_count(graph, num_parts: int, method: str, *,
                     train_ids: torch.Tensor, fanouts, batch_size: int,
                     row_bytes: int, budgets=None, clusters=None,
                     replication: float = 0.5, seed: int = 0,
                     count: bool = True, progress=None) -> tuple:
    """`assign` on the profile of training, then `partition_stats`.

    The methods that need a profile rank vertices by their
    `hmgraph.samplers.presample.expected_reads` under ``fanouts``; the
    statistics replay one epoch of ``NeighborSampler(fanouts)``, the fast
    tiers filled from a `presample.epoch_counts` profile of it.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The whole graph.
    num_parts, method, clusters, replication
        As `assign` takes them.
    train_ids : torch.Tensor
        Training vertices.
    fanouts : list of int
        Neighbours per layer of the sampler of training.
    batch_size : int
        Seeds per batch.
    row_bytes : int
        Bytes of one feature row.
    budgets : sequence of int, optional
        Fast-tier bytes of each part's machine.
    seed : int
        Seed of `assign` and of the fast tiers' profile; the epoch counted
        is seeded ``seed + 1``.
    count : bool
        False: no statistics (an empty dict).
    progress : callable, optional
        As `partition_stats` takes it.

    Returns
    -------
    tuple
        ``(assignment, stats, seconds)``: the `Assignment`,
        `partition_stats`'s dict and a dict of ``assign_seconds`` and
        ``stats_seconds``, the time each step took.
    """
    # Lazy: DGL (with the samplers) takes 4 s to import; reading METHODS
    # needs none.
    import dgl

    from hmgraph.samplers.presample import epoch_counts, expected_reads

    began = time.perf_counter()
    assignment = assign(
        graph, num_parts, method, train_ids=train_ids,
        profile=lambda seeds: expected_reads(graph, seeds, fanouts),
        clusters=clusters, replication=replication, budgets=budgets,
        row_bytes=row_bytes, seed=seed)
    seconds = {"assign_seconds": time.perf_counter() - began}
    began, stats = time.perf_counter(), {}
    if count:
        sampler = dgl.dataloading.NeighborSampler(fanouts)
        stats = partition_stats(
            graph, assignment, sampler, train_ids, batch_size, row_bytes,
            budgets=budgets, seed=seed + 1, progress=progress,
            profile=lambda seeds: epoch_counts(graph, sampler, seeds,
                                               batch_size, seed))
    seconds["stats_seconds"] = time.perf_counter() - began
    return assignment, stats, seconds

"""Cache-hit analysis: every policy replayed on one trace, against OPT.

`analyze` records the access trace of an epoch (unique input ids per batch,
with the hop at which each row was needed), replays every cache policy of
`hmgraph.cache.policies` on it at several budgets, computes Belady's
optimal hit rate on the same trace and capacity, and describes the trace
(frequency skew, reuse distances, accesses per hop, degree correlation,
overlap of adjacent batches). The policies are the loader's own id-level
state machines, so a replayed hit rate is the hit rate the loader counts.

A disk charges by block and request, not by row, so given the feature
file's row size `analyze` also costs each replay's missed rows in storage
blocks (`PageView`): per epoch, the blocks and requests the misses of each
batch need in 4 KiB pages and in the disk's logical blocks, with the rows
where the file has them and renumbered hottest first. Belady's misses,
costed the same way, are the page-level reference.

The description of the trace lives in `hmgraph.trace_stats`, the markdown
summary in `hmgraph.analysis_summary`; both are importable from here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from hmgraph import datasets
from hmgraph.analysis_summary import summary_markdown
from hmgraph.benchmark import write_results
from hmgraph.cache.disk import disk_model, read_plan
from hmgraph.cache.format import DATA_OFFSET, PAGE_BYTES
from hmgraph.cache.plan import belady_policy, make_plan, replay_hits
from hmgraph.cache.policies import make_policy
from hmgraph.cache.reuse import member
from hmgraph.trace_stats import trace_stats

log = logging.getLogger(__name__)

__all__ = ["AnalysisConfig", "PageView", "analyze", "reuse_filtered",
           "summary_markdown", "trace_stats"]

DEFAULT_BUDGETS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.40)
WINDOWS = (0, 1, 4, 16)


@dataclass
class AnalysisConfig:
    """What to analyse.

    Attributes
    ----------
    budgets : tuple of float
        Cache capacities as shares of the feature rows.
    profile_batches : int
        Batches of a separate profiling pass (other seed) that static
        policies and the hmgraph plan are made from.
    device_share : float
        Share of each budget on the device tier, for the per-tier view.
    """

    budgets: tuple = DEFAULT_BUDGETS
    profile_batches: int = 32
    windows: tuple = WINDOWS
    device_share: float = 0.2


def reuse_filtered(trace, levels: int):
    """The trace minus rows that batch reuse serves, and reuse hits.

    Returns
    -------
    (list of torch.Tensor, int)
        Per batch the ids left for the cache, and rows reused in all.
    """
    rest, reused = [], 0
    last = older = torch.zeros(0, dtype=torch.int64)
    for ids in trace:
        found = member(ids, last)[0]
        if levels == 2:
            found |= member(ids, older)[0]
            older = last[~member(last, ids)[0]]
        reused += int(found.sum())
        rest.append(ids[~found])
        last = ids
    return rest, reused


class PageView:
    """Where feature rows lie on storage, to cost reads in blocks.

    Two layouts: ``"file"`` (row ``i`` where the feature file has it) and
    ``"hot-first"`` (rows renumbered by profiled accesses, hottest first:
    a row's new id is its rank in a stable descending sort of ``counts``).
    In either, row ``i`` occupies bytes ``[data_offset + i * row_bytes,
    data_offset + (i + 1) * row_bytes)``.

    Parameters
    ----------
    row_bytes : int
        Bytes of one feature row.
    counts : torch.Tensor
        Profiled accesses per row (num_rows,); they order the hot-first
        layout.
    block_sizes : tuple of int
        Block sizes (bytes) to cost reads in, e.g. ``(4096, 512)``.
    data_offset : int
        Byte offset of row 0 in the file (default ``DATA_OFFSET``).

    Examples
    --------
    >>> view = PageView(1024, torch.tensor([0, 5, 0, 5]), (4096,))
    >>> view.cost(torch.tensor([1, 3])).tolist()  # [[blocks, requests]]
    [[[1, 1]], [[1, 1]]]
    """

    layouts = ("file", "hot-first")

    def __init__(self, row_bytes: int, counts: torch.Tensor,
                 block_sizes: tuple = (PAGE_BYTES,),
                 data_offset: int = DATA_OFFSET):
        if row_bytes < 1:
            raise ValueError(f"row_bytes must be positive, got {row_bytes}")
        if not block_sizes or min(block_sizes) < 1:
            raise ValueError(
                f"block sizes must be positive, got {block_sizes}")
        self.row_bytes = int(row_bytes)
        self.block_sizes = tuple(int(b) for b in block_sizes)
        self.data_offset = int(data_offset)
        order = torch.argsort(counts, descending=True, stable=True).numpy()
        self.rank = np.empty(len(order), dtype=np.int64)
        self.rank[order] = np.arange(len(order), dtype=np.int64)
        # Scratch mask that sorts renumbered ids; all False between calls.
        self._mask = np.zeros(len(order), dtype=bool)

    def zeros(self) -> np.ndarray:
        """An empty cost: int64 (layouts, block sizes, 2)."""
        return np.zeros((len(self.layouts), len(self.block_sizes), 2),
                        dtype=np.int64)

    def cost(self, ids: torch.Tensor) -> np.ndarray:
        """Blocks and requests that reading the rows ``ids`` takes.

        Exact cost: the runs of adjacent blocks that hold the rows, no gap
        read through (`hmgraph.cache.disk.read_plan` with
        ``max_gap_blocks=0``).

        Parameters
        ----------
        ids : torch.Tensor
            Sorted unique int64 row ids (CPU), in file numbering.

        Returns
        -------
        numpy.ndarray
            int64 (layouts, block sizes, 2): blocks read and requests,
            per layout of `layouts` and size of ``block_sizes``.
        """
        out = self.zeros()
        if not ids.numel():  # read_plan needs at least one row
            return out
        ids = ids.numpy()
        self._mask[self.rank[ids]] = True
        hot = np.flatnonzero(self._mask)
        self._mask[hot] = False
        for layout, rows in enumerate((ids, hot)):
            for size, block_bytes in enumerate(self.block_sizes):
                plan = read_plan(rows, self.row_bytes, self.data_offset,
                                 block_bytes, 0)
                out[layout, size] = plan.blocks, plan.runs
        return out


def _replay_rate(policy, trace, requested, reused=0, window=None,
                 pages=None, lookahead=None):
    """Hit rate of a replay (reused rows count as hits), and the summed
    `PageView.cost` of each batch's missed rows (None without ``pages``);
    ``lookahead`` as in `replay_hits`.
    """
    cost = pages.zeros() if pages is not None else None

    def add_cost(missed):
        cost[...] += pages.cost(missed)

    hits, _ = replay_hits(policy, trace, window,
                          add_cost if pages is not None else None,
                          lookahead=lookahead)
    return ((hits + reused) / requested if requested else 0.0), cost


def analyze(trace, hop_counts, degrees, profile, num_rows: int,
            config: AnalysisConfig, progress=None, *,
            row_bytes: int | None = None,
            disk_block_bytes: int = 512) -> dict:
    """Replay every policy on ``trace`` at every budget.

    Parameters
    ----------
    trace : list of torch.Tensor
        Sorted unique input ids per batch of the analysed epoch.
    hop_counts : torch.Tensor
        (hops + 1, num_rows) accesses per hop in that epoch.
    degrees : torch.Tensor
        In-degree per row.
    profile : hmgraph.samplers.Profile
        A separate profiling pass (static contents and plans come from it,
        not from the trace being scored).
    num_rows : int
        Rows of the feature matrix.
    config : AnalysisConfig
    progress : callable, optional
        Wraps the list of budgets (e.g. ``tqdm``).
    row_bytes : int, optional
        Bytes of one feature row. Given, the missed rows of every replay
        are also costed in storage blocks (see `PageView`); default None
        skips that view.
    disk_block_bytes : int
        The disk's logical block size (bytes), the second block size the
        page-level view costs reads in (the first is 4 KiB pages).
        Default 512.

    Returns
    -------
    dict
        ``hit_rate[policy][budget]``, ``tiers`` (device / host hits of the
        hmgraph plan per budget), ``seconds`` per policy, ``stats`` of the
        trace. With ``row_bytes`` also ``bytes``: records ``{policy,
        budget, layout, block_bytes, bytes, requests, vs_no_cache,
        vs_belady}`` of storage reads per epoch, ``no_cache_bytes``:
        records ``{layout, block_bytes, bytes, requests}`` of reading every
        batch whole, and ``page_view``: the row and block sizes used.
    """
    requested = sum(t.numel() for t in trace)
    filtered = {levels: reuse_filtered(trace, levels) for levels in (1, 2)}
    context = {"degrees": degrees, "hotness": profile.counts,
               "hop_counts": profile.hop_counts}
    pages = None
    if row_bytes is not None:
        pages = PageView(row_bytes, profile.counts,
                         tuple(dict.fromkeys((PAGE_BYTES, disk_block_bytes))))
    rates: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    tiers: dict[str, dict] = {}
    plans: dict[str, dict] = {}
    costs: dict[str, dict] = {}
    budgets = list(config.budgets)
    if progress is not None:
        budgets = progress(budgets)
    for budget in budgets:
        key = f"{budget:g}"
        capacity = int(budget * num_rows)
        plan, replays = _replay_budget(trace, requested, filtered, profile,
                                       context, capacity, num_rows,
                                       config.windows, pages)
        for name, (rate, cost), spent in replays:
            rates.setdefault(name, {})[key] = rate
            if cost is not None:
                costs.setdefault(key, {})[name] = cost
            seconds[name] = seconds.get(name, 0.0) + spent
        plans[key] = {"static_rows": plan.static_rows, "curve": plan.curve}
        tiers[key] = _tier_hits(trace, profile, plan, capacity,
                                config.device_share, num_rows)
    result = {"hit_rate": rates, "tiers": tiers, "plans": plans,
              "seconds": seconds,
              "stats": trace_stats(trace, hop_counts, degrees, num_rows)}
    if pages is not None:
        result.update(_bytes_view(pages, trace, costs, disk_block_bytes))
    return result


def _replay_budget(trace, requested: int, filtered: dict, profile,
                   context: dict, capacity: int, num_rows: int, windows,
                   pages) -> tuple:
    """Replay every policy on ``trace`` with a cache of ``capacity`` rows.

    The plain policies, the hmgraph plan at each of ``windows``, hmgraph
    behind one and two levels of batch reuse (``filtered[levels]`` is
    `reuse_filtered`'s ``(rest, reused)``), and Belady's optimum.

    Returns
    -------
    tuple
        ``(plan, replays)``: the hmgraph plan (static split from the
        profile) and a list of ``(name, (hit_rate, cost), seconds)``, one
        per replay, in the order they ran.
    """
    replays = []

    def timed(name, build, requests, reused=0, **options):
        # The policy's construction counts in the replay's seconds.
        began = time.perf_counter()
        replayed = _replay_rate(build(), requests, requested, reused,
                                pages=pages, **options)
        replays.append((name, replayed, time.perf_counter() - began))

    for name in ("degree", "presample", "layer-aware", "lru", "clock"):
        timed(name, partial(make_policy, name, num_rows, capacity,
                            **context), trace)
    # The hmgraph plan (static split from the profile), per window.
    plan = make_plan("hmgraph", num_rows, 1, capacity, 0,
                     counts=profile.counts, trace=profile.trace, window=4)
    hmgraph = partial(make_policy, "hmgraph", num_rows, capacity,
                      hotness=profile.counts, static_rows=plan.static_rows)
    for window in windows:
        timed(f"hmgraph-w{window}", partial(hmgraph, window=window), trace,
              window=window)
    # With batch reuse the cache is asked for what reuse did not serve
    # and looks ahead at the next batches whole, as the loader runs it.
    for levels in (1, 2):
        rest, reused = filtered[levels]
        timed(f"hmgraph+reuse{levels}", partial(hmgraph, window=4), rest,
              reused, window=4, lookahead=trace)
    timed("belady", partial(belady_policy, trace, num_rows, capacity), trace)
    return plan, replays


def _ratio(value: int, reference: int) -> float | None:
    """``value / reference``; 1.0 for 0 / 0, None for x / 0."""
    if reference:
        return value / reference
    return 1.0 if value == 0 else None


def _bytes_view(pages: PageView, trace, costs: dict,
                disk_block_bytes: int) -> dict:
    """Records of storage reads per epoch: policies, Belady, no cache.

    ``costs[budget][policy]`` is a summed `PageView.cost`; no cache reads
    every batch's ids whole.
    """
    none = pages.zeros()
    for ids in trace:
        none += pages.cost(ids)
    block_sizes = np.array(pages.block_sizes, dtype=np.int64)
    none_bytes = none[..., 0] * block_sizes
    records = []
    for budget, by_policy in costs.items():
        opt_bytes = by_policy["belady"][..., 0] * block_sizes
        for name, cost in by_policy.items():
            nbytes = cost[..., 0] * block_sizes
            for (layout, size), value in np.ndenumerate(nbytes):
                records.append({
                    "policy": name, "budget": float(budget),
                    "layout": pages.layouts[layout],
                    "block_bytes": int(block_sizes[size]),
                    "bytes": int(value),
                    "requests": int(cost[layout, size, 1]),
                    "vs_no_cache": _ratio(int(value),
                                          int(none_bytes[layout, size])),
                    "vs_belady": _ratio(int(value),
                                        int(opt_bytes[layout, size])),
                })
    no_cache = [{"layout": pages.layouts[layout],
                 "block_bytes": int(block_sizes[size]),
                 "bytes": int(value), "requests": int(none[layout, size, 1])}
                for (layout, size), value in np.ndenumerate(none_bytes)]
    return {"bytes": records, "no_cache_bytes": no_cache,
            "page_view": {"row_bytes": pages.row_bytes,
                          "data_offset": pages.data_offset,
                          "page_bytes": PAGE_BYTES,
                          "disk_block_bytes": int(disk_block_bytes)}}


def _tier_hits(trace, profile, plan, capacity, device_share, num_rows):
    """Device / host / storage shares of the hmgraph plan (window 4).

    Static rows sit hottest-first on the device, then in host memory;
    dynamic rows count for the tier of the slot they take, approximated
    here by the device's share of the dynamic region.
    """
    device_rows = int(capacity * device_share)
    policy = make_policy("hmgraph", num_rows, capacity,
                         hotness=profile.counts,
                         static_rows=plan.static_rows, window=4)
    order = policy.warm()
    on_device = torch.zeros(num_rows, dtype=torch.bool)
    on_device[order[:device_rows]] = True
    dynamic_device = max(0, device_rows - plan.static_rows)
    dynamic_share = dynamic_device / max(1, capacity - plan.static_rows)
    device = host = requested = 0.0
    for index, ids in enumerate(trace):
        step = policy.step(ids, trace[index + 1:index + 5])
        hit = ids[step.hit]
        static_hits = policy.static[hit]
        device_static = int((on_device[hit] & static_hits).sum())
        dynamic = int((~static_hits).sum())
        device += device_static + dynamic * dynamic_share
        host += int(static_hits.sum()) - device_static + dynamic * (
            1 - dynamic_share)
        requested += ids.numel()
    requested = max(requested, 1)
    return {"device": device / requested, "host": host / requested,
            "storage": 1 - (device + host) / requested}


def run(args) -> dict:
    """``hmgraph analyze``: trace an epoch, replay, write JSON/PNG/md."""
    # Lazy: matplotlib and DGL (through the samplers and training) take
    # 5 s to import; the replays above need neither.
    from hmgraph.plots import plot_analysis
    from hmgraph.samplers.presample import presample
    from hmgraph.train import TrainConfig, make_sampler

    budgets = tuple(args.budgets)
    data = datasets.load(args.dataset, args.root, verify=not args.no_verify,
                         features_on="disk")
    config = TrainConfig(dataset=args.dataset, fanouts=args.fanouts,
                         batch_size=args.batch_size, sampler=args.sampler,
                         clusters=args.clusters, locality=args.locality,
                         renumber=False)
    data, sampler = make_sampler(config, data)
    seeds = data.split["train"]
    total = -(-seeds.numel() // args.batch_size)
    batches = min(args.batches or total, total)
    log.info("tracing %d batches of %s", batches, args.dataset)
    epoch = presample(data.graph, sampler, seeds, args.batch_size, batches,
                      seed=args.seed, progress=tqdm)
    profile = presample(data.graph, sampler, seeds, args.batch_size,
                        args.profile_batches, seed=args.seed + 1)
    disk = disk_model(data.feature_path)
    log.info("disk: %s", disk.describe())
    began = time.perf_counter()
    result = analyze(epoch.trace, epoch.hop_counts, data.graph.in_degrees(),
                     profile, data.num_nodes,
                     AnalysisConfig(budgets=budgets,
                                    profile_batches=args.profile_batches),
                     progress=lambda b: tqdm(b, desc="budgets"),
                     row_bytes=data.manifest.row_bytes,
                     disk_block_bytes=disk.block_bytes)
    result["replay_seconds"] = time.perf_counter() - began
    result["config"] = {
        "dataset": args.dataset, "fanouts": args.fanouts,
        "batch_size": args.batch_size, "batches": batches,
        "sampler": args.sampler, "budgets": budgets, "seed": args.seed,
        "profile_batches": args.profile_batches,
        "disk": disk.as_dict(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # One file per (dataset, sampler): a cluster trace does not overwrite
    # the neighbour sampler's.
    stem = f"analyze-{args.dataset}" + (
        "" if args.sampler == "neighbor" else f"-{args.sampler}")
    result["plots"] = [str(p) for p in plot_analysis(result, out, stem)]
    markdown = (f"# Cache-hit analysis: {args.dataset}\n\n"
                f"{batches} batches of {args.batch_size} seeds, "
                f"{args.sampler} sampler, fanouts "
                f"{','.join(map(str, args.fanouts))}; static contents and "
                f"plans from a separate {args.profile_batches}-batch "
                f"profile. Replay took {result['replay_seconds']:.0f} s."
                f"\n\n" + summary_markdown(result) + "\n")
    write_results(result, markdown, out / f"{stem}.json")
    print(markdown)
    return result

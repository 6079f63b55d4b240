"""What the per-batch mechanisms cost on this machine, against what they
save: the planner's reason to turn one off.

Batch reuse and the lookahead window each spend CPU time on every batch
(passes over its ids, rows copied) to save work elsewhere (rows not sent
to the device, not read from the file, not gathered twice). Whether that
pays depends on the machine and the workload: on a CPU device with the
features in memory a row reused saves one gather and costs two copies
and a few table lookups; on a GPU box with features on disk it saves a
transfer and a read.

`measure_kernel_costs` times the compiled kernels that do that work
(`hmgraph.cache.reuse_engine`) once per process and row size, on ids
drawn at random over a table larger than the caches of the CPU, as a
batch's ids hit the per-node tables: seconds per id of a lookup pass, of
a table write, of one radix pass, and per row copied. `reuse_verdict`
and `window_verdict` price a mechanism's work per batch with them and
set it beside what it saves per batch on the profiled trace; the
`Verdict` says whether it pays, in one line for the log.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from hmgraph.cache import reuse_engine
from hmgraph.cache.feature import Feature, TensorFeature
from hmgraph.cache.placement import PRICED_BATCHES, planned_read
from hmgraph.cache.policy_base import hot_first
from hmgraph.cache.reuse_sizing import reused_in

__all__ = ["KernelCosts", "Verdict", "lost_hit_share", "measure_kernel_costs",
           "random_rows", "reuse_verdict", "reused_rows",
           "spared_read_seconds", "staging_verdict", "static_verdict",
           "window_verdict"]

#: Rows of the table the kernels are timed on (48 MB at 12 bytes a
#: node): past the last-level cache, so an id's lookup is a memory access
#: as in a graph of millions of nodes.
_TABLE_ROWS = 1 << 22
#: Ids (and rows) per timed call.
_SAMPLE = 1 << 17


@dataclass(frozen=True)
class KernelCosts:
    """Seconds per id or row of the compiled per-batch kernels.

    Attributes
    ----------
    scan : float
        One pass over a batch's ids reading their per-node table entry
        (`reuse_engine.scan_batch`), per id.
    stamp : float
        One write into a per-node table (`reuse_engine.stamp_ids`, as
        the window's marks), per id.
    sort_pass : float
        One 11-bit digit of the radix sort of ids (`reuse_engine.
        sort_rest`), per id.
    copy_row : float
        One row of ``row_bytes`` copied from a random row of a buffer
        (`reuse_engine.gather_reused`), per row.
    row_bytes : int
        The row size ``copy_row`` was timed with.
    transfer_bytes_per_s : float or None
        Pinned host-to-device bytes/s on a CUDA device; None on a CPU
        device, where nothing is transferred.
    """

    scan: float
    stamp: float
    sort_pass: float
    copy_row: float
    row_bytes: int
    transfer_bytes_per_s: float | None = None

    def transfer_row(self) -> float:
        """Seconds to send one row to the device (0.0 on a CPU)."""
        if not self.transfer_bytes_per_s:
            return 0.0
        return self.row_bytes / self.transfer_bytes_per_s


@dataclass(frozen=True)
class Verdict:
    """A mechanism's modelled seconds per batch: what it saves, what it
    costs.

    Attributes
    ----------
    mechanism : str
        Its name as the log says it (``"batch reuse (two-level)"``,
        ``"window of 4"``).
    saves, costs : float
        Seconds per batch.
    detail : str
        What the figures rest on, for the log line.
    """

    mechanism: str
    saves: float
    costs: float
    detail: str

    @property
    def pays(self) -> bool:
        """Whether it saves more than it costs."""
        return self.saves > self.costs

    def describe(self, flag: str, forced: bool = False) -> str:
        """One line: on, off, or kept as asked though it does not pay;
        both figures, the detail, and the setting that decides
        (``flag``: what forces it where it is off, or what asked for
        it where ``forced``)."""
        if self.pays:
            state, tail = "on", ""
        elif forced:
            state, tail = "kept though it does not pay", f"; {flag} asks " \
                "for it"
        else:
            state, tail = "off", f"; {flag} forces it"
        return (f"{self.mechanism} {state}: saves {1e3 * self.saves:.2f} ms "
                f"a batch, costs {1e3 * self.costs:.2f} ms ({self.detail})"
                f"{tail}")


def _best(call, repeats: int = 3) -> float:
    """Fewest seconds of ``repeats`` calls (after one untimed)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best


@functools.lru_cache(maxsize=8)
def measure_kernel_costs(row_bytes: int, device: str = "cpu") -> KernelCosts:
    """Time the per-batch kernels once for rows of ``row_bytes``.

    Parameters
    ----------
    row_bytes : int
        Bytes per feature row.
    device : str
        The training device; on ``"cuda..."`` a pinned 64 MB copy to it is
        timed too.

    Returns
    -------
    KernelCosts
        Cached for the process: the same arguments are timed once (some
        0.1 s once the kernels are loaded, most of it the tables' first
        touch).
    """
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    rng = np.random.default_rng(0)
    count = _SAMPLE
    table = _mixed_table(rng, count)
    ids = rng.integers(0, _TABLE_ROWS, count, dtype=np.int64)
    scratch = np.empty((4, count), dtype=np.int64)
    source, rest, keep, keys = scratch
    scan = _best(lambda: reuse_engine.scan_batch(
        ids, table, 3, 2, 0, 0, 0, 0, count, 8, 2, count, source, rest,
        keep, keys)) / count
    stamp = _best(lambda: reuse_engine.stamp_ids(table, ids, 5)) / count
    wanted, where, spare = np.empty((3, count), dtype=np.int64)
    order = np.arange(count, dtype=np.int64)
    passes = reuse_engine.radix_passes(_TABLE_ROWS)
    sort_pass = _best(lambda: reuse_engine.sort_rest(
        ids, order, count, passes, wanted, source, where, keys,
        spare)) / (count * passes)
    rows = max(1, min(_SAMPLE, (64 << 20) // row_bytes))
    ring = np.ones((rows, row_bytes), dtype=np.uint8)
    out = np.empty_like(ring)
    positions = rng.integers(0, rows, rows, dtype=np.int64)
    copy = _best(lambda: reuse_engine.gather_reused(positions, ring, out))
    return KernelCosts(scan=scan, stamp=stamp, sort_pass=sort_pass,
                       copy_row=copy / rows, row_bytes=row_bytes,
                       transfer_bytes_per_s=_transfer_rate(device))


def _mixed_table(rng, ring_rows: int) -> np.ndarray:
    """A reuse table as a batch finds it: a third of the nodes held by
    the last batch, a third by the one before, the rest by none, at
    random ring rows, with random lookahead stamps, so that the scan's
    branches go either way as often as in a real batch."""
    table = np.empty((_TABLE_ROWS, 3), dtype=np.int32)
    table[:, 0] = rng.integers(0, 3, _TABLE_ROWS)  # batch 3: ages 3, 2, 1
    table[:, 1] = rng.integers(0, ring_rows, _TABLE_ROWS)
    table[:, 2] = rng.integers(6, 9, _TABLE_ROWS)  # value 8: 8, 7 or none
    return table


def _transfer_rate(device: str) -> float | None:
    """Pinned host-to-device bytes/s of a 64 MB copy; None off CUDA."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    target = torch.empty_like(host, device=device)

    def send():
        target.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    return host.numel() / _best(send)


def spared_read_seconds(source: Feature, trace, miss_share: float,
                        spared, batches: int = PRICED_BATCHES,
                        seed: int = 0) -> float:
    """Seconds a batch's storage reads get shorter when a mechanism
    spares rows, on the profile.

    Parameters
    ----------
    source : Feature
        Where missed rows come from: nothing is read for rows in memory
        (0.0); a storage tier's reads are planned as it plans them
        (`hmgraph.cache.readplan.read_plan`: block runs, gaps read
        through) and priced by its disk model.
    trace : sequence of torch.Tensor
        Profiled sorted unique ids per batch.
    miss_share : float
        Share of a batch's rows the cache misses: that share of them, at
        random, is what the storage tier reads.
    spared : callable
        ``spared(t, ids)``: bool per id of batch ``t``, the rows the
        mechanism serves instead.
    batches : int
        Profiled batches priced (the first ones).
    seed : int
        Seed of the draw of misses.

    Returns
    -------
    float
        Mean over the batches of the modelled seconds of reading the
        misses less those of reading the misses not spared: where misses
        are dense (a batch reads most blocks of the file) sparing rows
        saves little, where they are scattered each spared row saves a
        request.
    """
    if isinstance(source, TensorFeature) or getattr(
            source, "disk", None) is None or not len(trace):
        return 0.0

    def seconds(ids: np.ndarray) -> float:
        return planned_read(source, ids)[0]

    rng = np.random.default_rng(seed)
    saved = []
    for t, ids in enumerate(trace[:batches]):
        missed = rng.random(len(ids)) < miss_share
        kept = missed & ~np.asarray(spared(t, ids), dtype=bool)
        ids = ids.numpy()
        saved.append(seconds(ids[missed]) - seconds(ids[kept]))
    return float(np.mean(saved))


def reused_rows(trace, levels: int):
    """``spared`` of `spared_read_seconds` for batch reuse: the rows of
    batch ``t`` that one of the ``levels`` batches before it asked for
    (`hmgraph.cache.reuse_sizing.reused_in`, as `reuse_profile` counts
    them)."""
    return lambda t, ids: reused_in(trace, t, levels).numpy()


def random_rows(share: float, seed: int = 1):
    """``spared`` of `spared_read_seconds` for ``share`` of a batch's
    rows at random (the hits a window gains, spread over the misses)."""
    rng = np.random.default_rng(seed)
    return lambda t, ids: rng.random(len(ids)) < share


def lost_hit_share(counts: torch.Tensor, score: torch.Tensor, held: int,
                   kept: int) -> float:
    """Share of the profiled requests a cache stops serving when it holds
    ``kept`` rows instead of ``held``: those of the rows ranked ``kept``
    to ``held`` by ``score`` (the placement's, highest held first).

    Parameters
    ----------
    counts : torch.Tensor
        Profiled requests per row.
    score : torch.Tensor
        The placement's score per row (the counts, or the layer-aware
        score).
    held, kept : int
        Rows the cache holds without and with the change.
    """
    if kept >= held or not len(counts):
        return 0.0
    order = hot_first(score)[kept:held]
    total = float(counts.sum())
    return float(counts[order].sum()) / total if total else 0.0


def reuse_verdict(levels: int, sizing: dict, costs: KernelCosts,
                  hit_rate: float, read_s: float, num_rows: int,
                  lost: float = 0.0, lost_read_s: float = 0.0) -> Verdict:
    """Batch reuse's seconds per batch on the profile.

    Parameters
    ----------
    levels : int
        1 or 2.
    sizing : dict
        `hmgraph.cache.reuse_sizing.reuse_profile` of the profile:
        ``reuse_rate``, ``rows_per_batch``, ``kept_per_batch``.
    costs : KernelCosts
    hit_rate : float
        Share of the rows the cache below serves without reuse (for the
        log line).
    read_s : float
        Storage seconds per batch the reused rows spare
        (`spared_read_seconds` with `reused_rows`).
    num_rows : int
        Nodes of the graph: the ids' digits the radix sort passes over.
    lost : float
        Share of a batch's rows the cache below no longer serves because
        the ring and id table take its device room (`lost_hit_share`).
    lost_read_s : float
        Storage seconds per batch those rows add (`spared_read_seconds`
        with `random_rows`).

    Returns
    -------
    Verdict

    Notes
    -----
    Saved: per reused row its gather from the cache below and its
    transfer to the device; and ``read_s``. Spent per batch: one scan of
    the batch's ids, stamps of the next ``levels`` batches' ids, a radix
    sort of the rest, a copy of each reused row out of the ring and of
    each kept row into it (with its table entry written); and the device
    room the ring takes from the cache: a transfer per row it no longer
    serves, and ``lost_read_s``.
    """
    rows = sizing["rows_per_batch"]
    reused = sizing["reuse_rate"] * rows
    kept = sizing["kept_per_batch"]
    passes = reuse_engine.radix_passes(num_rows)
    saves = reused * (costs.copy_row + costs.transfer_row()) + read_s
    spends = (rows * (costs.scan + levels * costs.stamp)
              + (rows - reused) * passes * costs.sort_pass
              + reused * costs.copy_row + kept * (costs.copy_row
                                                  + costs.stamp)
              + lost * rows * costs.transfer_row() + lost_read_s)
    name = {1: "one-level", 2: "two-level"}[levels]
    return Verdict(
        f"batch reuse ({name})", saves, spends,
        f"{100 * sizing['reuse_rate']:.0f}% of {rows:,.0f} rows a batch "
        f"reused, {kept:,.0f} kept, cache hit rate {100 * hit_rate:.0f}% "
        f"({100 * lost:.1f}% of rows lost to the ring), "
        f"{1e3 * read_s:.2f} ms of reads spared, {1e3 * lost_read_s:.2f} "
        f"ms added")


def window_verdict(window: int, rows_per_batch: float, hits_gained: float,
                   costs: KernelCosts, read_s: float) -> Verdict:
    """The lookahead window's seconds per batch for a policy that looks
    ahead.

    Parameters
    ----------
    window : int
        Batches of lookahead.
    rows_per_batch : float
        Unique rows a batch asks for (profiled mean).
    hits_gained : float
        Share of requested rows that hit with the window and miss without
        it (replayed on the profile).
    costs : KernelCosts
    read_s : float
        Storage seconds per batch those hits spare
        (`spared_read_seconds` with `random_rows`).

    Returns
    -------
    Verdict

    Notes
    -----
    Saved per batch: ``read_s`` and, on a device, a transfer per hit
    gained. Spent per batch: each of the window's ids marked and
    unmarked, and its next use set in the policy: three table writes
    each.
    """
    saves = hits_gained * rows_per_batch * costs.transfer_row() + read_s
    spends = 3 * window * rows_per_batch * costs.stamp
    return Verdict(
        f"window of {window}", saves, spends,
        f"{100 * hits_gained:+.2f}% of rows hit with it, "
        f"{rows_per_batch:,.0f} rows a batch, {1e3 * read_s:.2f} ms of "
        f"reads spared")


def staging_verdict(window: int, rows_per_batch: float, capacity: int,
                    without: float, staged, costs: KernelCosts) -> Verdict:
    """Window read planning's seconds per batch on the profile.

    Parameters
    ----------
    window : int
        Batches of lookahead.
    rows_per_batch : float
        Unique rows a batch asks for (profiled mean).
    capacity : int
        Host rows of the staging area (taken from the cache's).
    without : float
        Modelled seconds of a batch's reads with no staging, the cache
        holding the whole host budget (`hmgraph.cache.staging_model.
        staged_reads` with no room).
    staged : hmgraph.cache.staging_model.StagedReads
        The same, the cache holding what the staging area leaves.
    costs : KernelCosts

    Returns
    -------
    Verdict

    Notes
    -----
    Saved per batch: the difference of the two reads (the host rows the
    area takes from the cache count against it: their misses are read).
    Spent per batch: the window's ids marked and passed over for rows
    worth bringing along; each row brought along copied in and out.
    """
    return Verdict(
        "window read planning", without - staged.seconds,
        _planning_work(window, rows_per_batch, staged, costs),
        f"reads modelled at {1e3 * without:.2f} ms a batch without it, "
        f"{1e3 * staged.seconds:.2f} ms with {staged.staged:,.0f} rows a "
        f"batch brought along into {capacity:,} host rows of the cache's "
        f"and {staged.served:,.0f} served from them")


def static_verdict(window: int, rows_per_batch: float, dynamic,
                   static_s: float, span_rows: int,
                   costs: KernelCosts) -> Verdict:
    """The ``hmgraph`` policy's dynamic region on the profile, against its
    tiers' rows all held static.

    Parameters
    ----------
    window : int
        Batches of lookahead of the plan with the dynamic region.
    rows_per_batch : float
        Unique rows a batch asks for (profiled mean).
    dynamic : hmgraph.cache.staging_model.StagedReads
        Modelled reads of a batch with the dynamic region (and staging,
        where the plan has it), replayed on held-out batches.
    static_s : float
        Modelled seconds of a batch's reads with every row of the tiers
        static (`hmgraph.cache.placement.choose_span_rows`), on the same
        batches.
    span_rows : int
        The spans those static rows lie in (0: the hottest rows).
    costs : KernelCosts

    Returns
    -------
    Verdict

    Notes
    -----
    Saved per batch: the reads the dynamic region spares. Spent per
    batch: the window's ids marked and passed over, and each row brought
    along copied in and out (as `staging_verdict`); the region's own
    choice and admissions are not counted, so the static plan is taken
    only where the reads alone favour it or the window's work outweighs
    what it spares.
    """
    held = f"in spans of {span_rows}" if span_rows else "by hotness"
    return Verdict(
        "the dynamic region", static_s - dynamic.seconds,
        _planning_work(window, rows_per_batch, dynamic, costs),
        f"reads modelled at {1e3 * static_s:.2f} ms a batch with every "
        f"row static ({held}), {1e3 * dynamic.seconds:.2f} ms with it, "
        f"window {window}, {dynamic.staged:,.0f} rows a batch brought "
        f"along")


def _planning_work(window: int, rows_per_batch: float, staged,
                   costs: KernelCosts) -> float:
    """Seconds a batch of window read planning spends: the window's ids
    marked and passed over, each row brought along (``staged``:
    `hmgraph.cache.staging_model.StagedReads`) copied in and out."""
    return window * rows_per_batch * (costs.stamp + costs.scan) \
        + 2 * staged.staged * costs.copy_row

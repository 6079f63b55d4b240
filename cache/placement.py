"""Static placement for a file read through gaps: whole spans of rows.

A storage tier reads through every gap shorter than the disk's
break-even gap (`hmgraph.cache.disk.DiskModel.gap_bytes`). Where a batch
asks for most blocks of the file (small rows, dense batches), a row the
cache holds between two rows it misses lies in such a gap and is read
anyway: holding the hottest rows, scattered over the file, then saves no
byte. On synth-small (400 B rows, a batch asks for 81% of them), a
cache holding 25% of the rows, the hottest, read as many bytes as no
cache.

Holding whole spans of consecutive rows instead, the densest spans
first, takes them out of the reads: 0.80x the bytes and 0.84x the
modelled seconds of no cache on synth-small, 0.79x and 0.81x on
synth-products, each with a fifth of the rows held in spans of 1,024
(a prototype; the loader's plan for synth-products holds 3% of the rows
static and keeps the hottest, its lookahead region the rest). Where
batches are sparse (4 KiB rows, a few per gap) the hottest rows
save more. `choose_span_rows` measures both on the profile and keeps
whichever the disk model prices lower: hotness counted on the first
half of the profiled batches, their reads priced on the second half.

`span_score` turns a row score into the span placement's score: rows
ranked below ``first`` keep their rank (the device tier's, whose hits
also spare transfers), every other row gets its span's mean score, so
that a static placement holding the top rows by it holds whole spans.
"""

from __future__ import annotations

import numpy as np
import torch

from hmgraph.cache.feature import Feature
from hmgraph.cache.policy_base import hot_first
from hmgraph.cache.readplan import ReadPlan, read_plan
from hmgraph.cache.trace_replay import split_profile

__all__ = ["PRICED_BATCHES", "SPAN_GAPS", "choose_span_rows", "planned_read",
           "read_seconds", "span_score"]

#: Span lengths tried, in break-even gaps: a held span shorter than the
#: gap is read through like any other gap.
SPAN_GAPS = (2, 8, 32)
#: The span placement is kept only when its reads are priced this much
#: below the hottest rows' (a share of theirs).
_MARGIN = 0.03
#: Profiled batches a planning decision prices (the held-out ones where
#: it is judged on batches it was not chosen from).
PRICED_BATCHES = 8


def span_score(score: torch.Tensor, first: int,
               span_rows: int) -> torch.Tensor:
    """A score under which the highest ranked rows are the ``first`` rows
    by ``score``, then whole spans of ``span_rows`` consecutive rows, the
    densest first.

    Parameters
    ----------
    score : torch.Tensor
        Per row, higher ranks first (profiled accesses).
    first : int
        Rows that keep their rank by ``score`` above every span.
    span_rows : int
        Rows per span (positive).

    Returns
    -------
    torch.Tensor
        float64 per row. A placement that holds the top ``k`` rows by it
        (a stable descending sort, as `hmgraph.cache.policy_static` and
        `hmgraph.cache.policy_lookahead` rank) holds the ``first`` rows,
        then spans whole in the order of their mean score over the rows
        not among the ``first``; equal spans in file order.
    """
    if span_rows < 1:
        raise ValueError(f"span_rows must be positive, got {span_rows}")
    n = score.numel()
    spans = torch.arange(n) // span_rows
    top = torch.zeros(n, dtype=torch.bool)
    if first > 0:
        top[hot_first(score.cpu())[:first]] = True
    score = score.double().cpu()
    rest = torch.where(top, 0.0, score)
    count = torch.bincount(spans, weights=(~top).double())
    mean = torch.bincount(spans, weights=rest) / count.clamp(min=1)
    # Spans below every top row: shift the top rows above the largest
    # mean (scores are counts, so both are finite and non-negative).
    above = float(mean.max()) + 1.0 if n else 0.0
    return torch.where(top, score - float(score.min()) + above,
                       mean[spans])


def planned_read(source: Feature, ids: np.ndarray) -> tuple[float, ReadPlan]:
    """The block runs the storage tier ``source`` reads sorted unique
    ``ids`` in (`hmgraph.cache.readplan.read_plan`: its geometry and gap
    rule), and their seconds as its disk model prices them."""
    row_bytes, offset, block = source.geometry
    plan = read_plan(ids, row_bytes, offset, block, source.max_gap_blocks)
    return source.disk.seconds(plan.runs, plan.blocks * block), plan


def read_seconds(source: Feature, trace, held: np.ndarray) -> float:
    """Mean modelled seconds of a batch's reads of the rows not ``held``
    (`planned_read`; 0.0 for a source without a disk model)."""
    if getattr(source, "disk", None) is None or not len(trace):
        return 0.0
    seconds = []
    for ids in trace:
        ids = ids.numpy() if torch.is_tensor(ids) else np.asarray(ids)
        seconds.append(planned_read(source, ids[~held[ids]])[0])
    return float(np.mean(seconds))


def choose_span_rows(source: Feature, trace, first: int, held: int
                     ) -> tuple[int, dict[int, float]]:
    """Whether ``held`` static rows lie cheaper as spans than as the
    hottest rows, on the profile.

    Parameters
    ----------
    source : Feature
        The storage tier the cache reads misses from (its geometry, gap
        rule and disk model).
    trace : sequence of torch.Tensor
        Profiled sorted unique ids per batch (at least two batches).
    first : int
        Rows held by hotness before any span (`span_score`).
    held : int
        Rows the static placement holds in all.

    Returns
    -------
    tuple
        ``(span_rows, seconds)``: the span length chosen (0: the hottest
        rows), and the modelled seconds of a batch's reads per span length
        tried (0 for the hottest rows).
    """
    gap = getattr(source, "max_gap_bytes", 0)
    if getattr(source, "disk", None) is None or len(trace) < 2 or \
            held <= first or not gap:
        return 0, {}
    n = source.num_rows
    hotness, held_out = split_profile(list(trace), n)
    held_out = held_out[:PRICED_BATCHES]
    gap_rows = max(1, -(-gap // source.row_bytes))
    seconds = {}
    for span in (0,) + tuple(m * gap_rows for m in SPAN_GAPS):
        score = hotness if not span else span_score(hotness, first, span)
        mask = np.zeros(n, dtype=bool)
        mask[hot_first(score)[:held].numpy()] = True
        seconds[span] = read_seconds(source, held_out, mask)
    best = min(seconds, key=seconds.get)
    if seconds[best] > (1 - _MARGIN) * seconds[0]:
        best = 0
    return best, seconds

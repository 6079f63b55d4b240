"""Markdown summary of a cache-hit analysis (`hmgraph.analysis.analyze`).

`summary_markdown` writes the hit rate of every policy per budget, each
policy's gap to OPT (Belady), facts of the trace and, where the analysis
costed misses in storage blocks, the storage reads per epoch of every
policy against no cache and against OPT.
"""

from __future__ import annotations

from hmgraph.markdown import markdown_table

__all__ = ["summary_markdown"]


def summary_markdown(result: dict) -> str:
    """Markdown: hit rate per policy and budget, the gap of each to OPT."""
    rates = result["hit_rate"]
    budgets = list(rates["belady"])
    headers = ["policy", *(f"{float(b):.0%}" for b in budgets)]
    align = "l" + "r" * len(budgets)
    gaps = [[name, *(f"{1 - row[b] / rates['belady'][b]:.1%}"
                     if rates["belady"][b] else "-" for b in budgets)]
            for name, row in rates.items()
            if name != "belady" and "reuse" not in name]
    lines = [markdown_table(headers, [
        [name, *(f"{row[b]:.3f}" for b in budgets)]
        for name, row in rates.items()], align),
        "", "Gap to OPT (Belady), relative: 1 - policy / OPT. Rows with "
        "reuse are left out: their buffers hold whole batches on top of "
        "the cache budget, so OPT of the budget is no ceiling for them.",
        "", markdown_table(headers, gaps, align)]
    stats = result["stats"]
    lines += ["", f"- batches: {stats['batches']}, accesses: "
              f"{stats['accesses']}, rows touched: {stats['rows_touched']}",
              f"- rows making 80% of accesses: "
              f"{stats['rows_for_80pct']:.1%} of all rows",
              f"- mean overlap of adjacent batches: "
              f"{stats['adjacent_overlap']:.1%}",
              f"- Spearman correlation of in-degree and accesses: "
              f"{stats['degree_correlation']:.3f}",
              f"- accesses per hop (0 = seeds): "
              f"{stats['accesses_per_hop']}"]
    if result.get("bytes"):
        lines += ["", *_bytes_table(result)]
    return "\n".join(lines)


def _unit(nbytes: int) -> tuple[str, float]:
    """The largest of GB, MB, kB that ``nbytes`` fills at least once."""
    for name, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return name, scale
    return "kB", 1e3


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _bytes_table(result: dict) -> list[str]:
    """Markdown lines: storage reads per epoch, policy x budget."""
    view = result["page_view"]
    page, disk = view["page_bytes"], view["disk_block_bytes"]
    by_key = {(r["policy"], r["budget"], r["layout"], r["block_bytes"]): r
              for r in result["bytes"]}
    none = {(r["layout"], r["block_bytes"]): r["bytes"]
            for r in result["no_cache_bytes"]}
    layouts = ("file", "hot-first")
    unit, scale = _unit(none["file", page])
    headers = ["policy", "budget", *(
        name for layout in layouts
        for name in (f"{layout} {unit}", "/none", "/OPT"))]
    if disk != page:
        headers += [f"{layout} /OPT at {disk} B" for layout in layouts]
    lines = [
        f"Storage reads per epoch (page-level view): the blocks the missed "
        f"rows need, {page // 1024} KiB pages unless marked, in the file's "
        f"row order and with rows renumbered hottest first (profiled). "
        f"/none: share of reading every batch whole; /OPT: against "
        f"Belady's misses costed the same way.", "",
        "No cache: " + ", ".join(
            f"{layout} {none[layout, size] / scale:.3f} {unit}"
            f"{'' if size == page else f' at {size} B'}"
            for size in dict.fromkeys((page, disk)) for layout in layouts),
        ""]
    rows = []
    for policy, budget in dict.fromkeys(
            (r["policy"], r["budget"]) for r in result["bytes"]):
        cells = [policy, f"{100 * budget:g}%"]
        for layout in layouts:
            row = by_key[policy, budget, layout, page]
            cells += [f"{row['bytes'] / scale:.3f}",
                      _times(row["vs_no_cache"]),
                      _times(row["vs_belady"])]
        if disk != page:
            cells += [_times(by_key[policy, budget, layout, disk]["vs_belady"])
                      for layout in layouts]
        rows.append(cells)
    return [*lines, markdown_table(headers, rows,
                                   "l" + "r" * (len(headers) - 1))]

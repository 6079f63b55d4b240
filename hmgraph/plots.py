"""PNG plots of an analysis result (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hmgraph.cache.format import atomic_path  # noqa: E402

__all__ = ["plot_analysis"]


def _save(figure, path: Path) -> None:
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(figure)


def plot_analysis(result: dict, folder: str | Path, stem: str) -> list[Path]:
    """Hit rate vs budget, per-tier bars, frequency CDF; returns paths.

    With a page-level view in ``result`` (``bytes``), also storage bytes
    per epoch vs budget (`_plot_storage_bytes`).
    """
    folder = Path(folder)
    paths = []
    rates = result["hit_rate"]
    budgets = list(rates["belady"])
    x = [100 * float(b) for b in budgets]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.set_prop_cycle(color=plt.cm.tab20.colors)
    for name, row in rates.items():
        style = dict(color="black", linewidth=2.5, linestyle="--") \
            if name == "belady" else {}
        axis.plot(x, [row[b] for b in budgets], marker="o", label=name,
                  **style)
    axis.set_xscale("log")
    axis.set_xticks(x, [f"{v:g}%" for v in x])
    axis.set_xticks([], minor=True)
    axis.set_xlabel("cache capacity (share of feature rows)")
    axis.set_ylabel("hit rate")
    axis.set_title("Hit rate by policy; Belady (OPT) is the ceiling")
    axis.legend(fontsize=7, ncol=2)
    axis.grid(alpha=0.3)
    paths.append(folder / f"{stem}-hit-rate.png")
    _save(figure, paths[-1])

    tiers = result["tiers"]
    figure, axis = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(budgets)
    for tier, color in (("device", "#2a7"), ("host", "#49c"),
                        ("storage", "#c54")):
        values = [tiers[b][tier] for b in budgets]
        axis.bar([f"{v:g}%" for v in x], values, bottom=bottom, label=tier,
                 color=color)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    axis.set_ylabel("share of requested rows")
    axis.set_title("hmgraph plan: rows served per tier")
    axis.legend()
    paths.append(folder / f"{stem}-tiers.png")
    _save(figure, paths[-1])

    cdf = result["stats"]["frequency_cdf"]
    figure, axis = plt.subplots(figsize=(5, 4))
    axis.plot(cdf["rows"], cdf["accesses"])
    axis.axhline(0.8, color="grey", linestyle=":")
    axis.set_xlabel("share of rows (hottest first)")
    axis.set_ylabel("share of accesses")
    axis.set_title("Access frequency CDF")
    axis.grid(alpha=0.3)
    paths.append(folder / f"{stem}-frequency-cdf.png")
    _save(figure, paths[-1])
    if result.get("bytes"):
        paths.append(folder / f"{stem}-storage-bytes.png")
        _plot_storage_bytes(result, paths[-1])
    return paths


def _plot_storage_bytes(result: dict, path: Path,
                        layout: str = "hot-first") -> None:
    """Storage bytes per epoch vs budget at the disk's block size.

    One line per policy, Belady's misses dashed, reading every batch whole
    (no cache) dotted; rows in ``layout``.
    """
    block = result["page_view"]["disk_block_bytes"]
    lines: dict[str, dict] = {}
    for record in result["bytes"]:
        if record["layout"] == layout and record["block_bytes"] == block:
            lines.setdefault(record["policy"], {})[record["budget"]] = (
                record["bytes"] / 1e9)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.set_prop_cycle(color=plt.cm.tab20.colors)
    for name, points in lines.items():
        style = dict(color="black", linewidth=2.5, linestyle="--") \
            if name == "belady" else {}
        x = sorted(points)
        axis.plot([100 * b for b in x], [points[b] for b in x], marker="o",
                  label=name, **style)
    none = next(r["bytes"] for r in result["no_cache_bytes"]
                if r["layout"] == layout and r["block_bytes"] == block)
    axis.axhline(none / 1e9, color="grey", linestyle=":", label="no cache")
    x = [100 * b for b in sorted(next(iter(lines.values())))]
    axis.set_xscale("log")
    axis.set_xticks(x, [f"{v:g}%" for v in x])
    axis.set_xticks([], minor=True)
    axis.set_xlabel("cache capacity (share of feature rows)")
    axis.set_ylabel("storage reads per epoch (GB)")
    axis.set_title(f"Blocks the misses read ({block} B blocks, rows "
                   f"{layout}); Belady dashed")
    axis.legend(fontsize=7, ncol=2)
    axis.grid(alpha=0.3)
    _save(figure, path)

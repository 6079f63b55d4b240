"""The plot of ``hmgraph bench``: seconds per stage of each configuration."""

from __future__ import annotations

from pathlib import Path

from hmgraph.cache.format import atomic_path

__all__ = [
    "plot_stages",
]


def plot_stages(rows: list[dict], path: Path) -> None:
    """Seconds per stage of each configuration, stacked bars, as PNG."""
    # Lazy: matplotlib (0.7 s) for the plot alone, its backend set first.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is set

    figure, axis = plt.subplots(figsize=(8, 4))
    names = [r["name"] for r in rows]
    bottom = [0.0] * len(rows)
    for stage in ("sample", "fetch", "wait", "train"):
        values = [r["seconds"][stage] for r in rows]
        axis.barh(names, values, left=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    axis.set_xlabel("seconds per epoch (stages overlap when prefetching)")
    axis.legend()
    axis.invert_yaxis()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(figure)

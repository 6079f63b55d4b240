"""Compare training results side by side.

``python -m hmgraph.report A/result.json B/result.json`` prints one row per
result: model, test metric (mean ± std over runs), mean epoch seconds and
their split into sample / fetch / train.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hmgraph.markdown import markdown_table

__all__ = ["compare", "format_result"]


def mean_seconds(epochs: list[dict], stage: str) -> float:
    """Mean seconds of one stage over epoch records; 0.0 for none."""
    if not epochs:
        return 0.0
    return sum(e["seconds"][stage] for e in epochs) / len(epochs)


def _hits(epochs: list[dict]) -> str:
    """Cache hit rates per tier of the last epoch, e.g. ``device 6%``."""
    cache = epochs[-1].get("loader", {}).get("cache", {}) if epochs else {}
    rates = cache.get("hit_rate", {})
    return ", ".join(f"{tier} {rate:.0%}" for tier, rate in rates.items()
                     if tier != "source") or "-"


def _storage(epochs: list[dict]) -> str:
    """Storage bytes read in the last epoch."""
    # Lazy: `python -m hmgraph.report` prints tables without torch.
    from hmgraph.cache.budget import format_bytes

    storage = epochs[-1].get("loader", {}).get("storage") if epochs else None
    return format_bytes(storage["bytes_read"]) if storage else "-"


def format_result(result: dict) -> str:
    """A short human table of one training result, one row per run."""
    metric = result["metric"]
    stages = ("epoch", "sample", "fetch", "train")
    rows = [[str(record["run"]), str(record["best_epoch"]),
             f"{record['best_valid']:.4f}",
             f"{record['test_at_best_valid']:.4f}",
             *(f"{mean_seconds(record['epochs'], stage):.2f}"
               for stage in stages)]
            for record in result["runs"]]
    lines = [result["dataset"], "", markdown_table(
        ["run", "best epoch", f"valid {metric}", f"test {metric}",
         *(f"{stage} s" for stage in stages)], rows, align="r" * 8)]
    s = result["summary"]
    lines += ["", f"Valid {metric}: {s['valid_mean']:.4f} ± "
              f"{s['valid_std']:.4f}",
              f"Test {metric}: {s['test_mean']:.4f} ± {s['test_std']:.4f}"
              f"  ({s['runs']} runs, {result.get('eval', 'layerwise')} "
              f"evaluation)"]
    memory = result.get("memory")
    if memory:
        lines.append(
            f"Memory: peak RSS {_gb(memory['peak_rss_bytes'])}; graph "
            f"{_gb(memory['graph_bytes'])}, features "
            f"{_gb(memory['feature_bytes'])}, host budget "
            f"{_gb(memory['host_budget_bytes'])}, device budget "
            f"{_gb(memory['device_budget_bytes'])}, working set "
            f"{_gb(memory['working_set_bytes'])}")
        if "promise_bytes" in memory:
            lines.append(
                f"Memory promise: graph + budgets + "
                f"{memory['batches_in_flight']} batches of "
                f"{_gb(memory['batch_input_bytes'])} + 2 GiB = "
                f"{_gb(memory['promise_bytes'])}: "
                f"{'kept' if memory['within_promise'] else 'EXCEEDED'}")
    lines.append(f"result: {result['path']}")
    return "\n".join(lines)


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def compare(results: list[dict]) -> str:
    """A markdown table comparing training results.

    Parameters
    ----------
    results : list of dict
        Results as written by `hmgraph.train.train` (``result.json``).

    Returns
    -------
    str
        The table, then one line naming the best model and its margin.
    """
    stages = ("epoch", "sample", "fetch", "train")
    rows = []
    for result in results:
        epochs = [e for r in result["runs"] for e in r["epochs"]]
        s = result["summary"]
        config = result["config"]
        rows.append([
            config["model"], config["dataset"],
            config.get("features_on", "memory"), config.get("cache") or "off",
            f"{s['test_mean']:.4f} ± {s['test_std']:.4f}",
            *(f"{mean_seconds(epochs, stage):.2f}" for stage in stages),
            _hits(epochs), _storage(epochs)])
    lines = [markdown_table(
        ["model", "dataset", "features", "cache", "test",
         *(f"{stage} s" for stage in stages), "cache hits", "storage read"],
        rows, align="llllrrrrrlr")]
    ranked = sorted(results, key=lambda r: r["summary"]["test_mean"],
                    reverse=True)
    if len(ranked) > 1:
        best, second = ranked[0], ranked[1]
        margin = best["summary"]["test_mean"] - second["summary"][
            "test_mean"]
        lines += ["", f"{best['config']['model']} leads "
                  f"{second['config']['model']} by {100 * margin:.1f} "
                  f"points of test {best['metric']}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the comparison of the result files named in ``argv``."""
    if not argv:
        print("usage: python -m hmgraph.report RESULT.json [...]",
              file=sys.stderr)
        return 2
    results = []
    for name in argv:
        path = Path(name)
        if not path.is_file():
            print(f"report: error: {path} does not exist", file=sys.stderr)
            return 2
        results.append(json.loads(path.read_text()))
    print(compare(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

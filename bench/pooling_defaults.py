"""Issue 36's targets, read from the pooling bench's cells.

The grid of `pooling.py` holds, for every model, the configuration that
``hmgraph classify`` runs by default (`ClassifyConfig.batch_size`, the
model's own `default_dropout`), under the CLI's default protocol. Its
cells answer, with no run of their own:

1. per TU set, HAP above the majority class and best or within one std
   of the best model, every model at its defaults;
2. per set and model at its defaults, the mean best validation accuracy
   minus the test accuracy at most `GAP_MAX` points;
4. per set, HAP's selected figure (the per-fold pick of the grid) no
   more than one std below the one of the table it replaces (the
   old protocol's ``bench/results/pooling.json``, its own std).
"""

from __future__ import annotations

import json
from pathlib import Path

GAP_MAX = 5.0  # points of accuracy, valid - test
#: The nine-set table made under the old protocol (carved hold-out).
OLD_TABLE = Path(__file__).resolve().parent / "results" / "pooling.json"
WIN, TIE, LOSS = "best", "within one std", "below"


def is_cli_default(model: str, overrides: dict) -> bool:
    """Whether the grid configuration ``overrides`` of ``model`` is the
    one ``hmgraph classify --model MODEL`` runs by default."""
    from hmgraph.models.pooling import default_dropout
    from hmgraph.settings import ClassifyConfig

    return (overrides.get("batch_size") == ClassifyConfig.batch_size
            and overrides.get("dropout") == default_dropout(model))


def cli_defaults(records) -> dict:
    """``{(dataset, model): record}`` of the grid cells that ran the
    configuration ``hmgraph classify`` runs by default."""
    return {(r["dataset"], r["model"]): r for r in records
            if is_cli_default(r["model"], r.get("overrides", {}))}


def old_selected(path: Path = OLD_TABLE) -> dict:
    """``{(dataset, model): summary}`` of the old table's picks; empty
    where there is none."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {(s["dataset"], s["model"]): s["summary"]
            for s in report.get("selected", [])}


def targets(records, selected, datasets, old, complete=None) -> dict:
    """The three targets' findings per set (sets where HAP's cell at
    its defaults ran, with at least one other model's); target 4 on the
    sets of ``complete`` only (every configuration of HAP's ran, so its
    pick is the grid's; all of ``datasets`` where None)."""
    defaults = cli_defaults(records)
    found = {}
    for dataset in datasets:
        runs = {m: r for (d, m), r in defaults.items() if d == dataset}
        if "hap" not in runs or len(runs) < 2:
            continue
        means = {m: r["summary"]["test_mean"] for m, r in runs.items()}
        best = max(means, key=lambda m: (means[m], m != "hap"))
        gap = means[best] - means["hap"]
        std = runs[best]["summary"]["test_std"]
        hap_now = selected.get((dataset, "hap")) \
            if complete is None or dataset in complete else None
        hap_then = old.get((dataset, "hap"))
        found[dataset] = {
            "models": sorted(runs), "hap": means["hap"], "best": best,
            "best_mean": means[best], "best_std": std,
            "majority": runs["hap"]["majority"],
            "verdict": WIN if best == "hap" else TIE if gap <= std
            else LOSS,
            "valid_gap": {m: 100 * (r["summary"]["valid_mean"]
                                    - r["summary"]["test_mean"])
                          for m, r in runs.items()},
            "then": None if hap_then is None or hap_now is None else {
                "now": hap_now["summary"]["test_mean"],
                "then": hap_then["test_mean"],
                "then_std": hap_then["test_std"]}}
    return found


def target_rows(found, common) -> list:
    """The targets table's rows (`common.target`), per set."""
    rows = []
    for d, v in found.items():
        rows += [
            common.target(
                "I36-1", f"{d}: best - HAP at the defaults, points (best "
                f"of {len(v['models'])}: {v['best']} "
                f"{100 * v['best_mean']:.2f} ± {100 * v['best_std']:.2f})",
                round(100 * (v["best_mean"] - v["hap"]), 2), "<=",
                round(100 * v["best_std"], 2)),
            common.target(
                "I36-1", f"{d}: HAP - the majority class "
                f"({100 * v['majority']:.2f}), points",
                round(100 * (v["hap"] - v["majority"]), 2), ">=", 0),
            common.target(
                "I36-2", f"{d}: worst valid - test at the defaults, "
                f"points ({max(v['valid_gap'], key=v['valid_gap'].get)})",
                round(max(v["valid_gap"].values()), 2), "<=", GAP_MAX)]
        if v["then"]:
            then = v["then"]
            rows.append(common.target(
                "I36-4", f"{d}: HAP selected, % (the old table "
                f"{100 * then['then']:.2f} ± {100 * then['then_std']:.2f}"
                ", less one std)", round(100 * then["now"], 2), ">=",
                round(100 * (then["then"] - then["then_std"]), 2)))
    return rows


def against_old(selected, complete, old) -> list[dict]:
    """Every model's pick beside the old table's, on the sets where all
    of the model's configurations ran (``complete``: ``(dataset,
    model)`` pairs): the regenerated table's cells, target 4 for every
    model rather than HAP's alone. ``below``: more than the old cell's
    std below it."""
    rows = []
    for (d, m), pick in selected.items():
        if (d, m) not in complete or (d, m) not in old:
            continue
        now, then = pick["summary"]["test_mean"], old[d, m]
        rows.append({"dataset": d, "model": m, "now": now,
                     "then": then["test_mean"], "then_std": then["test_std"],
                     "below": now < then["test_mean"] - then["test_std"]})
    return rows


def against_old_markdown(rows, common) -> list[str]:
    """`against_old`'s rows as a model x set table and a count line."""
    if not rows:
        return []
    sets = list(dict.fromkeys(r["dataset"] for r in rows))
    models = sorted({r["model"] for r in rows},
                    key=lambda m: (m != "hap", m))
    cells = {(r["dataset"], r["model"]): r for r in rows}
    table = [[m, *(
        f"{100 * r['now']:.2f} ({100 * r['then']:.2f} ± "
        f"{100 * r['then_std']:.2f})" + (" **below**" if r["below"] else "")
        if (r := cells.get((d, m))) else None for d in sets)]
        for m in models]
    below = sum(r["below"] for r in rows)
    return ["", "Every model's pick now (the old table's, ± its std), on "
            "the sets where all of the model's configurations ran: "
            f"{len(rows) - below} of {len(rows)} at or above the old "
            f"figure less its std, {below} below.", "",
            common.markdown_table(["model", *sets], table)]


def markdown(found, records, common, old_rows=()) -> list[str]:
    """The section: each model at its defaults per set (test % and valid
    - test in points), then the targets and ``old_rows``
    (`against_old`)."""
    if not found:
        return []
    defaults = cli_defaults(records)
    models = sorted({m for v in found.values() for m in v["models"]},
                    key=lambda m: (m != "hap", m))
    rows = [[m, *(
        f"{100 * s['test_mean']:.2f} ± {100 * s['test_std']:.2f} / "
        f"{100 * (s['valid_mean'] - s['test_mean']):+.2f}"
        if (s := (defaults.get((d, m)) or {}).get("summary")) else None
        for d in found)] for m in models]
    return ["", "## Issue 36: every model at the CLI's defaults", "",
            "The grid's cell of each model's default configuration "
            "(`hmgraph classify --dataset D --model M`: batch 128, the "
            "model's own dropout), no selection: test accuracy %, mean ± "
            "std over the folds / mean best validation minus test, "
            "points. Target 4 sets HAP's selected figure above beside the "
            "old protocol's table (`results/pooling.json`).", "",
            common.markdown_table(["model", *found], rows), "",
            common.targets_table(target_rows(found, common)),
            *against_old_markdown(old_rows, common)]

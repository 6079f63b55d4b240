"""A pooling run's cells against an earlier run of the same protocol.

The check that code changes left the figures where they were (issue 35's
target 5): every (dataset, model, configuration) cell that both runs
hold, this run's test accuracy beside the earlier one's. A cell is
*equal* where the two means agree to 0.01 points, *within one std*
where they differ by at most the earlier cell's fold-std, else *apart*.
Cells repeat to the digit only at the same torch thread count and
summation order; another count picks other epochs, so within one std is
what the check asks.
"""

from __future__ import annotations

import json
from pathlib import Path

EQUAL, WITHIN, APART = "equal", "within one std", "apart"
#: The protocol settings both runs must share for their cells to compare.
SAME = ("folds", "epochs", "patience", "hidden", "lr", "seed",
        "selection", "smooth")


def load(path, config: dict, legacy: dict) -> list[dict]:
    """The records of the run at ``path``; SystemExit where it is
    missing or ran another protocol than ``config`` (settings missing
    from either run read from ``legacy``)."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--reference {path}: not a pooling run's JSON "
                         f"({err})") from None
    old = report.get("config", {})
    for key in SAME:
        then, now = old.get(key, legacy.get(key)), config.get(
            key, legacy.get(key))
        if then != now:
            raise SystemExit(f"--reference {path} ran {key}={then!r} where "
                             f"this run has {now!r}: give a run of the "
                             "same protocol")
    return report["records"]


def compare(records, reference, datasets, models) -> list[dict]:
    """Per cell that both hold, by set, model and grid order: the means
    and stds (fractions), the difference in points and the verdict."""
    then = {(r["dataset"], r["model"], r["name"]): r["summary"]
            for r in reference}
    rows = []
    for record in sorted(records, key=lambda r: (
            datasets.index(r["dataset"]), models.index(r["model"]),
            r["grid_index"])):
        key = (record["dataset"], record["model"], record["name"])
        if key not in then:
            continue
        now, old = record["summary"], then[key]
        points = 100 * (now["test_mean"] - old["test_mean"])
        rows.append({
            "dataset": key[0], "model": key[1], "name": key[2],
            "now": now["test_mean"], "now_std": now["test_std"],
            "then": old["test_mean"], "then_std": old["test_std"],
            "points": points,
            "verdict": EQUAL if abs(points) < 0.005 else WITHIN
            if abs(points) <= 100 * old["test_std"] else APART})
    return rows


def markdown(rows, path, common) -> list[str]:
    """The section: one line of counts, then the cells."""
    if not rows:
        return []
    counts = {v: sum(r["verdict"] == v for r in rows)
              for v in (EQUAL, WITHIN, APART)}
    table = [[r["dataset"], r["model"], r["name"],
              f"{100 * r['now']:.2f} ± {100 * r['now_std']:.2f}",
              f"{100 * r['then']:.2f} ± {100 * r['then_std']:.2f}",
              f"{r['points']:+.2f}", r["verdict"]] for r in rows]
    return ["", f"## Against an earlier run of the same protocol "
            f"(`{path}`)", "",
            f"{len(rows)} cells in both: {counts[EQUAL]} equal to 0.01 "
            f"points, {counts[EQUAL] + counts[WITHIN]} within one std of "
            f"the earlier cell, {counts[APART]} apart. Test accuracy %, "
            "this run then the earlier one; the difference in points.", "",
            common.markdown_table(["dataset", "model", "configuration",
                                   "now", "then", "points", "verdict"],
                                  table)]

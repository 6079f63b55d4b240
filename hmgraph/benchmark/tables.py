"""Markdown tables and the targets a benchmark judges.

Every markdown table of the project goes through `markdown_table`
(`hmgraph.markdown`, free of torch; re-exported here); the targets
(`target`) are one of them (`targets_table`). `amortized` is the ratio
the tables print for construction spread over several epochs.
"""

from __future__ import annotations

from hmgraph.markdown import markdown_table

__all__ = [
    "AMORTIZE_EPOCHS",
    "amortized",
    "built_note",
    "markdown_table",
    "target",
    "targets_table",
]


#: Epochs a configuration's construction is amortized over in reports.
AMORTIZE_EPOCHS = 10


def amortized(construct: float, epoch: float, base: float | None,
              epochs: int = AMORTIZE_EPOCHS) -> float | None:
    """``(construct + epochs x epoch) / (epochs x base)``; None without a
    base."""
    if not base or not epochs:
        return None
    return (construct + epochs * epoch) / (epochs * base)


def built_note(built: str, epochs: int, ratio: float | None) -> str:
    """A target's note: ``built`` (the construction seconds, as text) and,
    where not None, ``ratio`` `amortized` over ``epochs``."""
    return built + (f"; amortized over {epochs} epochs {ratio:.2f}"
                    if ratio is not None else "")


def target(number, what: str, value, op: str, limit: float,
           note: str | None = None) -> dict:
    """One target: ``value op limit`` judged PASS or MISS (``not run``
    where ``value`` is None)."""
    if value is None:
        verdict = "not run"
    else:
        verdict = "PASS" if (value <= limit if op == "<=" else
                             value >= limit) else "MISS"
    return {"target": number, "what": what, "value": value, "op": op,
            "limit": limit, "verdict": verdict, "note": note}


def targets_table(rows: list[dict]) -> str:
    """``| # | target | value | limit | verdict |``, notes in brackets."""
    return markdown_table(
        ["#", "target", "value", "limit", "verdict"],
        [[t["target"], t["what"] + (f" ({t['note']})" if t["note"] else ""),
          t["value"], f"{t['op']} {t['limit']:g}", f"**{t['verdict']}**"]
         for t in rows])

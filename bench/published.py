"""Published figures beside the bench tables (`*_published.json`).

Each file maps a source (paper, table) to ``[protocol, {model: {dataset:
figure}}]``; a figure is ``{"value": "mean ± std", "verified": bool}``
with ``"source"`` (where it was read) when verified, ``"reason"`` when
not. Unverified figures are printed with a mark.
"""

from __future__ import annotations

import json
from pathlib import Path

UNVERIFIED = "†"


def load(name: str) -> dict:
    """``bench/<name>_published.json``."""
    return json.loads(Path(__file__).with_name(f"{name}_published.json")
                      .read_text(encoding="utf-8"))


def cell(figure: dict) -> str:
    """A published figure, marked when it is not verified at a source."""
    return figure["value"] + ("" if figure["verified"] else f" {UNVERIFIED}")


def notes(published: dict) -> list[str]:
    """Each source's protocol, then the mark's meaning if any figure is
    unverified."""
    lines = [f"- **{source}**: {protocol}."
             for source, (protocol, _) in published.items()]
    if any(not figure["verified"] for _, table in published.values()
           for by_set in table.values() for figure in by_set.values()):
        lines.append(f"- {UNVERIFIED}: not verified against a readable copy "
                     "of its source (the reason is in the JSON).")
    return lines

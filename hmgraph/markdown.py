"""Markdown tables: every table the project prints or writes is made here.

Free of torch, so the command line's reports (`hmgraph.report`) use it
without loading it; `hmgraph.benchmark` re-exports `markdown_table`.
"""

from __future__ import annotations

import math

__all__ = ["markdown_table"]


def markdown_table(headers: list[str], rows: list[list],
                   align: str | None = None) -> str:
    """A markdown table; None shown as ``-``, floats to 3 significant
    digits (at most 3 decimals), ints with thousands separators.

    Parameters
    ----------
    headers : list of str
        The column names.
    rows : list of list
        One list of cells per row; a str is written as it is.
    align : str, optional
        One letter per column: ``l`` left-aligned, ``r`` right-aligned.
        Default: columns whose first cell reads as a number (it starts
        with a digit, ``-``, ``+`` or ``.``) right-aligned, the others
        left-aligned.

    Returns
    -------
    str
        The header line, the alignment line and one line per row.

    Raises
    ------
    ValueError
        If ``align`` has another length than ``headers`` or a letter other
        than ``l`` or ``r``.
    """
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            digits = 2 - math.floor(math.log10(abs(value))) if value else 0
            return f"{value:,.{min(3, max(0, digits))}f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    if align is not None:
        if len(align) != len(headers) or set(align) - {"l", "r"}:
            raise ValueError(
                f"align={align!r}: one of 'l' or 'r' per column, "
                f"{len(headers)} columns")
        marks = ["---:" if a == "r" else "---" for a in align]
    else:
        first = [cell(v) for v in rows[0]] if rows else []
        marks = ["---:" if text[:1] in "0123456789-+." else "---"
                 for text in first] or ["---"] * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)

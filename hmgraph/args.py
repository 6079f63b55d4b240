"""argparse types and argument groups shared by the ``hmgraph`` commands.

Each ``type=`` function here turns one command-line string into a value or
raises `argparse.ArgumentTypeError` with one line that names the bad value
and says what is valid; argparse prefixes the option, e.g. ``hmgraph:
error: argument --batch-size: '-4' is not a positive integer``.

This module imports nothing of hmgraph at import time, so `hmgraph.cli`,
`hmgraph.classify` and `hmgraph.distributed.commands` can all use it
without importing one another.

Examples
--------
>>> parse_fanouts("15,10,5")
[15, 10, 5]
>>> positive_int("3")
3
>>> fraction("1")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: '1' is not a number in [0, 1)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

__all__ = [
    "budget_text",
    "check_out_folder",
    "device_name",
    "fraction",
    "name_list",
    "non_negative_float",
    "non_negative_int",
    "parse_budget_shares",
    "parse_fanouts",
    "positive_float",
    "positive_int",
    "unit_interval",
]


def parse_fanouts(text: str) -> list[int]:
    """Parse ``"15,10,5"`` into ``[15, 10, 5]``.

    Parameters
    ----------
    text : str
        Comma-separated fanouts, one per layer, input layer first as in
        `dgl.dataloading.NeighborSampler`: each a positive integer, or
        ``-1`` for all neighbours; no spaces.

    Returns
    -------
    list of int

    Raises
    ------
    argparse.ArgumentTypeError
        ``invalid fanouts '15,0': '0' is not a positive integer or -1 (all
        neighbours); example: 15,10,5``.
    """
    fanouts = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value == 0 or value < -1 or part.strip() != part:
            raise argparse.ArgumentTypeError(
                f"invalid fanouts {text!r}: {part!r} is not a positive "
                f"integer or -1 (all neighbours); example: 15,10,5"
            )
        fanouts.append(value)
    return fanouts


def _checked(kind, text: str, low, high, closed_high: bool, what: str):
    """``kind(text)`` if it lies in ``[low, high]`` (``[low, high)`` unless
    ``closed_high``; no upper bound if ``high`` is None), else
    `argparse.ArgumentTypeError` ``'TEXT' is not WHAT``. NaN and infinity
    are outside every range.
    """
    try:
        value = kind(text)
    except ValueError:
        value = None
    inside = value is not None and math.isfinite(value) and value >= low and (
        high is None or value < high or (closed_high and value == high))
    if not inside:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    """Parse an integer of at least 1 (counts, sizes, epochs).

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        ``'-4' is not a positive integer``.
    """
    return _checked(int, text, 1, None, True, "a positive integer")


def positive_float(text: str) -> float:
    """Parse a number above 0 (a learning rate).

    Raises
    ------
    argparse.ArgumentTypeError
        ``'-1' is not a positive number``.
    """
    value = _checked(float, text, 0.0, None, True, "a positive number")
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    """Parse a number of at least 0 (a weight decay).

    Raises
    ------
    argparse.ArgumentTypeError
        ``'-1' is not a non-negative number``.
    """
    return _checked(float, text, 0.0, None, True, "a non-negative number")


def device_name(text: str) -> str:
    """Check a torch device string (``cpu``, ``cuda``, ``cuda:N``).

    Raises
    ------
    argparse.ArgumentTypeError
        ``'bogus' is not a device: cpu, cuda or cuda:N``.
    """
    # Lazy, as the two below: hmgraph.args (and `import hmgraph.cli`)
    # loads no torch.
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device: cpu, cuda or cuda:N")
    return text


def non_negative_int(text: str) -> int:
    """Parse an integer of at least 0 (0 usually meaning "default" or "off").

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        ``'-1' is not a non-negative integer``.
    """
    return _checked(int, text, 0, None, True, "a non-negative integer")


def unit_interval(text: str) -> float:
    """Parse a number in ``[0, 1]`` (a share, a locality).

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        ``'1.5' is not a number in [0, 1]``.
    """
    return _checked(float, text, 0.0, 1.0, True, "a number in [0, 1]")


def fraction(text: str) -> float:
    """Parse a number in ``[0, 1)`` (a dropout probability).

    Parameters
    ----------
    text : str

    Returns
    -------
    float

    Raises
    ------
    argparse.ArgumentTypeError
        ``'1' is not a number in [0, 1)``.
    """
    return _checked(float, text, 0.0, 1.0, False, "a number in [0, 1)")


def parse_budget_shares(text: str) -> list[float]:
    """Parse cache capacities in percent, ``"1,5,20"``, into shares.

    Parameters
    ----------
    text : str
        Comma-separated percentages, each in ``(0, 100]``.

    Returns
    -------
    list of float
        The shares, ``[0.01, 0.05, 0.2]`` for ``"1,5,20"``.

    Raises
    ------
    argparse.ArgumentTypeError
        ``invalid budgets '1,0': '0' is not a percentage in (0, 100];
        example: 1,5,20``.
    """
    shares = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = -1.0
        if not 0.0 < value <= 100.0:
            raise argparse.ArgumentTypeError(
                f"invalid budgets {text!r}: {part!r} is not a percentage "
                f"in (0, 100]; example: 1,5,20"
            )
        shares.append(value / 100.0)
    return shares


def budget_text(text: str) -> str:
    """A budget (``"5%"`` of the feature bytes, or bytes with a unit such
    as ``"512MB"``), checked and kept as text: its bytes depend on the
    dataset, which is not loaded yet.

    Raises
    ------
    argparse.ArgumentTypeError
        `hmgraph.cache.budget.parse_budget`'s line, e.g. ``invalid budget
        '5 apples'; use bytes with a unit (512MB, 2GB, 1GiB) or a share of
        the features (10%)``.
    """
    from hmgraph.cache.budget import parse_budget  # lazy: brings torch

    try:
        parse_budget(text, 1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def name_list(choices=None, check=None):
    """An argparse type: distinct comma-separated names, each one of
    ``choices`` where given and passed through ``check`` (another type).

    >>> name_list(["a", "b"])("b,a")
    ['b', 'a']

    Raises `argparse.ArgumentTypeError` on an empty list, a repeated
    name or one not in ``choices``: ``'a,c': give distinct names,
    comma-separated, of a, b``.
    """
    def parse(text: str) -> list[str]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        wrong = set(items) - set(choices or items)
        if not items or wrong or len(set(items)) < len(items):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give distinct names, comma-separated"
                + (f", of {', '.join(choices)}" if choices else ""))
        return [check(item) for item in items] if check else items
    return parse


def check_out_folder(out: str, flag: str = "--out") -> None:
    """Refuse an output folder that cannot be made, before any work.

    Parameters
    ----------
    out : str
        The folder (it need not exist yet).
    flag : str
        The option that gave it, for the message.

    Raises
    ------
    ValueError
        ``--out afile is a file; give a folder``, ``--out afile/sub:
        /abs/afile is a file, not a folder`` or ``--out /ro/x: cannot
        write under /ro``.
    """
    path = Path(out).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {out} is a file; give a folder")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out}: cannot write under {parent}")

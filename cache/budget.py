"""Memory budgets: parsed once at the edge, then plain byte counts.

``"512MB"``, ``"2GB"``, ``"1.5GiB"``, ``"4096"`` (bytes) or ``"10%"`` (of
the feature bytes) become an ``int`` number of bytes with `parse_budget`;
`check_available` refuses a budget the machine cannot hold.
"""

from __future__ import annotations

import re

import psutil
import torch

__all__ = ["HOST_RESERVE_BYTES", "auto_host_budget", "available_bytes",
           "check_available", "format_bytes", "parse_budget"]

#: Host memory `auto_host_budget` leaves free for Python, torch, DGL's
#: sampling buffers and the page cache's working set.
HOST_RESERVE_BYTES = 2 << 30

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z%]*)\s*$")


def parse_budget(text: str | int, total_bytes: int | None = None) -> int:
    """A budget in bytes.

    Parameters
    ----------
    text : str or int
        ``"512MB"``, ``"2GB"``, ``"1GiB"``, a plain byte count, or a share
        of ``total_bytes`` such as ``"10%"``.
    total_bytes : int, optional
        What a percentage is a share of (the feature bytes).

    Returns
    -------
    int
        Bytes, >= 0.

    Raises
    ------
    ValueError
        Naming the bad value and the accepted forms.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"budget {text} is negative")
        return text
    match = _PATTERN.match(str(text).lower())
    if match is None or match.group(2) not in {*_UNITS, "%"}:
        raise ValueError(
            f"invalid budget {text!r}; use bytes with a unit (512MB, 2GB, "
            f"1GiB) or a share of the features (10%)"
        )
    value, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        if total_bytes is None:
            raise ValueError(f"budget {text!r} is a share, but of nothing")
        if value > 100:
            raise ValueError(f"budget {text!r} is more than 100%")
        return int(total_bytes * value / 100)
    return int(value * _UNITS[unit])


def format_bytes(num_bytes: float) -> str:
    """``1536000`` -> ``"1.5 MB"`` (decimal units)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else \
                f"{int(num_bytes)} B"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def available_bytes(device: torch.device | str) -> int:
    """Free memory of ``device`` in bytes (host RAM for ``cpu``)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def check_available(name: str, budget_bytes: int, device) -> None:
    """Refuse a budget larger than the free memory of ``device``.

    Raises
    ------
    ValueError
        ``"host budget 64.0 GB exceeds the 20.1 GB available on cpu"``.
    """
    free = available_bytes(device)
    if budget_bytes > free:
        raise ValueError(
            f"{name} budget {format_bytes(budget_bytes)} exceeds the "
            f"{format_bytes(free)} available on {torch.device(device)}"
        )


def auto_host_budget(feature_bytes: int, working_bytes: int,
                     reserve_bytes: int = HOST_RESERVE_BYTES,
                     available: int | None = None) -> int:
    """The host tier's budget that fits this machine now.

    What is free (after the graph is loaded), less the run's working set
    (batches in flight, evaluation buffers, a CPU device tier) and a
    reserve, never more than ``feature_bytes`` nor less than 0.

    Parameters
    ----------
    feature_bytes : int
        Bytes of all feature rows, with the bookkeeping of a host tier
        that holds them all (a larger budget would hold nothing more).
    working_bytes : int
        Memory the run needs besides the host tier.
    reserve_bytes : int
        Kept free; default `HOST_RESERVE_BYTES` (2 GiB).
    available : int, optional
        Free host memory; default `available_bytes("cpu")`.
    """
    free = available_bytes("cpu") if available is None else available
    return int(max(0, min(feature_bytes,
                          free - working_bytes - reserve_bytes)))

"""The cache's bookkeeping in host memory, and host rows that fit with it.

Besides rows, a cache keeps bookkeeping in host memory: per node of the
graph (each store's id -> slot table, each policy's flags and ranks, the
window's marks) and per cached row (slot -> id tables, free lists, the
policy's held ids). `metadata_bytes` states it for a layout;
`fit_host_rows` takes it out of a host budget and sizes the host and
staging tiers in what is left, as `hmgraph.cache.plan.make_plan` does.
"""

from __future__ import annotations

import logging
import math

from hmgraph.cache.budget import format_bytes
from hmgraph.cache.coordinated import MARK_BYTES
from hmgraph.cache.policies import POLICIES
from hmgraph.cache.slots import SLOT_BYTES

log = logging.getLogger(__name__)

__all__ = ["METADATA_SLACK_BYTES", "fit_host_rows", "metadata_bytes",
           "store_metadata_bytes"]

#: Bookkeeping a positive host budget too small for it may leave
#: unbudgeted (small graphs: the tables of a graph of some 40,000 nodes),
#: reported as such; more is refused.
METADATA_SLACK_BYTES = 1 << 20


def store_metadata_bytes(num_rows: int, capacity: int) -> int:
    """Host bytes of one `SlotStore`'s tables; 0 when it has no slots.

    An id -> slot table per node (int32, int64 past 2**31 slots), a
    slot -> id table and a stack of free slots per slot (int64 each), and
    the compiled engine's read stamp (int32): `SLOT_BYTES` per slot.
    A store without slots is not built.
    """
    if capacity <= 0:
        return 0
    table = 4 if capacity < 2**31 else 8
    return table * num_rows + SLOT_BYTES * capacity


def _metadata_parts(policy, num_rows, device_rows, host_rows,
                    staging_rows):
    """(bytes per node, bytes for the slots) of a layout's bookkeeping."""
    cls = POLICIES[policy]
    per_node, slots = cls.layout_metadata((device_rows, host_rows))
    stores = [rows for rows in (device_rows, host_rows) if rows > 0]
    # One id -> slot table per store; the tiers of a layer that spans
    # them share theirs (`SlotTable`).
    tables = [sum(stores)] if cls.spans_stores and stores else stores
    for capacity in tables + ([staging_rows] if staging_rows > 0 else []):
        per_node += store_metadata_bytes(1, capacity) - SLOT_BYTES * capacity
        slots += SLOT_BYTES * capacity
    if staging_rows > 0:
        per_node += MARK_BYTES
    return per_node, slots


def metadata_bytes(policy: str, num_rows: int, device_rows: int,
                   host_rows: int, staging_rows: int = 0) -> int:
    """Host bytes of bookkeeping a cache of this layout keeps.

    What `hmgraph.cache.plan.build_cache` allocates besides rows: the
    policies' per-node and per-slot state (`Policy.layout_metadata` of
    their classes), each store's tables (`store_metadata_bytes`) and,
    with staging, the window's marks (1 byte per node). Stores without
    rows, and layers without stores, are not built and cost nothing.

    Parameters
    ----------
    policy : str
        A key of `hmgraph.cache.policies.POLICIES` except ``belady``.
    num_rows : int
        Nodes of the graph (rows of the feature matrix).
    device_rows, host_rows, staging_rows : int
        Rows of the device, host and staging stores.

    Returns
    -------
    int
        Bytes; every one of them lives in host memory.
    """
    per_node, slots = _metadata_parts(policy, num_rows, device_rows,
                                      host_rows, staging_rows)
    return per_node * num_rows + slots


def _fit(cost, budget: int, limit: int) -> int:
    """The largest ``rows`` in ``[0, limit]`` with ``cost(rows) <= budget``
    (``cost`` grows with ``rows``; 0 when nothing fits)."""
    if budget < 0 or cost(1) > budget or limit <= 0:
        return 0
    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _at_least(num_bytes: int) -> str:
    """``num_bytes`` in decimal units to three digits, rounded up (both
    a budget to give and the bookkeeping it must hold)."""
    for power, unit in enumerate(("B", "KB", "MB", "GB", "TB")):
        scale = 1000 ** power
        if num_bytes < 1000 * scale or unit == "TB":
            if unit == "B":
                return f"{num_bytes} B"
            value = num_bytes / scale
            decimals = 2 if value < 10 else 1 if value < 100 else 0
            step = 10 ** decimals
            return f"{math.ceil(value * step) / step:.{decimals}f} {unit}"
    raise AssertionError("unreachable")


def fit_host_rows(policy, num_rows, row_bytes, device_rows, budget,
                  staging):
    """Host and staging rows that fit ``budget`` with their bookkeeping,
    and whether the bookkeeping was charged.

    The budget pays for the device tier's bookkeeping, then staging, then
    host rows (see `hmgraph.cache.plan.make_plan`).

    Parameters
    ----------
    policy : str
        A key of `hmgraph.cache.policies.POLICIES`.
    num_rows, row_bytes : int
        The feature matrix: rows, and bytes per row.
    device_rows : int
        Rows of the device store (their bookkeeping is in host memory).
    budget : int
        Host budget in bytes; 0 asks for no host tier.
    staging : float
        Share for window read planning of what the bookkeeping leaves.

    Returns
    -------
    tuple of (int, int, bool)
        ``(host_rows, staging_rows, charged)``: ``charged`` is whether
        the bookkeeping came out of ``budget``.

    Raises
    ------
    ValueError
        In one line, for a positive budget below the bookkeeping plus
        one host row when the bookkeeping is over
        `METADATA_SLACK_BYTES`.
    """
    fixed = metadata_bytes(policy, num_rows, device_rows, 0)
    if budget <= 0:
        return 0, 0, fixed == 0
    limit = num_rows - device_rows if POLICIES[policy].holds_rows else 0
    # Room for the bookkeeping with a host tier, and one row in it.
    need = metadata_bytes(policy, num_rows, device_rows, 1) + row_bytes \
        if limit else fixed
    if budget < need:
        per_node, _ = _metadata_parts(policy, num_rows, device_rows,
                                      1 if limit else 0, 0)
        _, slots = _metadata_parts(policy, num_rows, device_rows, 0, 0)
        metadata = per_node * num_rows + slots
        if metadata > METADATA_SLACK_BYTES:
            detail = f"{per_node} B per node x {num_rows:,} nodes"
            if slots:
                detail += (f" + {format_bytes(slots)} for "
                           f"{device_rows:,} device rows")
            raise ValueError(
                f"host budget {format_bytes(budget)} cannot hold the "
                f"cache's metadata of {_at_least(metadata)} ({detail}); "
                f"give at least {_at_least(need)}")
        log.warning("host budget %s holds no host row besides the cache's "
                    "metadata of %s", format_bytes(budget),
                    format_bytes(metadata))
        return 0, 0, budget >= fixed
    free = budget - fixed
    if staging > 0 and limit and metadata_bytes(
            policy, num_rows, device_rows, limit) - fixed \
            + limit * row_bytes <= free:
        # Every row fits: the host tier holds them all, nothing to stage.
        return limit, 0, True

    def staged(rows):
        return metadata_bytes(policy, num_rows, device_rows, 0, rows) \
            - fixed + rows * row_bytes

    staging_rows = _fit(staged, int(free * staging), num_rows) \
        if staging > 0 else 0
    free -= staged(staging_rows)
    base = metadata_bytes(policy, num_rows, device_rows, 0, staging_rows)

    def held(rows):
        return metadata_bytes(policy, num_rows, device_rows, rows,
                              staging_rows) - base + rows * row_bytes

    return _fit(held, free, limit), staging_rows, True

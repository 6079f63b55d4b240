"""Cache plans: how many rows each tier holds, and how, from a profile.

`make_plan` turns budgets (bytes) and access counts (tensors) into a
`CachePlan`; `build_cache` turns a plan into a `FeatureCache` over a source
tier. For ``hmgraph`` the split of the cache into a static part (hottest
rows, filled once) and a dynamic part (refilled online with lookahead) is
chosen by replaying the policy on the profiled trace for several splits
and keeping the one with the highest hit rate: the profiled hit-rate curve,
not a constant, decides.

A plan knows a policy by its class (`hmgraph.cache.policies.Policy`):
whether it holds rows, spans the stores as one layer, looks ahead, has
its static split replayed, its layers' bookkeeping and the rows it pins
on the device are asked of it, never decided by its name.

**Metadata is charged.** Besides rows, a cache keeps bookkeeping in host
memory: per node of the graph (each store's id -> slot table, each
policy's flags and ranks, the window's marks) and per cached row (slot ->
id tables, free lists, the policy's held ids). `metadata_bytes` states it
for a layout; `make_plan` takes it out of the host budget before sizing
the host tier and refuses, in one line, a host budget that cannot hold it.
A host budget of 0 asks for no host tier: the bookkeeping of the device
tier then lives in host memory outside every budget, and the plan reports
it as ``metadata_unbudgeted_bytes``; so does a budget too small for the
bookkeeping of a small graph (up to `METADATA_SLACK_BYTES`). The device
holds no bookkeeping but batch reuse's id table, taken from the device
budget.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from hmgraph.cache.budget import format_bytes
from hmgraph.cache.coordinated import FeatureCache, Layer
from hmgraph.cache.feature import Feature
from hmgraph.cache.metadata import (
    METADATA_SLACK_BYTES,
    fit_host_rows,
    metadata_bytes,
    store_metadata_bytes,
)
from hmgraph.cache.policies import POLICIES, make_policy
from hmgraph.cache.policy_base import hot_first
from hmgraph.cache.reuse import TABLE_BYTES_PER_ROW, reuse_profile
from hmgraph.cache.slots import SlotStore, SlotTable
from hmgraph.cache.trace_replay import (
    STATIC_SHARES,
    belady_policy,
    choose_static_rows,
    replay,
    replay_hits,
    split_profile,
)

log = logging.getLogger(__name__)

__all__ = ["METADATA_SLACK_BYTES", "REUSE_HEADROOM_PERCENT",
           "STATIC_SHARES", "CachePlan",
           "belady_policy", "build_cache", "make_plan", "metadata_bytes",
           "replay", "replay_hits", "reuse_ring_rows",
           "store_metadata_bytes"]

#: Reuse buffers are sized to this share (%) of the most rows the profile
#: held at once: an epoch samples other neighbours than its profile, and a
#: batch past the buffers keeps fewer rows for the next.
REUSE_HEADROOM_PERCENT = 125


@dataclass
class CachePlan:
    """What each tier holds.

    Attributes
    ----------
    policy : str
        Registry name.
    device_rows, host_rows : int
        Rows the device and host tiers hold (their budgets in rows).
    static_rows : int
        ``hmgraph``: rows of the static part (hottest first, device
        first); the rest of both tiers is the dynamic region.
    window : int
        Batches of lookahead: the policy's (``hmgraph``) and staging's
        (``staging_rows``); 0 where neither looks ahead.
    curve : list of dict
        ``hmgraph``: profiled hit rate for each static share tried.
    reuse_levels : int
        Batch reuse levels (0: off).
    reuse_rows : int
        Device rows reserved per reuse level, taken from the device
        budget before the cache gets the rest.
    reuse_rate : float
        Share of rows the reuse buffers served on the profile.
    reuse_resident_rows : int
        Rows left out when sizing the reuse buffers: those the device
        tier holds for good, which batch reuse never keeps (0: sized on
        every row).
    staging_rows : int
        Host rows set aside for window read planning (rows the next
        batches need, brought along by this batch's block reads), taken
        from the host budget; 0 when off.
    span_rows : int
        Static rows below the device tier's held as whole spans of this
        many consecutive rows, the densest first
        (`hmgraph.cache.placement`); 0: the hottest rows.
    host_metadata_charged : bool
        Whether the bookkeeping (`metadata_bytes`, host memory) came out
        of the host budget; False when the host budget was 0 or, for a
        small graph, too small for it.
    """

    policy: str
    num_rows: int
    row_bytes: int
    device_rows: int
    host_rows: int
    static_rows: int = 0
    window: int = 0
    curve: list = field(default_factory=list)
    reuse_levels: int = 0
    reuse_rows: int = 0
    reuse_rate: float = 0.0
    reuse_resident_rows: int = 0
    staging_rows: int = 0
    host_metadata_charged: bool = True
    span_rows: int = 0

    def metadata_bytes(self) -> dict[str, int]:
        """Bytes of bookkeeping per tier's memory.

        ``host``: the cache's tables and policy state (`metadata_bytes`);
        ``device``: batch reuse's id table.
        """
        table = self.num_rows * TABLE_BYTES_PER_ROW if self.reuse_levels \
            else 0
        return {"device": table,
                "host": metadata_bytes(self.policy, self.num_rows,
                                       self.device_rows, self.host_rows,
                                       self.staging_rows)}

    @property
    def held_rows(self) -> int:
        """Rows the two tiers hold."""
        return self.device_rows + self.host_rows

    @property
    def placed_rows(self) -> int:
        """Rows placed by score for good: the static part, or both tiers
        for a policy that does not split them."""
        if POLICIES[self.policy].splits_static:
            return self.static_rows
        return self.held_rows

    @property
    def hit_rate(self) -> float:
        """Profiled hit rate: the chosen split's on the replayed
        ``curve``, else the share of rows the tiers hold."""
        for point in self.curve:
            if point["static_rows"] == self.static_rows:
                return point["hit_rate"]
        return min(1.0, self.held_rows / self.num_rows) if self.num_rows \
            else 0.0

    @property
    def device_static_rows(self) -> int:
        """Static rows on the device (the hottest)."""
        return min(self.static_rows, self.device_rows)

    @property
    def host_static_rows(self) -> int:
        """Static rows in host memory."""
        return self.static_rows - self.device_static_rows

    def as_dict(self) -> dict:
        """The plan as JSON-ready data, derived sizes included."""
        record = asdict(self)
        table = self.num_rows * TABLE_BYTES_PER_ROW if self.reuse_levels \
            else 0
        record.update(
            reuse_bytes=self.reuse_levels * self.reuse_rows * self.row_bytes
            + table,
            reuse_table_bytes=table,
            device_bytes=self.device_rows * self.row_bytes,
            host_bytes=self.host_rows * self.row_bytes,
            staging_bytes=self.staging_rows * self.row_bytes,
            device_static_rows=self.device_static_rows,
            device_dynamic_rows=self.device_rows - self.device_static_rows,
            host_static_rows=self.host_static_rows,
            host_dynamic_rows=self.host_rows - self.host_static_rows,
        )
        metadata = self.metadata_bytes()
        record.update(
            metadata_bytes=metadata,
            metadata_unbudgeted_bytes=0 if self.host_metadata_charged
            else metadata["host"],
        )
        return record

    def describe(self) -> str:
        """One line for the log."""
        text = (f"cache plan: {self.policy}, device {self.device_rows} rows,"
                f" host {self.host_rows} rows of {self.num_rows}")
        policy = POLICIES[self.policy]
        if policy.splits_static:
            text += (f"; static {self.static_rows} (device "
                     f"{self.device_static_rows}, host "
                     f"{self.host_static_rows}), dynamic "
                     f"{self.device_rows + self.host_rows - self.static_rows}")
        if policy.looks_ahead:
            text += f", window {self.window}"
        if self.span_rows:
            text += f"; static rows in spans of {self.span_rows}"
        if self.staging_rows:
            text += f"; staging {self.staging_rows} host rows"
        host = self.metadata_bytes()["host"]
        if host:
            text += (f"; metadata {format_bytes(host)} of host memory"
                     + ("" if self.host_metadata_charged
                        else " (no host budget: not charged)"))
        if self.reuse_levels:
            text += (f"; reuse {self.reuse_levels} level(s) of "
                     f"{self.reuse_rows} device rows (profiled reuse "
                     f"{self.reuse_rate:.1%}")
            if self.reuse_resident_rows:
                text += (f", sized without the {self.reuse_resident_rows} "
                         f"rows the device holds for good")
            text += ")"
        return text


def make_plan(policy: str, num_rows: int, row_bytes: int,
              device_budget_bytes: int, host_budget_bytes: int, *,
              counts: torch.Tensor | None = None,
              trace: Sequence[torch.Tensor] = (), window: int = 4,
              reuse_levels: int = 0, staging: float = 0.0,
              trace_covers_epoch: bool = False) -> CachePlan:
    """Plan a cache within the budgets.

    Parameters
    ----------
    policy : str
        A key of `hmgraph.cache.policies.POLICIES` except ``belady``.
    num_rows, row_bytes : int
        The feature matrix.
    device_budget_bytes, host_budget_bytes : int
        Memory for cached rows per tier; rows held never exceed them.
    counts : torch.Tensor, optional
        Profiled accesses per row (``hmgraph``: chooses the static split).
    trace : sequence of torch.Tensor
        Profiled unique input ids per batch (``hmgraph``).
    window : int
        Lookahead batches (``hmgraph``).
    reuse_levels : int
        Batch reuse levels (0, 1, 2). Their id tables
        (`hmgraph.cache.reuse.TABLE_BYTES_PER_ROW` per node) and buffers
        come out of the device budget first, the buffers sized from the
        profiled trace (`hmgraph.cache.reuse.reuse_profile`: the most rows
        the levels hold at once); the cache's device tier gets what is
        left.
    staging : float
        Share of the host budget for window read planning, in [0, 1)
        (see `hmgraph.cache.coordinated`); the host tier gets the rest.
    trace_covers_epoch : bool
        Whether ``trace`` holds every batch of an epoch. Batch reuse
        keeps no row the device tier holds for good, so with a static
        tier on the device (``hmgraph``, ``presample``) the buffers are
        sized again without those rows, and what they give back goes to
        the cache. A trace of the whole epoch is used as it is; a shorter
        one is held out, as the epoch's other batches: rows pinned by the
        counts of its first half, the buffers sized on its second.

    Returns
    -------
    CachePlan

    Raises
    ------
    ValueError
        In one line, for a host budget that cannot hold the cache's
        bookkeeping (`metadata_bytes`), naming the least that does.

    Notes
    -----
    The host budget pays first for the bookkeeping of the device tier's
    layout (host memory), then for staging (its share of what is left,
    its tables included), then for host rows, each costing its row bytes
    and its slot's bookkeeping. A host budget of 0 holds no rows and
    charges nothing; a positive one below the bookkeeping plus one host
    row is refused unless the bookkeeping is at most
    `METADATA_SLACK_BYTES` (a small graph), and then holds no rows.
    Bookkeeping left unpaid is reported as unbudgeted
    (`CachePlan.host_metadata_charged` is False).
    """
    _check_request(policy, row_bytes, staging, counts)
    layout = partial(_layout, policy, num_rows, row_bytes,
                     host_budget=host_budget_bytes, staging=staging,
                     counts=counts, trace=trace, window=window)
    if reuse_levels:
        plan = _with_reuse(layout, num_rows, row_bytes, device_budget_bytes,
                           reuse_levels, counts, trace, trace_covers_epoch)
    else:
        plan = layout(device_budget_bytes // row_bytes)
    log.info("%s", plan.describe())
    return plan


def _check_request(policy, row_bytes, staging, counts) -> None:
    """`make_plan`'s checks of its arguments, each a one-line error."""
    if policy not in POLICIES or POLICIES[policy].offline:
        names = ", ".join(n for n, c in POLICIES.items() if not c.offline)
        raise ValueError(f"unknown cache policy {policy!r}; available: "
                         f"{names}")
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    if not 0.0 <= staging < 1.0:
        raise ValueError(f"staging must be a share of the host budget in "
                         f"[0, 1), got {staging}")
    if POLICIES[policy].splits_static and counts is None:
        raise ValueError(f"the {policy} plan needs profiled counts")


def _with_reuse(layout, num_rows, row_bytes, device_budget_bytes,
                reuse_levels, counts, trace, trace_covers_epoch) -> CachePlan:
    """`make_plan` with batch reuse: its id table and ring come out of the
    device budget first; ``layout(device_rows, first=None)`` plans the
    cache on what is left."""
    if not trace:
        raise ValueError("batch reuse needs a profiled trace to size its "
                         "buffers")
    table = num_rows * TABLE_BYTES_PER_ROW
    if device_budget_bytes < table:
        raise ValueError(
            f"batch reuse needs {table} bytes of device memory for its id "
            f"table ({TABLE_BYTES_PER_ROW} per node) besides its buffers; "
            f"the device budget is {device_budget_bytes} bytes: raise it")
    device_rows = (device_budget_bytes - table) // row_bytes

    def with_ring(sizing, resident=None, first=None) -> CachePlan:
        profile = reuse_profile(sizing, reuse_levels, resident)
        # Headroom: the epoch's samples are not the profile's.
        profiled = max(profile["rows_per_level"])
        rows = min(-(-profiled * REUSE_HEADROOM_PERCENT // 100),
                   device_rows // reuse_levels)
        plan = layout(device_rows - reuse_levels * rows, first=first)
        plan.reuse_levels, plan.reuse_rows = reuse_levels, rows
        plan.reuse_rate = profile["reuse_rate"]
        plan.reuse_resident_rows = 0 if resident is None else int(
            resident.sum())
        return plan

    # The ring sized on every profiled row, then without the rows that
    # layout's device tier holds for good (`BatchReuse` keeps none); what
    # it gives back goes to the cache, which holds those rows and more.
    # A trace of part of the epoch is split: rows pinned by the first
    # half's counts, the ring sized on the second half, as an epoch's
    # batches the profile did not see.
    plan = with_ring(trace)
    hotness, sizing = counts, trace
    if not trace_covers_epoch:
        hotness, sizing = split_profile(trace, num_rows) if len(trace) >= 2 \
            else (None, trace)
    resident = _device_resident(plan, hotness)
    if resident is not None:
        second = with_ring(sizing, resident, plan)
        if second.reuse_rows < plan.reuse_rows:
            plan = second
    return plan


def _layout(policy, num_rows, row_bytes, device_rows, host_budget, staging,
            counts, trace, window, first=None) -> CachePlan:
    """The plan with ``device_rows`` device rows and what the host budget
    holds besides; for a policy whose static split is replayed
    (``hmgraph``) the split on the profile (`choose_static_rows`), or, given
    a ``first`` plan of fewer rows, the same share of the cache and at
    least its static rows."""
    cls = POLICIES[policy]
    device_rows = min(num_rows, device_rows) if cls.holds_rows else 0
    host_rows, staging_rows, charged = fit_host_rows(
        policy, num_rows, row_bytes, device_rows, host_budget, staging)
    plan = CachePlan(policy, num_rows, row_bytes, device_rows, host_rows,
                     staging_rows=staging_rows,
                     host_metadata_charged=charged)
    # Staging reads the next batches' rows along: it needs the window
    # too, a static policy's plan included.
    if cls.looks_ahead or staging_rows:
        plan.window = window
    if not cls.splits_static:
        return plan
    capacity = device_rows + host_rows
    if first is None:
        plan.static_rows, plan.curve = choose_static_rows(
            policy, num_rows, capacity, counts, list(trace), window)
    else:
        before = first.device_rows + first.host_rows
        share = first.static_rows / before if before else 1.0
        plan.static_rows = min(capacity, max(first.static_rows,
                                             round(share * capacity)))
        plan.curve = first.curve
    return plan


def reuse_ring_rows(plan: CachePlan, levels: int, sizing: dict,
                    table_bytes: int) -> int:
    """Device rows batch reuse takes from the cache: its id table and
    ``levels`` buffers, each sized as `make_plan` sizes them on the
    profile (``sizing``: `hmgraph.cache.reuse.reuse_profile`), or as
    ``plan`` (with reuse) sized them."""
    table = -(-table_bytes // plan.row_bytes)
    if plan.reuse_levels:
        return table + plan.reuse_levels * plan.reuse_rows
    room = max(0, plan.device_rows - table)
    ring = min(-(-max(sizing["rows_per_level"]) * REUSE_HEADROOM_PERCENT
                 // 100), room // levels)
    return min(plan.device_rows, table + levels * ring)


def _device_resident(plan: CachePlan, counts) -> torch.Tensor | None:
    """Rows ``plan``'s device tier holds for good
    (`FeatureCache.static_on_device`), a bool per row: the hottest by
    ``counts``, as many as its policy pins there
    (`Policy.pinned_hot_rows`: the device's static rows for ``hmgraph``,
    all its rows for ``presample``); None for none."""
    rows = POLICIES[plan.policy].pinned_hot_rows(plan.device_rows,
                                                 plan.static_rows)
    if counts is None or rows == 0:
        return None
    resident = torch.zeros(plan.num_rows, dtype=torch.bool)
    resident[hot_first(counts)[:rows]] = True
    return resident


def build_cache(source: Feature, plan: CachePlan, device="cpu", *,
                counts: torch.Tensor | None = None,
                degrees: torch.Tensor | None = None,
                hop_counts: torch.Tensor | None = None,
                engine: str = "compiled") -> FeatureCache:
    """A `FeatureCache` over ``source`` laid out as ``plan`` says.

    Parameters
    ----------
    source : Feature
        The tier misses come from (CPU rows).
    plan : CachePlan
        From `make_plan`.
    device : torch.device or str
        The training device: the device tier's memory and where reads
        return rows. Host memory is pinned when it is a CUDA device.
    counts, degrees, hop_counts : torch.Tensor, optional
        Profiled accesses per row (``presample``, ``hmgraph``), in-degrees
        (``degree``), profiled accesses per hop and row (``layer-aware``).
    engine : str
        ``"compiled"`` (the compiled engine where it serves the layout)
        or ``"torch"`` (the reference); see `FeatureCache`.
    """
    device = torch.device(device)
    n, shape, dtype = source.num_rows, source.row_shape, source.dtype
    cls = POLICIES[plan.policy]
    # Stores without rows are not built: their tables cost 4 B per node.
    # The tiers of one exclusive layer share one id -> slot table.
    both = plan.held_rows
    table = SlotTable(n, both) if cls.spans_stores else None
    stores = []
    if plan.device_rows and cls.holds_rows:
        stores.append(SlotStore("device", n, shape, dtype, plan.device_rows,
                                device, table=table))
    if plan.host_rows and cls.holds_rows:
        stores.append(SlotStore("host", n, shape, dtype, plan.host_rows,
                                "cpu", pin=device.type == "cuda",
                                table=table))
    # Each policy takes what it needs of these (`make_policy`).
    context = {"degrees": degrees, "hotness": counts,
               "hop_counts": hop_counts, "static_rows": plan.static_rows,
               "window": plan.window}
    if cls.spans_stores and stores:
        # One layer over the stores, filled in order: device first.
        layers = [Layer(make_policy(plan.policy, n, both, **context),
                        stores)]
    else:
        layers = [Layer(make_policy(plan.policy, n, store.capacity,
                                    **context), [store])
                  for store in stores]
    return FeatureCache(source, layers, device=device,
                        staging_rows=plan.staging_rows, engine=engine)

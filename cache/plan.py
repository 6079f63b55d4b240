"""Cache plans: how many rows each tier holds, and how, from a profile.

`make_plan` turns budgets (bytes) and access counts (tensors) into a
`CachePlan`; `build_cache` turns a plan into a `FeatureCache` over a source
tier. For ``hmgraph`` the split of the cache into a static part (hottest
rows, filled once) and a dynamic part (refilled online with lookahead) is
chosen by replaying the policy on the profiled trace for several splits
and keeping the one with the highest hit rate: the profiled hit-rate curve,
not a constant, decides.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from hmgraph.cache.coordinated import FeatureCache, Layer
from hmgraph.cache.feature import Feature
from hmgraph.cache.policies import POLICIES, make_policy
from hmgraph.cache.reuse import TABLE_BYTES_PER_ROW, reuse_profile
from hmgraph.cache.slots import SlotStore

log = logging.getLogger(__name__)

__all__ = ["CachePlan", "build_cache", "make_plan", "replay",
           "replay_hits"]

#: Static shares of the cache tried when choosing the hmgraph split.
STATIC_SHARES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


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
        ``hmgraph``: batches of lookahead.
    curve : list of dict
        ``hmgraph``: profiled hit rate for each static share tried.
    reuse_levels : int
        Batch reuse levels (0: off).
    reuse_rows : int
        Device rows reserved per reuse level, taken from the device
        budget before the cache gets the rest.
    reuse_rate : float
        Share of rows the reuse buffers served on the profile.
    staging_rows : int
        Host rows set aside for window read planning (rows the next
        batches need, brought along by this batch's block reads), taken
        from the host budget; 0 when off.
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
    staging_rows: int = 0

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
        return record

    def describe(self) -> str:
        """One line for the log."""
        text = (f"cache plan: {self.policy}, device {self.device_rows} rows,"
                f" host {self.host_rows} rows of {self.num_rows}")
        if self.policy == "hmgraph":
            text += (f"; static {self.static_rows} (device "
                     f"{self.device_static_rows}, host "
                     f"{self.host_static_rows}), dynamic "
                     f"{self.device_rows + self.host_rows - self.static_rows}"
                     f", window {self.window}")
        if self.staging_rows:
            text += f"; staging {self.staging_rows} host rows"
        if self.reuse_levels:
            text += (f"; reuse {self.reuse_levels} level(s) of "
                     f"{self.reuse_rows} device rows (profiled reuse "
                     f"{self.reuse_rate:.1%})")
        return text


def make_plan(policy: str, num_rows: int, row_bytes: int,
              device_budget_bytes: int, host_budget_bytes: int, *,
              counts: torch.Tensor | None = None,
              trace: Sequence[torch.Tensor] = (), window: int = 4,
              reuse_levels: int = 0, staging: float = 0.0) -> CachePlan:
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
        Batch reuse levels (0, 1, 2). Their id table (8 bytes per node)
        and buffers come out of the device budget first, the buffers sized
        from the profiled trace (the largest batch, and for two levels the
        largest set of rows the next batch did not share); the cache's
        device tier gets what is left.
    staging : float
        Share of the host budget for window read planning, in [0, 1)
        (see `hmgraph.cache.coordinated`); the host tier gets the rest.

    Returns
    -------
    CachePlan
    """
    if policy not in POLICIES or policy == "belady":
        names = ", ".join(n for n in POLICIES if n != "belady")
        raise ValueError(f"unknown cache policy {policy!r}; available: "
                         f"{names}")
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    device_rows = device_budget_bytes // row_bytes
    reuse_rows, reuse_rate = 0, 0.0
    if reuse_levels:
        if not trace:
            raise ValueError("batch reuse needs a profiled trace to size "
                             "its buffers")
        table = num_rows * TABLE_BYTES_PER_ROW
        if device_budget_bytes < table:
            raise ValueError(
                f"batch reuse needs {table} bytes of device memory for its "
                f"id table ({TABLE_BYTES_PER_ROW} per node) besides its "
                f"buffers; the device budget is {device_budget_bytes} "
                f"bytes: raise it"
            )
        device_rows = (device_budget_bytes - table) // row_bytes
        profile = reuse_profile(trace, reuse_levels)
        reuse_rows = min(max(profile["rows_per_level"]),
                         device_rows // reuse_levels)
        reuse_rate = profile["reuse_rate"]
        device_rows -= reuse_levels * reuse_rows
    if not 0.0 <= staging < 1.0:
        raise ValueError(f"staging must be a share of the host budget in "
                         f"[0, 1), got {staging}")
    device_rows = min(num_rows, device_rows)
    host_rows = host_budget_bytes // row_bytes
    staging_rows = min(num_rows, int(host_rows * staging))
    host_rows = min(num_rows - device_rows, host_rows - staging_rows)
    if policy == "none":
        device_rows = host_rows = 0
    plan = CachePlan(policy, num_rows, row_bytes, device_rows, host_rows,
                     reuse_levels=reuse_levels, reuse_rows=reuse_rows,
                     reuse_rate=reuse_rate, staging_rows=staging_rows)
    if policy == "hmgraph":
        if counts is None:
            raise ValueError("the hmgraph plan needs profiled counts")
        plan.window = window
        plan.static_rows, plan.curve = _choose_static(
            num_rows, device_rows + host_rows, counts, list(trace), window)
    log.info("%s", plan.describe())
    return plan


def _choose_static(num_rows, capacity, counts, trace, window):
    """Static rows with the best replayed hit rate on the profile."""
    if capacity == 0 or len(trace) < 2:
        return capacity, []
    # Hotness from the first half, replay on the second: a static part is
    # judged on batches it was not chosen from.
    half = len(trace) // 2
    hotness = torch.zeros(num_rows, dtype=torch.int64)
    for ids in trace[:half]:
        hotness[ids] += 1
    curve = []
    for share in STATIC_SHARES:
        static_rows = int(round(share * capacity))
        policy = make_policy("hmgraph", num_rows, capacity, hotness=hotness,
                             static_rows=static_rows, window=window)
        rate = replay(policy, trace[half:])
        curve.append({"static_share": share, "static_rows": static_rows,
                      "hit_rate": rate})
    # The highest hit rate; on a tie the larger static part (no refills).
    best = max(curve, key=lambda p: (round(p["hit_rate"], 4),
                                     p["static_rows"]))
    return best["static_rows"], curve


def replay(policy, trace: Sequence[torch.Tensor], window: int | None = None
           ) -> float:
    """Hit rate of ``policy`` on a trace of unique-id batches.

    Parameters
    ----------
    policy : hmgraph.cache.policies.Policy
        A fresh policy; it is warmed, then stepped through the trace with
        the next ``window`` batches as lookahead (default: its own
        ``window`` attribute, or none).
    trace : sequence of torch.Tensor
        Unique int64 ids per batch.

    Returns
    -------
    float
        Hits over requested rows; 0.0 for an empty trace.
    """
    hits, requested = replay_hits(policy, trace, window)
    return hits / requested if requested else 0.0


def replay_hits(policy, trace: Sequence[torch.Tensor],
                window: int | None = None, on_miss=None,
                lookahead: Sequence[torch.Tensor] | None = None
                ) -> tuple[int, int]:
    """Hits and requested rows of a replay (see `replay`).

    ``on_miss``, if given, is called with each batch's missed ids (sorted,
    unique), e.g. to cost them in storage blocks. ``lookahead``, if given
    (as long as ``trace``), is what the next ``window`` batches are taken
    from instead of ``trace``: batch reuse asks the cache for the rows it
    did not reuse and passes on the next batches whole.
    """
    if window is None:
        window = getattr(policy, "window", 0)
    ahead = trace if lookahead is None else lookahead
    policy.warm()
    hits = requested = 0
    for index, ids in enumerate(trace):
        future = ahead[index + 1:index + 1 + window] if window else ()
        hit = policy.step(ids, future).hit
        hits += int(hit.sum())
        requested += ids.numel()
        if on_miss is not None:
            on_miss(ids[~hit])
    return hits, requested


def build_cache(source: Feature, plan: CachePlan, device="cpu", *,
                counts: torch.Tensor | None = None,
                degrees: torch.Tensor | None = None,
                hop_counts: torch.Tensor | None = None) -> FeatureCache:
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
    """
    device = torch.device(device)
    n, shape, dtype = source.num_rows, source.row_shape, source.dtype
    device_store = SlotStore("device", n, shape, dtype, plan.device_rows,
                             device)
    host_store = SlotStore("host", n, shape, dtype, plan.host_rows, "cpu",
                           pin=device.type == "cuda")
    context = {"degrees": degrees, "hotness": counts,
               "hop_counts": hop_counts}
    both = plan.device_rows + plan.host_rows
    if plan.policy == "none":
        layers = []
    elif plan.policy == "hmgraph":
        policy = make_policy("hmgraph", n, both, hotness=counts,
                             static_rows=plan.static_rows,
                             window=plan.window)
        layers = [Layer(policy, [device_store, host_store])]
    elif plan.policy in ("degree", "presample", "layer-aware"):
        # Static contents: the top rows, the very top on the device.
        policy = make_policy(plan.policy, n, both, **context)
        layers = [Layer(policy, [device_store, host_store])]
    else:
        layers = [
            Layer(make_policy(plan.policy, n, plan.device_rows, **context),
                  [device_store]),
            Layer(make_policy(plan.policy, n, plan.host_rows, **context),
                  [host_store]),
        ]
    return FeatureCache(source, layers, device=device,
                        staging_rows=plan.staging_rows)

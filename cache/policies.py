"""Cache policies as id-level state machines, shared by loader and replay.

A policy decides which rows of a feature matrix a cache layer of
``capacity`` rows holds; it never touches row data. For each mini-batch it
gets the batch's unique input ids (and, where it looks ahead, the ids of the
next batches already sampled) and returns a `Step`: which ids hit, which
resident ids to evict and which missed ids to admit. The data layer
(`hmgraph.cache.coordinated`) applies steps to real memory; the analysis
replays the same steps on a recorded trace, so both count the same hits.

Every step is vectorised over ids (torch ops, no Python loop over ids),
and costs in proportion to the batch and the capacity, never the graph.

**Metadata.** A policy keeps host-memory bookkeeping: per node of the
graph (``resident``, and what the policy ranks by) and per slot of its
capacity. Each class states both as ``node_bytes`` and ``slot_bytes``;
`hmgraph.cache.plan` charges them to the host budget before sizing the
tiers, and `Policy.metadata_nbytes` measures what is really allocated.

**What the plan asks.** `hmgraph.cache.plan` knows a policy by its class
alone, never by its name: whether it holds rows (``holds_rows``), spans
the device and host stores as one layer (``spans_stores``), is offline
(``offline``), looks ahead (``looks_ahead``), has its static share
chosen by replay (``splits_static``), the capacity of its layers
(`Policy.layer_capacities`), their bookkeeping (`Policy.layout_metadata`)
and how many of the hottest rows it holds for good on the device
(`Policy.pinned_hot_rows`); what it must be built with is ``needs``.
A new policy is one class in the module of its family (contract in
`hmgraph.cache.policy_base`) and one entry of `POLICIES` here.

Policies, by registry name:

``none``       no cache.
``degree``     static: the rows of highest in-degree (PaGraph).
``presample``  static: the rows most accessed in a profiling pass (GNNLab).
``layer-aware`` static: rows by per-hop need, hops near the seeds first
               (2PGraph).
``lru``        dynamic: least recently used out, every miss admitted.
``clock``      dynamic: CLOCK (second chance), every miss admitted.
``hmgraph``    static hot rows plus a dynamic region whose evictions use the
               next uses known in the lookahead window, and profiled hotness
               beyond it; misses are admitted only when they would be used
               before the row they replace (Belady's bypass).
``belady``     the same rule with the whole future known (offline OPT).
"""

from __future__ import annotations

from hmgraph.cache.policy_base import NoCachePolicy, Policy, Step
from hmgraph.cache.policy_lookahead import (
    BeladyPolicy,
    HMGraphPolicy,
    next_use_trace,
)
from hmgraph.cache.policy_recency import ClockPolicy, LRUPolicy
from hmgraph.cache.policy_static import (
    DegreePolicy,
    LayerAwarePolicy,
    PresamplePolicy,
    StaticPolicy,
    layer_aware_score,
)

__all__ = [
    "POLICIES",
    "BeladyPolicy",
    "ClockPolicy",
    "DegreePolicy",
    "HMGraphPolicy",
    "LRUPolicy",
    "LayerAwarePolicy",
    "NoCachePolicy",
    "Policy",
    "PresamplePolicy",
    "StaticPolicy",
    "Step",
    "layer_aware_score",
    "make_policy",
    "next_use_trace",
]


POLICIES = {
    cls.name: cls for cls in (
        NoCachePolicy, DegreePolicy, PresamplePolicy, LayerAwarePolicy,
        LRUPolicy,
        ClockPolicy, HMGraphPolicy, BeladyPolicy,
    )
}


def make_policy(name: str, num_rows: int, capacity: int, **context) -> Policy:
    """Build a policy by registry name.

    Parameters
    ----------
    name : str
        A key of `POLICIES`.
    num_rows, capacity : int
        See `Policy`.
    **context
        What some policies need: ``degrees`` (degree), ``hotness``
        (presample, hmgraph), ``hop_counts`` (layer-aware),
        ``static_rows`` and ``window`` (hmgraph).

    Raises
    ------
    ValueError
        For an unknown name, listing the available ones.
    """
    if name not in POLICIES:
        raise ValueError(
            f"unknown cache policy {name!r}; available: "
            f"{', '.join(POLICIES)}"
        )
    return POLICIES[name](num_rows, capacity, **context)

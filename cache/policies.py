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
A new policy is one class here.

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

import collections
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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

_EMPTY = torch.zeros(0, dtype=torch.int64)
_NEVER = torch.iinfo(torch.int64).max
_NEVER_NEAR = torch.iinfo(torch.int32).max  # HMGraphPolicy's next_use


@dataclass
class Step:
    """What a policy decided for one mini-batch.

    Attributes
    ----------
    hit : torch.Tensor
        bool, one per requested id: resident before the batch.
    evict : torch.Tensor
        int64 resident ids to drop (applied first).
    admit : torch.Tensor
        int64 missed ids to insert (after the evictions).
    """

    hit: torch.Tensor
    evict: torch.Tensor
    admit: torch.Tensor


class Policy(ABC):
    """Which rows a cache layer of ``capacity`` rows holds.

    Parameters
    ----------
    num_rows : int
        Rows of the feature matrix.
    capacity : int
        Rows the layer can hold; ``0 <= capacity <= num_rows``.
    """

    name = "policy"
    #: Whether `step` uses the ids of the batches ahead (a plan records
    #: its window only for these).
    looks_ahead = False
    #: Host bytes of bookkeeping per node of the graph (``resident``).
    node_bytes = 1
    #: Host bytes of bookkeeping per row of capacity.
    slot_bytes = 0
    #: Whether a cache of this policy holds rows at all; a plan gives a
    #: policy that holds none no device or host rows.
    holds_rows = True
    #: Whether one layer of this policy spans the device and host stores
    #: (the coordinated cache: exclusive tiers filled in order, one
    #: id -> slot table); else each store has a policy of its own.
    spans_stores = False
    #: Whether it needs the whole trace in advance (replay only: no plan).
    offline = False
    #: Whether the plan chooses its static share by replaying the profile
    #: (it is then built with ``static_rows`` and ``window``).
    splits_static = False
    #: What `make_policy` must be given for it (``degrees``, ``hotness``,
    #: ``hop_counts``): a loader profiles before building a policy that
    #: needs ``hotness`` or ``hop_counts``.
    needs: frozenset[str] = frozenset()

    def __init__(self, num_rows: int, capacity: int):
        if not 0 <= capacity <= num_rows:
            raise ValueError(
                f"capacity {capacity} rows is outside [0, {num_rows}]"
            )
        self.num_rows = num_rows
        self.capacity = capacity
        self.resident = torch.zeros(num_rows, dtype=torch.bool)
        self._size = 0

    @property
    def size(self) -> int:
        """Rows held now (counted as steps apply, not by a scan)."""
        return self._size

    @classmethod
    def layer_capacities(cls, store_rows: Sequence[int]) -> list[int]:
        """Rows of each layer this policy keeps over stores of
        ``store_rows`` rows (device first).

        Stores without rows are not built and get no layer; a policy
        that spans the stores keeps one layer over all of them, others
        one per store, and a policy that holds no rows none.
        """
        stores = [rows for rows in store_rows if rows > 0]
        if not cls.holds_rows:
            return []
        if cls.spans_stores:
            return [sum(stores)] if stores else []
        return stores

    @classmethod
    def layout_metadata(cls, store_rows: Sequence[int]) -> tuple[int, int]:
        """Host bytes of this policy's bookkeeping over stores of
        ``store_rows`` rows: ``(bytes per node, bytes for the slots)``.

        ``node_bytes`` per node and ``slot_bytes`` per row of every
        layer (`layer_capacities`); the stores' own tables are the
        plan's to count.
        """
        layers = cls.layer_capacities(store_rows)
        return cls.node_bytes * len(layers), cls.slot_bytes * sum(layers)

    @classmethod
    def pinned_hot_rows(cls, device_rows: int, static_rows: int) -> int:
        """How many of the hottest rows (by profiled accesses) the device
        store holds for good, of ``device_rows``, given a static part of
        ``static_rows`` (`splits_static`); 0 when its pinned rows are
        not ranked by the profiled accesses or it pins none.

        Batch reuse keeps none of these rows, so the plan sizes its
        buffers without them.
        """
        return 0

    @classmethod
    def metadata_bytes(cls, num_rows: int, capacity: int) -> int:
        """Host bytes of bookkeeping a policy of this class keeps.

        ``node_bytes`` per node plus ``slot_bytes`` per row of capacity;
        what `hmgraph.cache.plan.make_plan` charges to the host budget.
        """
        return cls.node_bytes * num_rows + cls.slot_bytes * capacity

    def metadata_nbytes(self) -> int:
        """Host bytes of bookkeeping allocated now, measured.

        Every tensor the policy holds, counted by its storage (a view
        keeps its whole storage alive), each storage once.
        """
        return _storage_bytes(self._tensors())

    def _tensors(self):
        """The tensors this policy keeps between steps."""
        return [v for v in vars(self).values()
                if isinstance(v, torch.Tensor)]

    def _hold(self, ids: torch.Tensor) -> None:
        """Mark unique ``ids`` resident, e.g. when warming (counted, not
        scanned: warming twice holds the same rows)."""
        self._size += int((~self.resident[ids]).sum())
        self.resident[ids] = True

    def warm(self) -> torch.Tensor:
        """Ids to load before the first batch, most valuable first."""
        return _EMPTY

    def pinned(self) -> torch.Tensor:
        """Ids this policy holds for good once warm (never evicted)."""
        return _EMPTY

    def step(self, ids: torch.Tensor,
             future: Sequence[torch.Tensor] = ()) -> Step:
        """Decide hits, evictions and admissions for one batch.

        Parameters
        ----------
        ids : torch.Tensor
            Unique int64 ids of the batch (CPU).
        future : sequence of torch.Tensor
            Unique ids of the next batches, nearest first (may be empty).
        """
        hit = self.resident[ids]
        step = self._step(ids, hit, future)
        self.resident[step.evict] = False
        self.resident[step.admit] = True
        self._size += step.admit.numel() - step.evict.numel()
        if self._size > self.capacity:
            raise RuntimeError(f"{self.name} holds {self._size} rows, over "
                               f"its capacity {self.capacity}")
        return step

    @abstractmethod
    def _step(self, ids, hit, future) -> Step:
        """See `step`; ``hit`` is precomputed."""


class NoCachePolicy(Policy):
    """No cache: every row comes from the tier below."""

    name = "none"
    node_bytes = 0
    holds_rows = False

    def __init__(self, num_rows: int, capacity: int = 0, **_):
        super().__init__(num_rows, 0)
        self.resident = torch.zeros(0, dtype=torch.bool)

    def step(self, ids: torch.Tensor,
             future: Sequence[torch.Tensor] = ()) -> Step:
        """Every id misses; nothing is kept per node."""
        return Step(torch.zeros(ids.numel(), dtype=torch.bool), _EMPTY,
                    _EMPTY)

    def _step(self, ids, hit, future) -> Step:
        return Step(hit, _EMPTY, _EMPTY)


class StaticPolicy(Policy):
    """Holds the ``capacity`` rows of highest score, never changes.

    One layer over the device and host stores: the top rows, the very
    top on the device.
    """

    slot_bytes = 8  # the held ids
    spans_stores = True

    def __init__(self, num_rows: int, capacity: int, score: torch.Tensor):
        super().__init__(num_rows, capacity)
        if score.numel() != num_rows:
            raise ValueError(
                f"{self.name} needs one score per row: got {score.numel()} "
                f"for {num_rows} rows"
            )
        order = torch.argsort(score.double(), descending=True, stable=True)
        # A copy: a view would keep the whole order (8 B per node) alive.
        self._contents = order[:capacity].clone()

    def warm(self) -> torch.Tensor:
        """The held rows, highest score first."""
        self._hold(self._contents)
        return self._contents

    def pinned(self) -> torch.Tensor:
        """Every held row: the contents never change."""
        return self._contents

    def _step(self, ids, hit, future) -> Step:
        return Step(hit, _EMPTY, _EMPTY)


class DegreePolicy(StaticPolicy):
    """Static: the rows of highest in-degree (PaGraph)."""

    name = "degree"
    needs = frozenset({"degrees"})

    def __init__(self, num_rows, capacity, *, degrees=None, **_):
        if degrees is None:
            raise ValueError("policy 'degree' needs the in-degrees")
        super().__init__(num_rows, capacity, degrees)


class PresamplePolicy(StaticPolicy):
    """Static: the rows most accessed in the profiling pass (GNNLab)."""

    name = "presample"
    needs = frozenset({"hotness"})

    def __init__(self, num_rows, capacity, *, hotness=None, **_):
        if hotness is None:
            raise ValueError("policy 'presample' needs profiled hotness")
        super().__init__(num_rows, capacity, hotness)

    @classmethod
    def pinned_hot_rows(cls, device_rows: int, static_rows: int) -> int:
        """Every device row: the device holds the hottest rows.

        See `Policy.pinned_hot_rows`.
        """
        return device_rows


class LayerAwarePolicy(StaticPolicy):
    """Static: rows by per-hop profiled need, hops near the seeds first.

    2PGraph's layer-aware placement: a row needed close to the seeds (as a
    seed or one-hop neighbour) is needed by more of the computation than a
    row needed only at the outermost hop. See `layer_aware_score`.
    """

    name = "layer-aware"
    needs = frozenset({"hop_counts"})

    def __init__(self, num_rows, capacity, *, hop_counts=None, **_):
        if hop_counts is None:
            raise ValueError("policy 'layer-aware' needs per-hop counts")
        super().__init__(num_rows, capacity, layer_aware_score(hop_counts))


def layer_aware_score(hop_counts: torch.Tensor) -> torch.Tensor:
    """Per-row score from per-hop access counts.

    Parameters
    ----------
    hop_counts : torch.Tensor
        (num_hops + 1, num_rows): batches in which a row was first needed
        at hop h (0 = seed).

    Returns
    -------
    torch.Tensor
        float64 (num_rows,): ``sum_h counts[h] * (H + 1 - h) / (H + 1)``,
        so a need at hop 0 weighs most and one at the last hop least;
        rows with equal totals are ordered by how close to the seeds they
        were needed.
    """
    hops = hop_counts.shape[0]
    weight = torch.arange(hops, 0, -1, dtype=torch.float64) / hops
    return (hop_counts.double() * weight[:, None]).sum(0)


class LRUPolicy(Policy):
    """Least recently used out; every miss is admitted.

    Rows are kept in groups by the batch that last used them, oldest
    first, so finding victims costs in proportion to the rows evicted and
    the batch, never to the graph or the cache.
    """

    name = "lru"
    node_bytes = 9  # resident, last_use
    #: Group entries are compacted past twice the capacity (plus a
    #: batch, which is working set).
    slot_bytes = 8 * 2

    def __init__(self, num_rows, capacity, **_):
        super().__init__(num_rows, capacity)
        self.last_use = torch.zeros(num_rows, dtype=torch.int64)
        self.clock = 0
        self._groups: collections.deque = collections.deque()
        self._grouped = 0  # ids held in groups (alive or stale)

    def _step(self, ids, hit, future) -> Step:
        self.clock += 1
        self.last_use[ids] = self.clock
        miss = ids[~hit]
        admit = miss[: self.capacity]
        self._group(ids[hit])  # before choosing: the batch's hits go last
        overflow = self.size + admit.numel() - self.capacity
        evict = self._oldest(overflow) if overflow > 0 else _EMPTY
        self._group(admit)  # held from now on
        if self._grouped > 2 * self.capacity + ids.numel():
            self._compact()
        return Step(hit, evict, admit)

    def _group(self, ids: torch.Tensor) -> None:
        if ids.numel():
            self._groups.append((self.clock, ids))
            self._grouped += ids.numel()

    def _tensors(self):
        return super()._tensors() + [ids for _, ids in self._groups]

    def _alive(self, clock: int, ids: torch.Tensor) -> torch.Tensor:
        """Those of ``ids`` still held and last used at ``clock``."""
        return ids[self.resident[ids] & (self.last_use[ids] == clock)]

    def _oldest(self, count: int) -> torch.Tensor:
        """The ``count`` held rows used least recently (ties: any)."""
        taken = []
        while count > 0:
            clock, ids = self._groups.popleft()
            self._grouped -= ids.numel()
            alive = self._alive(clock, ids)
            take = alive[:count]
            taken.append(take)
            count -= take.numel()
            if take.numel() < alive.numel():
                rest = alive[take.numel():]
                self._groups.appendleft((clock, rest))
                self._grouped += rest.numel()
        return torch.cat(taken)

    def _compact(self) -> None:
        """Drop group entries of rows evicted or used again since."""
        groups = [(c, self._alive(c, ids)) for c, ids in self._groups]
        self._groups = collections.deque(
            (c, ids) for c, ids in groups if ids.numel())
        self._grouped = sum(ids.numel() for _, ids in self._groups)


class ClockPolicy(Policy):
    """CLOCK (second chance) at mini-batch granularity.

    Slots form a ring swept by a hand. A hit sets the row's reference bit;
    to free ``k`` slots the hand clears set bits and takes the first ``k``
    slots whose bit was already clear, in ring order.
    """

    name = "clock"
    node_bytes = 1 + 8  # resident, slot_of
    slot_bytes = 8 + 1  # slots, referenced

    def __init__(self, num_rows, capacity, **_):
        super().__init__(num_rows, capacity)
        self.slots = torch.full((capacity,), -1, dtype=torch.int64)
        self.slot_of = torch.full((num_rows,), -1, dtype=torch.int64)
        self.referenced = torch.zeros(capacity, dtype=torch.bool)
        self.hand = 0

    def _step(self, ids, hit, future) -> Step:
        self.referenced[self.slot_of[ids[hit]]] = True
        admit = ids[~hit][: self.capacity]
        if admit.numel() == 0:
            return Step(hit, _EMPTY, _EMPTY)
        free = (self.slots < 0).nonzero().squeeze(1)
        need = admit.numel() - free.numel()
        victims = _EMPTY
        if need > 0:
            ring = torch.roll(torch.arange(self.capacity), -self.hand)
            ring = ring[self.slots[ring] >= 0]
            ref = self.referenced[ring]
            # The hand passes over each ring slot once clearing bits, then
            # a second time if fewer than `need` bits were already clear.
            order = torch.cat([ring[~ref], ring[ref]])
            victims = order[:need]
            passed = ring[: int((ring == victims[-1]).nonzero()[0]) + 1] \
                if need <= int((~ref).sum()) else ring
            self.referenced[passed] = False
            self.hand = (int(victims[-1]) + 1) % self.capacity
        slots = torch.cat([free, victims])[: admit.numel()]
        evict = self.slots[victims]
        self.slot_of[evict] = -1
        self.slots[slots] = admit
        self.slot_of[admit] = slots
        self.referenced[slots] = False
        return Step(hit, evict, admit)


class HMGraphPolicy(Policy):
    """Static hot rows plus a lookahead-managed dynamic region.

    Parameters
    ----------
    num_rows, capacity : int
        See `Policy`.
    hotness : torch.Tensor
        Profiled accesses per row (float or int, one per row).
    static_rows : int
        Rows of the hottest part held for good; the other
        ``capacity - static_rows`` form the dynamic region.
    window : int
        How many batches ahead `step` looks (the loader's prefetch window).

    Notes
    -----
    After each batch the dynamic region keeps, among its rows and the
    batch's misses, those used soonest: a row's key is the distance to its
    next use inside the window, and rows not used inside the window rank
    after all those, by profiled hotness. Misses that do not make the cut
    are not admitted (bypass). With a window covering the whole future
    this is Belady's rule.
    """

    name = "hmgraph"
    looks_ahead = True
    # resident, static, cold_rank and next_use (int32 each)
    node_bytes = 1 + 1 + 4 + 4
    slot_bytes = 8  # the dynamic region's ids, the static ids
    spans_stores = True
    splits_static = True
    needs = frozenset({"hotness"})

    def __init__(self, num_rows, capacity, *, hotness=None, static_rows=0,
                 window=4, **_):
        super().__init__(num_rows, capacity)
        if hotness is None:
            raise ValueError("policy 'hmgraph' needs profiled hotness")
        if not 0 <= static_rows <= capacity:
            raise ValueError(
                f"static_rows {static_rows} is outside [0, {capacity}]"
            )
        self.static_rows = static_rows
        self.window = window
        hotness = hotness.double()
        order = torch.argsort(hotness, descending=True, stable=True)
        self.static = torch.zeros(num_rows, dtype=torch.bool)
        self.static[order[:static_rows]] = True
        self._static_order = order[:static_rows].clone()
        # Rank by hotness beyond the window: 0 for the hottest row.
        rank_dtype = torch.int32 if num_rows < 2**31 else torch.int64
        self.cold_rank = torch.empty(num_rows, dtype=rank_dtype)
        self.cold_rank[order] = torch.arange(num_rows, dtype=rank_dtype)
        # Distance to the next use inside the window (1..window), or
        # `_NEVER_NEAR`: int32 is plenty and halves the per-node bytes.
        self.next_use = torch.full((num_rows,), _NEVER_NEAR,
                                   dtype=torch.int32)
        self._held = _EMPTY  # ids in the dynamic region

    @classmethod
    def pinned_hot_rows(cls, device_rows: int, static_rows: int) -> int:
        """The static rows the device holds (the hottest come first).

        See `Policy.pinned_hot_rows`.
        """
        return min(static_rows, device_rows)

    def warm(self) -> torch.Tensor:
        """The static rows, hottest first."""
        self._hold(self._static_order)
        return self._static_order

    def pinned(self) -> torch.Tensor:
        """The static rows: only the dynamic region evicts."""
        return self._static_order

    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        """Smaller is sooner: next use in the window, then hotness.

        ``(distance to the next use, or window + 1 beyond the window) *
        num_rows + cold_rank``: a total order (``cold_rank`` is a
        permutation), so which rows make the cut never depends on how a
        selection breaks ties, and the compiled engine
        (`hmgraph.cache.engine.choose_dynamic`) decides exactly alike.
        """
        near = self.next_use[ids].long()
        near = torch.where(near == _NEVER_NEAR, self.window + 1, near)
        return near * self.num_rows + self.cold_rank[ids].long()

    def _step(self, ids, hit, future) -> Step:
        future = list(future)[: self.window]
        for distance in range(len(future), 0, -1):
            self.next_use[future[distance - 1]] = distance
        try:
            return self._choose(ids, hit)
        finally:
            for batch in future:
                self.next_use[batch] = _NEVER_NEAR

    def _choose(self, ids, hit) -> Step:
        dynamic_capacity = self.capacity - self.static_rows
        miss = ids[~hit]
        held = self._held  # the dynamic region: no scan of the graph
        candidates = torch.cat([held, miss])
        keys = self._keys(candidates)
        keep = torch.ones(candidates.numel(), dtype=torch.bool)
        if candidates.numel() > dynamic_capacity:
            keep[:] = False
            keep[torch.topk(keys, dynamic_capacity, largest=False).indices] \
                = True
        evict = held[~keep[: held.numel()]]
        # Admissions most valuable first: the first store (the device's)
        # takes the rows needed soonest.
        admitted = keep[held.numel():]
        order = torch.argsort(keys[held.numel():][admitted], stable=True)
        admit = miss[admitted][order]
        self._held = torch.cat([held[keep[: held.numel()]], admit])
        return Step(hit, evict, admit)


class BeladyPolicy(HMGraphPolicy):
    """Belady's optimal offline policy at mini-batch granularity.

    Evicts the row whose next use is farthest and bypasses misses used
    later than everything it holds. Needs the next use of every access:
    call `set_trace` with the whole trace first (see `next_use_trace`);
    `step` then ignores ``future``.
    """

    name = "belady"
    offline = True
    splits_static = False
    needs = frozenset()  # the whole trace instead (`set_trace`)

    def __init__(self, num_rows, capacity, **_):
        super().__init__(num_rows, capacity,
                         hotness=torch.zeros(num_rows), static_rows=0,
                         window=0)
        # Batch indices of the whole trace, not distances in a window.
        self.next_use = torch.full((num_rows,), _NEVER, dtype=torch.int64)
        self._next = None
        self._position = 0

    def set_trace(self, trace: Sequence[torch.Tensor]) -> None:
        """Give the whole trace of unique-id batches, in order."""
        self._next = next_use_trace(trace)
        self._position = 0
        first = torch.full((self.num_rows,), _NEVER, dtype=torch.int64)
        for index in range(len(trace) - 1, -1, -1):
            first[trace[index]] = index
        self._first_use = first

    def warm(self) -> torch.Tensor:
        """The rows used first: what an optimal prefill would hold.

        Static policies fill their cache before the first batch; so may
        OPT, or it would not be a ceiling for them.
        """
        if self._next is None:
            raise ValueError("belady needs the whole trace: call set_trace")
        used = (self._first_use < _NEVER).nonzero().squeeze(1)
        order = torch.argsort(self._first_use[used], stable=True)
        ids = used[order[: self.capacity]]
        self.next_use[ids] = self._first_use[ids]
        self._hold(ids)
        self._held = ids  # no static rows: all of it is dynamic
        return ids

    def _step(self, ids, hit, future) -> Step:
        if self._next is None:
            raise ValueError("belady needs the whole trace: call set_trace")
        self.next_use[ids] = self._next[self._position]
        self._position += 1
        return self._choose(ids, hit)

    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        return self.next_use[ids]


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen, total = set(), 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen or storage.nbytes() == 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def next_use_trace(trace: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """For every access, the batch index of the row's next use.

    One backward pass over the trace; ``_NEVER`` where a row is not used
    again.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Unique int64 ids per batch, in order.

    Returns
    -------
    list of torch.Tensor
        int64, aligned with ``trace``.
    """
    if not trace:
        return []
    num_rows = int(max(int(t.max()) for t in trace if t.numel()) + 1) if any(
        t.numel() for t in trace) else 1
    seen = torch.full((num_rows,), _NEVER, dtype=torch.int64)
    result = [None] * len(trace)
    for index in range(len(trace) - 1, -1, -1):
        ids = trace[index]
        result[index] = seen[ids].clone()
        seen[ids] = index
    return result


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

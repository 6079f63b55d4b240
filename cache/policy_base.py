"""The policy contract: a `Step` per batch, the `Policy` base, no cache.

Every cache policy of `hmgraph.cache.policies` is a `Policy`: an id-level
state machine that decides, batch by batch, which rows a cache layer of
``capacity`` rows holds, and states its host bookkeeping (``node_bytes``,
``slot_bytes``) and what the plan asks of it as class attributes. The
policy families build on this module: `hmgraph.cache.policy_static`,
`hmgraph.cache.policy_recency` and `hmgraph.cache.policy_lookahead`.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["EMPTY_IDS", "NoCachePolicy", "Policy", "Step", "hot_first",
           "kept", "rankings_kept", "storage_bytes"]

#: No ids: int64, empty, on the CPU; what a policy returns for nothing to
#: warm, pin, evict or admit (never written to).
EMPTY_IDS = torch.zeros(0, dtype=torch.int64)

#: What `kept` computed on a tensor, by tensor (kept while it lives) and
#: then by key: ``(the tensor's version, value)``; None out of
#: `rankings_kept`.
_KEPT: WeakIdKeyDictionary | None = None
_KEPT_SCOPES = 0
_KEPT_LOCK = threading.Lock()


@contextlib.contextmanager
def rankings_kept():
    """A scope in which `kept` keeps what it computes (nested and
    threads share one): a plan ranks one profile several times (each
    static share replayed, the device's pinned rows, the spans; on
    synth-products 13 sorts of 2.4M rows took 1.5 s of an 8 s build).
    Everything is let go when the last scope ends: an order is 8 bytes a
    node, which no plan keeps after it is made."""
    global _KEPT, _KEPT_SCOPES
    with _KEPT_LOCK:
        _KEPT_SCOPES += 1
        if _KEPT is None:
            _KEPT = WeakIdKeyDictionary()
    try:
        yield
    finally:
        with _KEPT_LOCK:
            _KEPT_SCOPES -= 1
            if not _KEPT_SCOPES:
                _KEPT = None


def kept(tensor: torch.Tensor, key, make):
    """``make()``; within `rankings_kept`, computed once per ``tensor``
    and ``key`` while ``tensor`` lives and is not written to. What it
    returns is shared: it must not be written to."""
    with _KEPT_LOCK:
        found = _KEPT.get(tensor, {}).get(key) if _KEPT is not None \
            else None
    if found is not None and found[0] == tensor._version:
        return found[1]
    value = make()
    with _KEPT_LOCK:
        if _KEPT is not None:
            _KEPT.setdefault(tensor, {})[key] = (tensor._version, value)
    return value


def hot_first(score: torch.Tensor) -> torch.Tensor:
    """Rows by ``score``, highest first, ties in id order (a stable
    sort); sorted once per score within `rankings_kept`. The order
    returned must not be written to."""
    return kept(score, "hot_first", lambda: torch.argsort(
        score.double(), descending=True, stable=True))


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

    def to(self, device) -> Policy:
        """Keep every tensor of the state on ``device``; `step` then takes
        ids there. Returns the policy."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self

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
        return storage_bytes(self._tensors())

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
        return EMPTY_IDS

    def pinned(self) -> torch.Tensor:
        """Ids this policy holds for good once warm (never evicted)."""
        return EMPTY_IDS

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
        return self._apply(self._step(ids, self.resident[ids], future))

    def _apply(self, step: Step) -> Step:
        """Hold what ``step`` decided (evictions first), counted and
        checked against the capacity; returns ``step``."""
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
        return Step(torch.zeros(ids.numel(), dtype=torch.bool,
                                device=ids.device), ids[:0], ids[:0])

    def _step(self, ids, hit, future) -> Step:
        return Step(hit, ids[:0], ids[:0])


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen, total = set(), 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen or storage.nbytes() == 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total

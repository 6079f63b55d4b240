"""Recency cache policies: every miss admitted, the least recent out.

``lru`` evicts the rows used least recently, ``clock`` approximates it
with CLOCK's second chance; both at mini-batch granularity and at a cost
in proportion to the batch and the rows evicted, never the graph. See
`hmgraph.cache.policies`.
"""

from __future__ import annotations

import collections

import torch

from hmgraph.cache.policy_base import EMPTY_IDS, Policy, Step

__all__ = ["ClockPolicy", "LRUPolicy"]



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
        evict = self._oldest(overflow) if overflow > 0 else EMPTY_IDS
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
            return Step(hit, EMPTY_IDS, EMPTY_IDS)
        free = (self.slots < 0).nonzero().squeeze(1)
        need = admit.numel() - free.numel()
        victims = EMPTY_IDS
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


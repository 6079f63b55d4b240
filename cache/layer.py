"""A cache layer: one policy over one or more slot stores.

A `hmgraph.cache.coordinated.FeatureCache` consults its layers in order;
each `Layer` pairs the policy that decides which rows it holds with the
stores that hold them, filled in order (the device's first).
"""

from __future__ import annotations

from dataclasses import dataclass

from hmgraph.cache.policies import Policy
from hmgraph.cache.slots import SlotStore

__all__ = ["Layer"]


@dataclass
class Layer:
    """One policy over one or more slot stores (filled in order)."""

    policy: Policy
    stores: list[SlotStore]

    def __post_init__(self):
        capacity = sum(store.capacity for store in self.stores)
        if capacity != self.policy.capacity:
            raise ValueError(
                f"policy {self.policy.name} holds {self.policy.capacity} "
                f"rows but its stores hold {capacity}"
            )

"""The ``device`` engine: a cache's bookkeeping on its GPU.

`hmgraph.cache.coordinated.FeatureCache`'s tensor code runs where its
tensors are. The ``device`` engine moves a cache's slot tables and its
policy's state to the training device once the stores are filled, and
has the device read and write pinned host rows in place
(`hmgraph.cache.uva`): a batch is then looked up, gathered, decided and
admitted by GPU kernels, with the same rows, decisions and counters as
the reference (bookkeeping in host memory), and no gather on the CPU.

It serves the policies whose steps are tensor code (``hmgraph``, the
static ones, none) without window read planning (staging reads the
storage tier on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hmgraph.cache import compiled, uva
from hmgraph.cache.feature import TensorFeature
from hmgraph.cache.policies import HMGraphPolicy, NoCachePolicy, StaticPolicy

__all__ = ["OnDevice", "choose", "supports"]


def choose(cache, asked: str) -> str:
    """The engine that reads ``cache`` (`FeatureCache`'s ``engine``):
    ``"compiled"`` asked, where it serves the layout
    (`hmgraph.cache.compiled.supports`); ``"device"`` asked, or
    ``"compiled"`` on a GPU, where `supports`; else ``"torch"``."""
    if asked == "compiled" and compiled.supports(cache):
        return "compiled"
    if asked != "torch" and supports(cache) and (
            asked == "device" or cache.device.type != "cpu"):
        return "device"
    return "torch"


def supports(cache) -> bool:
    """Whether the ``device`` engine serves ``cache``'s layout: no
    staging, and every layer's policy static, ``hmgraph`` or none."""
    return cache.staging is None and all(
        isinstance(layer.policy, (StaticPolicy, NoCachePolicy)) or
        type(layer.policy) is HMGraphPolicy for layer in cache.layers)


class OnDevice:
    """Moves ``cache``'s bookkeeping to ``cache.device`` and serves what
    its reads need there: the ids of the window, the source's rows."""

    def __init__(self, cache):
        self.device = cache.device
        moved = {}  # the tiers of a layer share one id -> slot table
        for layer in cache.layers:
            layer.policy.to(self.device)
            for store in layer.stores:
                table = moved.setdefault(id(store.slot_of),
                                         store.slot_of.to(self.device))
                store.move_tables(self.device, table)
        self.source = cache.source
        #: The source's pinned rows as the device reads them, or None.
        self.source_view = uva.device_view(
            self.source.rows, self.device) if isinstance(
            self.source, TensorFeature) and self.source.rows.is_pinned() \
            else None
        self.looks_ahead = any(layer.policy.looks_ahead
                               for layer in cache.layers)
        self._moved = {}  # the window's batches on the device, by id

    def window(self, future: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The window's batches on the device (none for policies that do
        not look ahead). A batch stays in the window for several reads
        (the loader passes the same tensors): each crosses once."""
        if not self.looks_ahead:
            return []
        kept = {}
        for batch in future:
            entry = self._moved.get(id(batch))
            if entry is None or entry[0] is not batch:
                entry = (batch, batch.to(self.device))
            kept[id(batch)] = entry
        self._moved = kept
        return [kept[id(batch)][1] for batch in future]

    def source_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` from the source, on the device: read in place
        where the source's rows are pinned, else read and copied."""
        if self.source_view is not None:
            return self.source_view.index_select(0, ids)
        return self.source.read(ids.cpu()).to(self.device)

"""Finding a batch's reads: which lazy features go through the cache."""

from __future__ import annotations

from hmgraph import dglbatch
from hmgraph.stages.base import Stage
from hmgraph.stages.batches import blocks_of

__all__ = ["FindReads"]


class FindReads(Stage):
    """Split a sampled batch's lazy features: the cached feature's, the
    rest (runs in the sampling thread).

    A block batch reads the cached feature for its first block's inputs
    whether or not the sampler asked for it (``MiniBatch.x``).

    Parameters
    ----------
    feature_name : str
        The node feature that goes through the cache.
    ntypes : collection of str
        Node types that have the cached feature.
    """

    def __init__(self, feature_name: str, ntypes):
        self.feature_name = feature_name
        self.ntypes = frozenset(ntypes)

    def __call__(self, batch) -> tuple[list, list]:
        """``(reads, others)``: lists of `hmgraph.dglbatch.Lazy`."""
        lazy = dglbatch.find_lazy(batch)
        cached = [r for r in lazy if r.kind == "node"
                  and r.name == self.feature_name and r.type in self.ntypes]
        taken = {id(r) for r in cached}
        others = [r for r in lazy if id(r) not in taken]
        blocks = blocks_of(batch)
        if blocks is not None:
            first = dglbatch.graphs(batch).index(blocks[0])
            asked = {(r.graph, r.frame) for r in cached}
            for number, ntype in enumerate(blocks[0].srctypes):
                if ntype not in self.ntypes or (first, number) in asked:
                    continue
                ids = blocks[0].srcnodes[ntype].data["_ID"].long()
                cached.append(dglbatch.Lazy(first, "node", number,
                                            self.feature_name,
                                            self.feature_name, ntype, ids))
        return cached, others

    def state_dict(self) -> dict:
        """The cached feature's name and node types."""
        return {"feature_name": self.feature_name,
                "ntypes": sorted(map(str, self.ntypes))}

"""`dgl.dataloading` with hmgraph's `DataLoader`: change one import.

Everything `dgl.dataloading` exports (samplers, ``negative_sampler``,
``as_edge_prediction_sampler``, ...) is re-exported unchanged; only
``DataLoader`` is `hmgraph.DataLoader`. A DGL script switches with one
line::

    from dgl.dataloading import DataLoader, NeighborSampler      # before
    from hmgraph.dataloading import DataLoader, NeighborSampler  # after
"""

import dgl.dataloading as _dgl
from dgl.dataloading import *  # noqa: F403

from hmgraph.loader import DataLoader  # noqa: F401 - the one swap

__all__ = sorted({name for name in vars(_dgl) if not name.startswith("_")}
                 | {"DataLoader"})

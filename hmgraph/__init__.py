"""hmgraph: GNN training on graphs whose node features outgrow fast memory.

Built on DGL. The front door: datasets, the DGL-compatible `DataLoader`,
training, models and the ``hmgraph`` command line.
"""

import os

# DGL's OpenMP runtime and torch's spin against each other on few cores;
# passive waiting halves step times on 2 cores. Must precede torch's import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hmgraph.loader import DataLoader, LoaderStats, MiniBatch  # noqa: E402

__all__ = ["DataLoader", "LoaderStats", "MiniBatch", "__version__"]

__version__ = "0.1.0"

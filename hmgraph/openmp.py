"""OpenMP's wait policy for hmgraph's programs, set before torch loads.

DGL's OpenMP runtime and torch's spin against each other on few cores;
passive waiting halves step times on 2 cores. They are two runtimes
(torch bundles its libgomp, DGL links the system's), each reading
``OMP_WAIT_POLICY`` once, when it loads; importing this module sets it
to ``PASSIVE`` (unless the environment already names a policy), so it
must come before ``import torch`` and ``import dgl``, or before the
process that imports them is spawned. The ``hmgraph`` command, the
benchmark harness (``bench/``) and ``hmgraph.DataLoader`` (through the
package's lazy top level) import it first; a library import such as
``import hmgraph.cache`` sets nothing.

Examples
--------
>>> import hmgraph.openmp  # before torch
>>> import os
>>> bool(os.environ["OMP_WAIT_POLICY"])
True
"""

import os

__all__ = ["WAIT_POLICY"]

#: The policy set unless the environment names one.
WAIT_POLICY = "PASSIVE"

os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)

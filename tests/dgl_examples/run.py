"""Run a DGL example script seeded, on the CPU: ``run.py SCRIPT SEED``.

Seeds ``random``, ``numpy``, ``torch`` and ``dgl`` with SEED, then runs
SCRIPT as ``__main__`` with ``--mode cpu``, as ``python SCRIPT --mode cpu``
would, so two runs that differ only in their DataLoader start alike.
"""

import random
import runpy
import sys

import dgl
import numpy as np
import torch


def main() -> None:
    script, seed = sys.argv[1], int(sys.argv[2])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)
    sys.argv = [script, "--mode", "cpu"]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

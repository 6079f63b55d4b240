"""A script may end with live iterators: the interpreter exits cleanly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Two loaders with different caches, prefetching two batches each, whose
# sampler spends its time in a torch call (without the GIL): when the
# script ends their threads are inside it. A daemon thread that Python
# finalization catches there is ended through C++ code that may not
# unwind: ``terminate called without an active exception``, code 134.
SCRIPT = textwrap.dedent("""
    import dgl
    import torch

    import hmgraph


    class BusySampler(dgl.dataloading.NeighborSampler):
        def sample(self, g, seeds, exclude_eids=None):
            torch.randn(1_000_000).sort()
            return super().sample(g, seeds, exclude_eids)


    g = dgl.rand_graph(600, 6000)
    g.ndata["feat"] = torch.randn(600, 16)
    g.ndata["label"] = torch.randint(0, 4, (600,))
    live = []
    for cache in ("lru", "hmgraph"):
        loader = hmgraph.DataLoader(
            g, torch.arange(600), BusySampler([5, 3]), batch_size=8,
            prefetch=2, cache=cache, host_budget_bytes=30_000,
            profile_batches=2)
        it = iter(loader)
        next(it)
        next(it)
        live.append(it)
    print("end of script")
""")


def test_a_script_ending_with_live_iterators_exits_cleanly():
    proc = subprocess.run([sys.executable, "-c", SCRIPT],
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "end of script\n"

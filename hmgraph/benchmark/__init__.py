"""``hmgraph bench`` and the harness every benchmark shares.

One module a part, each a page or two:

* `command`: ``hmgraph bench`` (`run`, `run_one`, `CONFIGS`,
  `format_table`), every configuration in its own process;
* `epochs`: one timed epoch of DGL's loader (`dgl_epoch`, the one DGL
  baseline) and of an `hmgraph.DataLoader` (`hmgraph_epoch`), the seeded
  model (`new_model`, `train_step`), the page cache (`open_memmap`,
  `drop_page_cache`);
* `baselines`: the runs the ``bench/`` scripts set up alike (`load`,
  `seeded_subset`, `dgl_baseline`, `hot_first_layout`, `loader_epoch`);
* `process`: the process runner (`isolated`, `ConfigurationFailed`) and
  what a process used (`peak_rss_bytes`, `read_bytes`);
* `tables`: the targets (`target`, `targets_table`, `built_note`),
  `amortized`, and `markdown_table` (from `hmgraph.markdown`, the one
  helper every table of the project goes through);
* `results`: `commit`, `merged_commit`, `parts_by_commit`,
  `environment`, `write_results`, `finish`;
* `plots`: the stages plot of ``hmgraph bench``;
* `metis`: METIS parts in a child process (`metis_parts`, `metis_text`).

The ``bench/`` scripts read these names through ``bench/common.py``
(``common.dgl_epoch`` is `hmgraph.benchmark.dgl_epoch`): every name of
``__all__`` is importable from this package.
"""

from __future__ import annotations

# Before torch: sets OMP_WAIT_POLICY for the benches that import this.
import hmgraph.openmp  # noqa: F401  # isort: skip
from hmgraph.benchmark.baselines import (
    dgl_baseline,
    hot_first_layout,
    load,
    loader_epoch,
    seeded_subset,
)
from hmgraph.benchmark.command import CONFIGS, run, run_one
from hmgraph.benchmark.epochs import (
    DGL_WORKERS,
    DROPOUT,
    LR,
    dgl_epoch,
    drop_page_cache,
    hmgraph_epoch,
    new_model,
    open_memmap,
    progress,
    train_step,
)
from hmgraph.benchmark.metis import metis_parts, metis_text
from hmgraph.benchmark.process import (
    ConfigurationFailed,
    isolated,
    peak_rss_bytes,
    read_bytes,
)
from hmgraph.benchmark.results import (
    commit,
    disk_text,
    environment,
    environment_text,
    finish,
    merged_commit,
    parts_by_commit,
    write_results,
)
from hmgraph.benchmark.tables import (
    AMORTIZE_EPOCHS,
    amortized,
    built_note,
    markdown_table,
    target,
    targets_table,
)

__all__ = [
    "AMORTIZE_EPOCHS", "CONFIGS", "DGL_WORKERS", "DROPOUT", "LR",
    "ConfigurationFailed", "amortized", "built_note", "commit", "dgl_baseline",
    "dgl_epoch", "disk_text", "drop_page_cache", "environment",
    "environment_text", "finish", "hmgraph_epoch", "hot_first_layout",
    "isolated", "load", "loader_epoch", "markdown_table", "merged_commit",
    "metis_parts", "metis_text", "new_model", "open_memmap", "parts_by_commit",
    "peak_rss_bytes", "progress", "read_bytes", "run", "run_one",
    "seeded_subset", "target", "targets_table", "train_step", "write_results",
]

"""The stages of `hmgraph.DataLoader`, chained by `hmgraph.pipeline`.

Each is a small class with ``reset`` / ``state_dict`` / ``close``
(`Stage`) and a typed input and output:

- `SampleStage`: DGL's seed batches -> `SampledBatch` (its reads found
  by `FindReads`);
- `FetchStage`: `SampledBatch` -> `ReadyBatch` (rows through the cache);
- `FinishStage`: `ReadyBatch` -> `MiniBatch` (DGL's batch, counted in
  `LoaderStats`).
"""

from hmgraph.stages.base import Stage
from hmgraph.stages.batches import (
    MiniBatch,
    ReadyBatch,
    SampledBatch,
    blocks_of,
)
from hmgraph.stages.fetch import FetchStage
from hmgraph.stages.finish import FinishStage
from hmgraph.stages.reads import FindReads
from hmgraph.stages.sample import SampleStage, torch_loader
from hmgraph.stages.stats import LoaderStats, loader_stats

__all__ = ["FetchStage", "FindReads", "FinishStage", "LoaderStats",
           "MiniBatch", "ReadyBatch", "SampleStage", "SampledBatch", "Stage",
           "blocks_of", "loader_stats", "torch_loader"]
